"""The OpenAPI document's shared parts: description, security scheme and what every
keyed route answers without a key."""

from __future__ import annotations

import flask_smorest
import flask_smorest.error_handler
import marshmallow as ma
from apispec import BasePlugin

API_DESCRIPTION = """\
diffq runs diffusion models as asynchronous jobs: text to image (`txt2img`), image to
image (`img2img`) and inpainting (`inpaint`) from an uploaded image (`POST /v1/uploads`),
each with optional LoRA adapters (`POST /v1/adapters`), singly or as batches
(`POST /v1/batches`).

Submit a job with `POST /v1/jobs` (answered `202` at once), then poll
`GET /v1/jobs/{id}` until its `status` is `succeeded`, `failed` or `canceled`.
Every `/v1` route needs `Authorization: Bearer <api key>`; a job is visible only to
the tenant that created it. Errors share one envelope: `code`, `status`, `message`,
and for validation errors `errors.json.<field>` with the limit that was broken.
"""


def spec_options() -> dict:
    return {
        "info": {"description": API_DESCRIPTION},
        "components": {
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key from `diffq keys create --tenant NAME`.",
                }
            }
        },
        "security": [{"bearerAuth": []}],
    }


class ErrorSchema(flask_smorest.error_handler.ErrorSchema):
    """The error every route answers with (documentation only): diffq's envelope, and on
    the routes OpenAI's clients call (/v1/batches, /v1/files), OpenAI's `error` object in
    the same body."""

    error = ma.fields.Dict(
        metadata={
            "description": "OpenAI's error object (`message`, `type`, `param`, `code`), on the "
            "routes OpenAI's clients call"
        }
    )


class Api(flask_smorest.Api):
    ERROR_SCHEMA = ErrorSchema


UNAUTHORIZED = "No or bad API key."
METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


class KeyedOperations(BasePlugin):
    """Documents the `401` of every operation the API key guards, once: the document's
    `security` covers every route but those that opt out with `@blp.doc(security=[])`,
    and each route that is guarded answers `401` without a key (`app/web/auth.py`).
    Written by hand on each route, four routes had gone without it."""

    def operation_helper(self, path=None, operations=None, **kwargs) -> None:
        for method, operation in (operations or {}).items():
            if method not in METHODS or operation.get("security") == []:
                continue
            responses = operation.setdefault("responses", {})
            if 401 not in responses and "401" not in responses:  # flask-smorest's keys are ints
                responses["401"] = {"description": UNAUTHORIZED}


# A file part of a multipart form, in an OpenAPI schema.
BINARY = {"type": "string", "format": "binary"}


def form_body(properties: dict, required: list[str], **content: dict) -> dict:
    """An operation's requestBody: a multipart form of these `properties` (a file part:
    `BINARY`, or `{**BINARY, "description": …}`), and any other media type's `content`
    beside it (a raw image, a JSON body)."""
    form = {"type": "object", "properties": properties, "required": required}
    return {"required": True, "content": {**content, "multipart/form-data": {"schema": form}}}


def answers(blp: flask_smorest.Blueprint, table: str):
    """A route's other answers, documented from a table of status lines: each line that
    starts with a status code (`404 No such job.`) begins an answer, and a line that does
    not goes on with the one before. One decorator for what was a stack of
    `blp.alt_response` calls, read as the table it is."""
    decorators = [blp.alt_response(code, description=text) for code, text in status_lines(table)]

    def decorate(view):
        for decorator in reversed(decorators):
            view = decorator(view)
        return view

    return decorate


def status_lines(table: str) -> list[tuple[int, str]]:
    """`answers`' table as (status code, description) pairs, in order."""
    lines: list[tuple[int, list[str]]] = []
    for line in table.strip().splitlines():
        code, _, rest = line.strip().partition(" ")
        if len(code) == 3 and code.isdigit():
            lines.append((int(code), [rest.strip()]))
        elif lines and line.strip():
            lines[-1][1].append(line.strip())
        elif line.strip():
            raise ValueError(f"an answer's table starts without a status code: {line!r}")
    return [(code, " ".join(words)) for code, words in lines]


class OpenAIList(ma.Schema):
    """OpenAI's list object (`GET /v1/batches`, `GET /v1/videos`): a subclass adds `data`."""

    object = ma.fields.String(metadata={"example": "list"})
    first_id = ma.fields.String(allow_none=True)
    last_id = ma.fields.String(allow_none=True)
    has_more = ma.fields.Boolean()
