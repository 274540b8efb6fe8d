"""A request's input images: an upload's id, or a `data:` URI stored as an upload on the
way (app/uploads.py), resolved for this request's tenant."""

from __future__ import annotations

import io
import uuid

from app import adapters, uploads
from app.kinds.base import Lora
from app.uploads import InputRef, InputRefused
from app.web.auth import current_tenant
from app.web.services import request_session, services


def resolve(value: str, *, field: str) -> InputRef:
    """The input `value` names; raises InputRefused naming `field`. Another tenant's
    upload id, an expired one and one that never was are refused alike."""
    settings = services().settings
    if value.startswith("data:"):
        data = uploads.decode_data_uri(value, field=field, max_bytes=settings.data_uri_max_bytes)
        row = store(data, field=field)
        _held(row)
        return uploads.ref(row)
    try:
        upload_id = uuid.UUID(value)
    except ValueError as exc:
        raise InputRefused(field, "Not an upload id nor a data: URI.") from exc
    row = uploads.find(request_session(), current_tenant(), upload_id)
    if row is None:
        raise InputRefused(field, "No such upload (it may have expired): POST /v1/uploads.")
    _held(row)
    return uploads.ref(row)


def _held(row) -> None:
    """A job uses the upload: it stays at least as long as the job's results do."""
    settings = services().settings
    if uploads.hold(row, settings.result_retention):
        request_session().commit()


def store(data: bytes, *, field: str, mask: bool = False):
    """Check `data` and store it as this tenant's upload (its row)."""
    svc = services()
    image = uploads.decode(data, field=field, max_pixels=svc.settings.input_max_pixels, mask=mask)
    row = uploads.store(
        request_session(), svc.storage, current_tenant(), image, ttl=svc.settings.input_ttl
    )
    return row


def store_png(image, *, field: str):
    """A PIL image (an edit's, converted) stored as this tenant's upload (its row)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return store(buffer.getvalue(), field=field)


def resolve_loras(spec, items: list[dict]) -> tuple[tuple[Lora, ...], dict]:
    """The adapters a request names (`{"id"|"name", "scale"}`), for `spec`'s model and
    this request's tenant; the refusals by position (`{index: {field: [message]}}`).
    Another tenant's adapter id, a deleted one and one that never was are refused alike."""
    svc = services()
    found: list[Lora] = []
    errors: dict[int, dict[str, list[str]]] = {}
    for index, item in enumerate(items):
        scale = float(item.get("scale", 1.0))
        if item.get("name") is not None:
            shared = svc.catalog.adapters.get(item["name"])
            if shared is None:
                errors[index] = {"name": ["No such shared adapter in the catalog."]}
            elif shared.family != spec.lora_family:
                errors[index] = {
                    "name": [
                        f"A {shared.family} adapter: model '{spec.name}' is {spec.lora_family}."
                    ]
                }
            else:
                found.append(Lora(shared.sha256, scale, shared.name))
            continue
        row = adapters.find(request_session(), current_tenant(), item["id"])
        if row is None:
            errors[index] = {"id": ["No such adapter: POST /v1/adapters."]}
        elif row.family != spec.lora_family:
            errors[index] = {
                "id": [f"A {row.family} adapter: model '{spec.name}' is {spec.lora_family}."]
            }
        else:
            found.append(Lora(row.sha256, scale))
    digests = [lora.sha256 for lora in found]
    if not errors and len(set(digests)) != len(digests):
        errors[len(items) - 1] = {"id": ["The same adapter twice: give it once, with one scale."]}
    return tuple(found), errors
