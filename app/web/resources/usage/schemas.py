"""GET /v1/usage: query and answer."""

from __future__ import annotations

import marshmallow as ma
from marshmallow import fields, validates_schema

MAX_DAYS = 366


class UsageQuerySchema(ma.Schema):
    from_ = fields.Date(
        data_key="from",
        metadata={
            "description": "First UTC day, included (default: 29 days before `to`).",
            "example": "2026-11-01",
        },
    )
    to = fields.Date(
        metadata={
            "description": "Last UTC day, included (default: today).",
            "example": "2026-11-23",
        }
    )

    @validates_schema
    def _range(self, data, **_kwargs):
        first, last = data.get("from_"), data.get("to")
        if first and last and first > last:
            raise ma.ValidationError("must not be after `to`.", field_name="from")
        if first and last and (last - first).days >= MAX_DAYS:
            raise ma.ValidationError(f"at most {MAX_DAYS} days from `from`.", field_name="to")


class UsageRowSchema(ma.Schema):
    day = fields.Date(metadata={"example": "2026-11-23"})
    model = fields.String(metadata={"example": "tiny"})
    device = fields.String(metadata={"example": "NVIDIA H200"})
    gpu_seconds = fields.Float(metadata={"example": 412.7})
    jobs = fields.Integer(metadata={"example": 200})
    images = fields.Integer(metadata={"example": 230})
    price = fields.Float(
        allow_none=True,
        metadata={
            "description": "gpu_seconds at DIFFQ_GPU_PRICES' price for the device; null "
            "where none is set.",
            "example": 0.4541,
        },
    )


class UsageTotalsSchema(ma.Schema):
    gpu_seconds = fields.Float()
    jobs = fields.Integer()
    images = fields.Integer()
    price = fields.Float(allow_none=True)


class QuotaSchema(ma.Schema):
    daily_gpu_seconds = fields.Float(
        allow_none=True,
        metadata={"description": "GPU-seconds a UTC day; null: no quota.", "example": 3600.0},
    )
    used_today = fields.Float(metadata={"example": 412.7})


class UsageSchema(ma.Schema):
    from_ = fields.Date(data_key="from")
    to = fields.Date()
    currency = fields.String(metadata={"example": "USD"})
    data = fields.List(
        fields.Nested(UsageRowSchema),
        metadata={"description": "One row per UTC day, model and device that had jobs."},
    )
    totals = fields.Nested(UsageTotalsSchema)
    quota = fields.Nested(QuotaSchema)
