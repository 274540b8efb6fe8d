"""OpenAI's error object (`message`, `type`, `param`, `code`) and the answer that carries
it, for the routes OpenAI's clients call (/v1/images, /v1/videos, /v1/batches,
/v1/files). 5xx answers carry `x-should-retry: false`: the `openai` client retries them
without an idempotency key, and a retried create would make a second job or batch."""

from __future__ import annotations

from flask import Response, jsonify

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


def error_object(status: int, message: str, param=None, code=None) -> dict:
    kind = TYPES.get(status, "server_error" if status >= 500 else "api_error")
    return {"message": message, "type": kind, "param": param, "code": code}


def error_answer(body: dict, status: int, headers=None) -> Response:
    response = jsonify(body)
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    if status >= 500:
        response.headers["x-should-retry"] = "false"
    return response
