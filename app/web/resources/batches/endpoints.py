"""What one line of a batch may be: the endpoints a batch's requests go to, each with
the function that turns a line's body into a job's submission.

This is the extension point for OpenAI endpoints: `/v1/jobs` (diffq's own job request)
and `/v1/images/generations` (OpenAI's images request, through the same conversion as
the synchronous endpoint). An endpoint added here is a function from the line's body to
JobCreateSchema's loaded form, raising `LineRefused` with the OpenAI parameter it names;
nothing else changes.

`/v1/images/edits` is not one: its request is a multipart form whose image and mask are
files, which a JSON line cannot carry. A batch of image-to-image or inpainting jobs is
`/v1/jobs` lines whose `image` and `mask` name uploads (`POST /v1/uploads`) or carry
`data:` URIs; each is checked when the batch is validated and stored only once the whole
batch is accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import marshmallow as ma

from app.web.resources.jobs.schemas import JobCreateSchema

# Fields of a job request a batch's line may not set: the batch has one webhook.
BATCH_ONLY = ("webhook", "webhook_events")


class LineRefused(Exception):
    def __init__(self, message: str, param: str | None, errors: dict | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.errors = message, param, errors or {}


@dataclass(frozen=True)
class Endpoint:
    path: str
    load: Callable[[dict[str, Any]], tuple[dict[str, Any], bool]]  # -> (loaded, b64_json)


_JOBS = JobCreateSchema()


def _first(messages: Any) -> tuple[str, str]:
    if isinstance(messages, dict):
        field, problems = next(iter(messages.items()))
        text = " ".join(str(p) for p in problems) if isinstance(problems, list) else str(problems)
        return str(field), text
    return "body", " ".join(str(m) for m in messages)


def load_job(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A POST /v1/jobs body, validated as that endpoint validates it."""
    foreign = [name for name in BATCH_ONLY if name in body]
    if foreign:
        message = "Not allowed in a batch's request: the batch has one webhook (its `webhook`)."
        raise LineRefused(f"{foreign[0]}: {message}", foreign[0], {f: [message] for f in foreign})
    try:
        return _JOBS.load(body), False
    except ma.ValidationError as exc:
        messages = exc.messages if isinstance(exc.messages, dict) else {"body": exc.messages}
        field, text = _first(messages)
        raise LineRefused(f"{field}: {text}", field, messages) from exc


def load_images_generation(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """An OpenAI images request, turned into a job as POST /v1/images/generations does."""
    from app.web.resources.openai.routes import FIELD_NAMES, OpenAIError, _job_request
    from app.web.resources.openai.schemas import ImagesGenerateSchema

    try:
        loaded = ImagesGenerateSchema().load(body)
    except ma.ValidationError as exc:
        messages = exc.messages if isinstance(exc.messages, dict) else {"body": exc.messages}
        field, text = _first(messages)
        raise LineRefused(f"{field}: {text}", FIELD_NAMES.get(field, field), messages) from exc
    try:
        return _job_request(loaded), loaded["response_format"] == "b64_json"
    except OpenAIError as exc:
        raise LineRefused(exc.message, exc.param) from exc


ENDPOINTS: dict[str, Endpoint] = {
    "/v1/jobs": Endpoint("/v1/jobs", load_job),
    "/v1/images/generations": Endpoint("/v1/images/generations", load_images_generation),
}
