"""The batch object and the list (OpenAI's Batch shape plus diffq's fields), and the
documented request bodies of POST /v1/batches (parsed by hand: parse.py)."""

from __future__ import annotations

import marshmallow as ma
from marshmallow import fields, validate

from app.web.openapi import OpenAIList
from app.web.strings import RefusesNul

NATIVE_EXAMPLE = {
    "requests": [
        {"custom_id": "sku-1001", "prompt": "a red sneaker on white", "seed": 1, "steps": 20},
        {"custom_id": "sku-1002", "prompt": "a blue sneaker on white", "seed": 2, "steps": 20},
    ],
    "completion_window": "24h",
    "webhook": "https://example.com/hooks/diffq",
    "metadata": {"catalogue": "spring"},
}
OPENAI_EXAMPLE = {
    "input_file_id": "01a2b3c4-0000-7000-8000-000000000000",
    "endpoint": "/v1/images/generations",
    "completion_window": "24h",
}
JSONL_EXAMPLE = (
    '{"custom_id": "sku-1001", "prompt": "a red sneaker on white", "seed": 1}\n'
    '{"custom_id": "sku-1002", "prompt": "a blue sneaker on white", "seed": 2}\n'
)

BATCH_BODY = {
    "required": True,
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "requests": {
                        "type": "array",
                        "description": "diffq's form: POST /v1/jobs bodies, each with its "
                        "`custom_id` (unique in the batch, at most 256 characters).",
                        "items": {"type": "object"},
                    },
                    "input_file_id": {
                        "type": "string",
                        "description": "OpenAI's form: a file uploaded with purpose `batch`, "
                        "one request a line (`custom_id`, `method`, `url`, `body`).",
                    },
                    "endpoint": {
                        "type": "string",
                        "description": "With `input_file_id`: `/v1/images/generations` "
                        "or `/v1/jobs`.",
                    },
                    "completion_window": {
                        "type": "string",
                        "description": "Jobs not started by then end `expired`: seconds, "
                        "or like `90m`, `24h`, `2d` (60 s to 7 days). Default: none.",
                    },
                    "webhook": {
                        "type": "string",
                        "description": "One URL for the batch's end (`batch.completed`, "
                        "`batch.expired`, `batch.cancelled`, `batch.failed`), signed as a "
                        "job's webhooks are.",
                    },
                    "metadata": {"type": "object", "description": "Yours, at most 2 KiB."},
                },
            },
            "examples": {
                "diffq": {"summary": "diffq's form", "value": NATIVE_EXAMPLE},
                "openai": {"summary": "OpenAI's form", "value": OPENAI_EXAMPLE},
            },
        },
        "application/jsonl": {
            "schema": {"type": "string"},
            "example": JSONL_EXAMPLE,
        },
    },
}


class RequestCountsSchema(ma.Schema):
    total = fields.Integer()
    completed = fields.Integer(metadata={"description": "Succeeded."})
    failed = fields.Integer(
        metadata={"description": "Ended otherwise: failed, canceled, expired or invalid."}
    )


class CountsSchema(ma.Schema):
    total = fields.Integer()
    pending = fields.Integer(metadata={"description": "Not stored yet (while validating)."})
    queued = fields.Integer()
    running = fields.Integer()
    succeeded = fields.Integer()
    failed = fields.Integer()
    canceled = fields.Integer()
    expired = fields.Integer(metadata={"description": "Not started within the window."})
    invalid = fields.Integer(metadata={"description": "Refused on its own (OpenAI's form)."})


class BatchUrlsSchema(ma.Schema):
    self = fields.String()
    cancel = fields.String()
    results = fields.String(metadata={"description": "The results file, once ended."})


class BatchSchema(ma.Schema):
    id = fields.String()
    object = fields.String(metadata={"example": "batch"})
    endpoint = fields.String(metadata={"example": "/v1/jobs"})
    errors = fields.Dict(allow_none=True)
    input_file_id = fields.String(allow_none=True)
    completion_window = fields.String(allow_none=True, metadata={"example": "24h"})
    status = fields.String(
        metadata={
            "description": "validating, in_progress, finalizing, completed, expired, "
            "cancelling, cancelled, failed (OpenAI's spellings)"
        }
    )
    output_file_id = fields.String(allow_none=True)
    error_file_id = fields.String(allow_none=True)
    created_at = fields.Integer(metadata={"description": "Unix seconds, as OpenAI's."})
    in_progress_at = fields.Integer(allow_none=True)
    expires_at = fields.Integer(allow_none=True)
    finalizing_at = fields.Integer(allow_none=True)
    completed_at = fields.Integer(allow_none=True)
    failed_at = fields.Integer(allow_none=True)
    expired_at = fields.Integer(allow_none=True)
    cancelling_at = fields.Integer(allow_none=True)
    cancelled_at = fields.Integer(allow_none=True)
    request_counts = fields.Nested(RequestCountsSchema)
    metadata = fields.Dict(allow_none=True)
    counts = fields.Nested(CountsSchema)
    webhook = fields.String(allow_none=True)
    urls = fields.Nested(BatchUrlsSchema)


class BatchListSchema(OpenAIList):
    data = fields.List(fields.Nested(BatchSchema))


class BatchListQuerySchema(RefusesNul, ma.Schema):
    limit = fields.Integer(
        load_default=20, validate=validate.Range(min=1, max=100), metadata={"description": "1..100"}
    )
    after = fields.UUID(metadata={"description": "`last_id` of the previous page."})


class FileSchema(ma.Schema):
    id = fields.String()
    object = fields.String(metadata={"example": "file"})
    bytes = fields.Integer(
        allow_none=True, metadata={"description": "Null for an output file: rendered when read."}
    )
    created_at = fields.Integer()
    filename = fields.String()
    purpose = fields.String(metadata={"description": "batch, batch_output, batch_error"})
    status = fields.String(metadata={"example": "processed"})
    expires_at = fields.Integer(allow_none=True)
    status_details = fields.String(allow_none=True)


class FileListSchema(ma.Schema):
    object = fields.String()
    data = fields.List(fields.Nested(FileSchema))
    has_more = fields.Boolean()
