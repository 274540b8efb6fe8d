"""Typed errors, one per answer the API gives (its problem document: `code`, `status`,
`message`, `errors`), so a caller catches what it can handle."""

from __future__ import annotations

import json
from typing import Any


class DiffqError(Exception):
    """Anything this client raises: its subclasses below, never another library's error."""


class InputError(DiffqError, ValueError):
    """What was given cannot be sent: no API key, a file that cannot be read, a JSON
    Lines line that is not a JSON object, a body JSON cannot hold. `path` and `line`
    (1-based) name the file and its line where one is to blame."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        self.path, self.line = path, line
        super().__init__(message)


class APIConnectionError(DiffqError):
    """The API could not be reached (after the retries), or the connection broke."""


class APIError(DiffqError):
    """The API answered with an error. `status`: the HTTP status; `message`; `errors`:
    field errors (`{"json": {"steps": [...]}}`, or a batch's `{"lines": {...}}`);
    `body`: the whole document; `retry_after`: seconds, when the API said."""

    def __init__(self, status: int, body: Any, retry_after: float | None = None) -> None:
        self.status = status
        self.body = body if isinstance(body, dict) else {"message": str(body)[:500]}
        self.message = self.body.get("message") or ""
        self.errors = self.body.get("errors") or {}
        self.retry_after = retry_after
        detail = self.message or json.dumps(self.errors or self.body)
        super().__init__(f"HTTP {status}: {detail}")


class BadRequestError(APIError):
    """400: the body is not JSON."""


class AuthenticationError(APIError):
    """401: no key, or a bad or revoked one."""


class NotFoundError(APIError):
    """404: no such job, batch or file (or not yours)."""


class ConflictError(APIError):
    """409: e.g. cancel of a finished job; an Idempotency-Key reused with another body."""


class GoneError(APIError):
    """410: the images were removed after the retention period."""


class PayloadTooLargeError(APIError):
    """413: a body or a batch past its limit (the message names it)."""


class UnprocessableEntityError(APIError):
    """422: a field breaks a rule; `errors` names it (a batch's: `errors["lines"]`)."""


class RateLimitError(APIError):
    """429: over the key's rate, the tenant's queued cap or its daily quota."""


class ServiceUnavailableError(APIError):
    """503: nothing was accepted; retried automatically (with the same Idempotency-Key)
    unless the answer says `x-should-retry: false`, as /v1/batches and /v1/files do."""


class InternalServerError(APIError):
    """Any other 5xx."""


class InvalidResponseError(APIError):
    """An answer this client cannot read: not JSON, or not the object it should be (a
    proxy's page in the API's place, a body cut short). `status`: the answer's."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, {"message": message})


class JobFailed(DiffqError):
    """`run()`'s job ended failed or canceled; `job` is its last state."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        error = job.get("error") or {}
        super().__init__(
            f"job {job.get('id')} {job.get('status')}: {error.get('code')}: {error.get('message')}"
        )


class WebhookVerificationError(DiffqError):
    """A webhook's signature or timestamp did not verify."""


BY_STATUS = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    413: PayloadTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


def error_for(status: int, body: Any, retry_after: float | None) -> APIError:
    cls = BY_STATUS.get(status) or (InternalServerError if status >= 500 else APIError)
    return cls(status, body, retry_after)
