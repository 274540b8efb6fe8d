"""Errors mapped in one place, into flask-smorest's envelope; never a traceback."""

from __future__ import annotations

import logging
from typing import TypeVar

from flask import Flask
from flask_smorest import Api, abort
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from werkzeug.exceptions import (
    Conflict,
    HTTPException,
    InternalServerError,
    MethodNotAllowed,
    ServiceUnavailable,
    UnprocessableEntity,
)

log = logging.getLogger(__name__)


T = TypeVar("T")


def found(row: T | None, what: str) -> T:
    """`row`, or a 404 "No such {what}." (a tenant's lookups find only its own rows)."""
    if row is None:
        abort(404, message=f"No such {what}.")
    return row


def as_http_error(exc: Exception) -> HTTPException:
    """The HTTP error an exception raised while answering a request stands for: each
    endpoint's handlers render it in their envelope (the OpenAI endpoint has its own)."""
    if isinstance(exc, HTTPException):
        return exc
    if isinstance(exc, IntegrityError):
        # A uniqueness or reference rule said no: the request conflicts with what exists.
        log.info("integrity error: %s", type(exc.orig).__name__ if exc.orig else exc)
        error: HTTPException = Conflict()
        error.data = {"message": "The request conflicts with an existing resource."}
        return error
    if isinstance(exc, DataError):
        # The store is up and said no to a value (a schema let something through that
        # PostgreSQL cannot hold): bad input, not an outage.
        log.warning("value refused by the database: %s", type(exc.orig).__name__)
        error = UnprocessableEntity()
        error.data = {"message": "A value in the request cannot be stored."}
        return error
    if isinstance(exc, DBAPIError):
        # The job could not be made durable: tell the client to retry, reveal nothing.
        log.error("database error: %s", type(exc.orig).__name__ if exc.orig else exc)
        error = ServiceUnavailable()
        error.data = {
            "message": "The job store is unavailable; retry shortly.",
            "headers": {"Retry-After": "5"},
        }
        return error
    log.error("unhandled error", exc_info=exc)
    error = InternalServerError()
    error.data = {"message": "Internal server error."}
    return error


def register_error_handlers(app: Flask, api: Api) -> None:
    @app.errorhandler(MethodNotAllowed)
    def method_not_allowed(exc: MethodNotAllowed):
        # flask-smorest builds its answer from `data`, which drops werkzeug's Allow header.
        exc.data = {**(getattr(exc, "data", None) or {})}
        exc.data["headers"] = {"Allow": ", ".join(sorted(exc.valid_methods or ()))}
        return api.handle_http_exception(exc)

    @app.errorhandler(Exception)
    def any_error(exc: Exception):
        return api.handle_http_exception(as_http_error(exc))
