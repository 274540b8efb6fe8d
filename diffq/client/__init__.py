"""diffq's Python client: jobs and batches, blocking (`Client`) or asyncio (`AsyncClient`).

    from diffq.client import Client

    with Client("http://127.0.0.1:8000", api_key="dq_...") as diffq:
        job = diffq.run("a lighthouse at dusk", steps=20, seed=42)  # waits over the events
        png = diffq.download(job["result"]["images"][0]["url"])

        handle = diffq.submit("a red fox")  # .status, .stream(), .wait(), .cancel(), .images()
        batch = diffq.batches.create([{"custom_id": "a", "prompt": "..."}, ...])
        batch.wait(); rows = batch.results()

Every error is a `DiffqError` (`diffq.client.errors`): typed from the API's problem
documents, `APIConnectionError` without an answer, `InputError` for what cannot be sent; a
POST carries an automatic Idempotency-Key kept across its retries, so a retry never makes
a second job. `verify_webhook` checks a webhook's signature. It depends on httpx2 alone
and imports nothing else of diffq. docs/clients.md shows it beside curl and `openai`.
"""

from diffq.client._async import AsyncClient
from diffq.client._core import Event
from diffq.client._sync import BatchHandle, Client, JobHandle
from diffq.client.errors import (
    APIConnectionError,
    APIError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    DiffqError,
    GoneError,
    InputError,
    InternalServerError,
    InvalidResponseError,
    JobFailed,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    ServiceUnavailableError,
    UnprocessableEntityError,
    WebhookVerificationError,
)
from diffq.client.webhooks import verify_webhook

__all__ = [
    "APIConnectionError",
    "APIError",
    "AsyncClient",
    "AuthenticationError",
    "BadRequestError",
    "BatchHandle",
    "Client",
    "ConflictError",
    "DiffqError",
    "Event",
    "GoneError",
    "InputError",
    "InternalServerError",
    "InvalidResponseError",
    "JobFailed",
    "JobHandle",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitError",
    "ServiceUnavailableError",
    "UnprocessableEntityError",
    "WebhookVerificationError",
    "verify_webhook",
]
