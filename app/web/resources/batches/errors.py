"""Errors of /v1/batches and /v1/files, read by two kinds of client: diffq's envelope
(`code`, `status`, `message`, `errors`) and, in the same body, OpenAI's `error` object
(`message`, `type`, `param`, `code`), so both diffq's client and the `openai` client
raise their own typed errors from it, whatever the error: a refusal, an outage of the
job store (503) or a bug (500). 5xx answers carry `x-should-retry: false`: the `openai`
client retries them without an idempotency key, and a retried create would make a
second batch."""

from __future__ import annotations

from http import HTTPStatus

from flask import jsonify
from flask_smorest import Blueprint
from werkzeug.exceptions import HTTPException

from app.web.errors import as_http_error

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def envelope(status: int, message: str, errors: dict | None = None, param: str | None = None):
    body = {
        "code": status,
        "status": HTTPStatus(status).phrase,
        "message": message,
        "error": {
            "message": message,
            "type": TYPES.get(status, "server_error" if status >= 500 else "api_error"),
            "param": param,
            "code": None,
        },
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
        response = jsonify(envelope(status, message, errors, _param(errors)))
        response.status_code = status
        for name, value in (data.get("headers") or {}).items():
            response.headers[name] = value
        if status >= 500:
            response.headers["x-should-retry"] = "false"
        return response

    @blp.errorhandler(Exception)
    def _any_error(exc: Exception):
        # A database refusal or outage, a bug: in both envelopes too, never the app's.
        return _http_error(as_http_error(exc))
