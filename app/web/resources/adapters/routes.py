"""LoRA adapters: `POST /v1/adapters` checks one for a model's family and stores it for
the tenant (app/addons/lora/); a job names it in `loras` by id."""

from __future__ import annotations

import uuid

import marshmallow as ma
from flask import request, url_for
from flask.views import MethodView
from flask_smorest import abort
from marshmallow import fields

from app.addons.lora import checks
from app.addons.lora import store as adapters
from app.addons.lora.store import adapter_key
from app.db.types import utcnow
from app.web.auth import current_tenant, require_api_key
from app.web.bodies import Blueprint
from app.web.errors import found
from app.web.openapi import BINARY, answers, form_body
from app.web.services import request_session, services

blp = Blueprint(
    "adapters",
    __name__,
    url_prefix="/v1/adapters",
    description="LoRA adapters (.safetensors) that jobs of every kind may name in `loras`.",
)
blp.before_request(require_api_key)

EXAMPLE = {
    "id": "01937c52-5d0e-7b9a-8e0f-6a2b4c1d9e33",
    "name": "watercolor",
    "sha256": "9f2c…",
    "model": "sd15",
    "family": "sd15",
    "bytes": 3236768,
    "rank": 8,
    "layers": 128,
    "created_at": "2026-11-25T03:00:00+00:00",
    "urls": {"self": "https://diffq.example/v1/adapters/01937c52-5d0e-7b9a-8e0f-6a2b4c1d9e33"},
}


class AdapterSchema(ma.Schema):
    id = fields.UUID(metadata={"description": "What a job's `loras[].id` names."})
    name = fields.String(allow_none=True, metadata={"description": "Your label, if given."})
    sha256 = fields.String(
        metadata={"description": "SHA-256 of the file: in job manifests and cache keys."}
    )
    model = fields.String(metadata={"description": "The model it was checked for."})
    family = fields.String(
        metadata={"description": "That model's family: the models whose jobs may use it."}
    )
    bytes = fields.Integer()
    rank = fields.Integer(metadata={"description": "The largest LoRA rank in the file."})
    layers = fields.Integer(metadata={"description": "Adapted layers (down/up pairs)."})
    created_at = fields.DateTime()
    urls = fields.Dict(keys=fields.String(), values=fields.String())


class AdapterListSchema(ma.Schema):
    data = fields.List(fields.Nested(AdapterSchema))


def _view(row) -> dict:
    shown = ("id", "name", "sha256", "model", "family", "bytes", "rank", "layers", "created_at")
    return {
        **{name: getattr(row, name) for name in shown},
        "urls": {"self": url_for("adapters.Adapter", adapter_id=row.id, _external=True)},
    }


def _found(adapter_id: uuid.UUID):
    return found(adapters.find(request_session(), current_tenant(), adapter_id), "adapter")


def _refuse(refused: checks.AdapterRefused):
    abort(refused.status, errors={"files": {refused.field: [refused.message]}})


@blp.route("")
class Adapters(MethodView):
    @blp.doc(
        requestBody=form_body(
            {
                "file": {**BINARY, "description": "The LoRA, .safetensors."},
                "model": {
                    "type": "string",
                    "description": "The model it is for (its family is checked); "
                    "default: the default model.",
                    "example": "sd15",
                },
                "name": {"type": "string", "example": "watercolor"},
            },
            ["file"],
        )
    )
    @blp.response(201, AdapterSchema, example=EXAMPLE)
    @answers(
        blp,
        """
        413 Past DIFFQ_ADAPTER_MAX_BYTES.
        415 Not a multipart form.
        422 Not a safetensors file (a pickle, .bin or .ckpt is refused unread),
            truncated, not LoRA keys, a rank mismatch, or keys and shapes that do
            not fit the model's family (an SDXL LoRA for an SD 1.5 model): the
            message names it.
        """,
    )
    def post(self):
        """Upload a LoRA adapter

        A multipart form: `file` (.safetensors only), `model` (the model it is for),
        `name` (optional). Checked here from its header alone, nothing unpickled: the
        safetensors layout, its size, LoRA key pairs of one rank, and their shapes
        against the model's family. Stored under your prefix by its SHA-256; the same
        file uploaded again is the same adapter. Jobs name it in `loras` by `id`.
        """
        if request.mimetype != "multipart/form-data":
            problem = "Send the adapter as multipart/form-data: `file`, `model`, `name`."
            abort(415, message=problem, errors={"headers": {"Content-Type": [problem]}})
        svc = services()
        part = request.files.get("file")
        if part is None:
            abort(422, errors={"files": {"file": ["Missing: send the .safetensors as `file`."]}})
        filename = (part.filename or "").lower()
        if filename and not filename.endswith(".safetensors"):
            abort(422, errors={"files": {"file": ["Only .safetensors adapters are accepted."]}})
        model = request.form.get("model") or None
        spec = svc.catalog.get(model)
        if spec is None:
            names = ", ".join(sorted(svc.catalog.models))
            abort(422, errors={"form": {"model": [f"Unknown model. Available: {names}."]}})
        if spec.lora_limit == 0:
            abort(422, errors={"form": {"model": [f"Model '{spec.name}' takes no adapters."]}})
        name = request.form.get("name") or None
        if name is not None and len(name) > 200:
            abort(422, errors={"form": {"name": ["At most 200 characters."]}})
        try:
            checked = checks.check(
                part.read(),
                checks.FAMILIES[spec.lora_family],
                field="file",
                max_bytes=svc.settings.adapter_max_bytes,
            )
        except checks.AdapterRefused as refused:
            _refuse(refused)
        row = adapters.store(
            request_session(), svc.storage, current_tenant(), checked, name=name, model=spec.name
        )
        return _view(row), 201

    @blp.response(200, AdapterListSchema)
    def get(self):
        """List your adapters

        Yours, oldest first. The operator's shared adapters (the catalog's
        `[adapters.NAME]`) are named in `loras` by `name`.
        """
        return {
            "data": [_view(row) for row in adapters.listing(request_session(), current_tenant())]
        }


@blp.route("/<uuid:adapter_id>")
class Adapter(MethodView):
    @blp.response(200, AdapterSchema, example=EXAMPLE)
    @blp.alt_response(404, description="No such adapter (or not yours, or deleted).")
    def get(self, adapter_id: uuid.UUID):
        """Look an adapter up

        Its name, digest and size, the model and family it was checked for, its rank and
        the layers it adapts. Another tenant's or a deleted adapter is a 404.
        """
        return _view(_found(adapter_id))

    @blp.response(204)
    @blp.alt_response(404, description="No such adapter (or not yours, or deleted).")
    def delete(self, adapter_id: uuid.UUID):
        """Delete an adapter

        Its id names nothing from now on and its file is removed from the store: a job
        still queued with it fails (`invalid_input`).
        """
        row = _found(adapter_id)
        row.deleted_at = utcnow()
        session = request_session()
        session.commit()
        services().storage.delete(adapter_key(row.tenant_id, row.sha256))
        return None
