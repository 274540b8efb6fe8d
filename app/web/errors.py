"""Errors mapped in one place, into flask-smorest's envelope; never a traceback."""

from __future__ import annotations

import logging

from flask import Flask
from flask_smorest import Api
from sqlalchemy.exc import DBAPIError, IntegrityError
from werkzeug.exceptions import Conflict, HTTPException, InternalServerError, ServiceUnavailable

log = logging.getLogger(__name__)


def register_error_handlers(app: Flask, api: Api) -> None:
    @app.errorhandler(IntegrityError)
    def conflict(exc: IntegrityError):
        # A uniqueness or reference rule said no: the request conflicts with what exists.
        log.info("integrity error: %s", type(exc.orig).__name__ if exc.orig else exc)
        error = Conflict()
        error.data = {"message": "The request conflicts with an existing resource."}
        return api.handle_http_exception(error)

    @app.errorhandler(DBAPIError)
    def database_unavailable(exc: DBAPIError):
        # The job could not be made durable: tell the client to retry, reveal nothing.
        log.error("database error: %s", type(exc.orig).__name__ if exc.orig else exc)
        error = ServiceUnavailable()
        error.data = {
            "message": "The job store is unavailable; retry shortly.",
            "headers": {"Retry-After": "5"},
        }
        return api.handle_http_exception(error)

    @app.errorhandler(Exception)
    def unexpected(exc: Exception):
        if isinstance(exc, HTTPException):
            return api.handle_http_exception(exc)
        log.exception("unhandled error")
        error = InternalServerError()
        error.data = {"message": "Internal server error."}
        return api.handle_http_exception(error)
