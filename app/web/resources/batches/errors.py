"""Errors of /v1/batches and /v1/files, read by two kinds of client: diffq's envelope
(`code`, `status`, `message`, `errors`) and, in the same body, OpenAI's `error` object
(`message`, `type`, `param`, `code`), so both diffq's client and the `openai` client
raise their own typed errors from it, whatever the error: a refusal, an outage of the
job store (503) or a bug (500) (app/web/openai_errors.py)."""

from __future__ import annotations

from http import HTTPStatus

from flask_smorest import Blueprint
from werkzeug.exceptions import HTTPException

from app.web.errors import as_http_error
from app.web.openai_errors import error_answer, error_object


def envelope(status: int, message: str, errors: dict | None = None, param: str | None = None):
    body = {
        "code": status,
        "status": HTTPStatus(status).phrase,
        "message": message,
        "error": error_object(status, message, param),
    }
    if errors:
        body["errors"] = errors
    return body


def _param(errors: dict | None) -> str | None:
    for location in ("json", "headers", "query"):
        if errors and errors.get(location):
            return str(next(iter(errors[location])))
    return None


def install(blp: Blueprint) -> None:
    @blp.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        data = getattr(exc, "data", None) or {}
        status = exc.code or 500
        message = data.get("message") or exc.description or exc.name
        errors = data.get("errors") or data.get("messages")
        body = envelope(status, message, errors, _param(errors))
        return error_answer(body, status, data.get("headers"))

    @blp.errorhandler(Exception)
    def _any_error(exc: Exception):
        # A database refusal or outage, a bug: in both envelopes too, never the app's.
        return _http_error(as_http_error(exc))
