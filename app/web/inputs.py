"""A request's input images: an upload's id, or a `data:` URI (checked when the request is
validated, stored as an upload once it is accepted: app/uploads.py), resolved for this
request's tenant."""

from __future__ import annotations

import io
import uuid
from dataclasses import dataclass

from flask_smorest import abort

from app import uploads
from app.kinds.images import InputRef
from app.uploads import InputRefused
from app.web.auth import current_tenant
from app.web.services import request_session, services


@dataclass(frozen=True)
class Keep:
    """What an input needs once its request is accepted, and not before (a refused
    request stores nothing): a checked image to store, or an upload to hold."""

    field: str
    image: uploads.InputImage | None = None
    upload_id: uuid.UUID | None = None


def resolve(value: str | uploads.InputImage, *, field: str) -> tuple[InputRef, Keep]:
    """The input `value` names, and what keeping it takes; raises InputRefused naming
    `field`. Another tenant's upload id, an expired one and one that never was are
    refused alike. A `data:` URI (or an image checked already) is decoded and checked
    here; it is stored by `keep`, once the whole request is accepted."""
    settings = services().settings
    if isinstance(value, uploads.InputImage):
        return _ref(value), Keep(field, image=value)
    if value.startswith("data:"):
        data = uploads.decode_data_uri(value, field=field, max_bytes=settings.data_uri_max_bytes)
        image = uploads.decode(data, field=field, max_pixels=settings.input_max_pixels)
        return _ref(image), Keep(field, image=image)
    try:
        upload_id = uuid.UUID(value)
    except ValueError as exc:
        raise InputRefused(field, "Not an upload id nor a data: URI.") from exc
    row = uploads.find(request_session(), current_tenant(), upload_id)
    if row is None:
        raise InputRefused(field, "No such upload (it may have expired): POST /v1/uploads.")
    return uploads.ref(row), Keep(field, upload_id=row.id)


def _ref(image: uploads.InputImage) -> InputRef:
    return InputRef(image.sha256, image.width, image.height, image.mode)


def keep(keeps: tuple[Keep, ...] | list[Keep]) -> None:
    """An accepted request's inputs: each image stored as the tenant's upload, each
    upload held at least as long as the job's results are. Commits."""
    svc = services()
    session = request_session()
    for item in keeps:
        if item.image is not None:
            row = uploads.store(
                session, svc.storage, current_tenant(), item.image, ttl=svc.settings.input_ttl
            )
        else:
            row = uploads.find(session, current_tenant(), item.upload_id)
            if row is None:  # expired since it was checked, a moment ago: nothing is kept
                session.rollback()
                abort(
                    422,
                    errors={
                        "json": {item.field: ["No such upload (it expired): POST /v1/uploads."]}
                    },
                )
        uploads.hold(row, svc.settings.result_retention)
    if keeps:
        session.commit()


def without_inputs(loaded: dict) -> tuple[dict, tuple[Keep, ...]]:
    """A loaded job request (JobCreateSchema) apart from what its inputs need kept."""
    rest = dict(loaded)
    return rest, tuple(rest.pop("inputs", ()))


def store(data: bytes, *, field: str, mask: bool = False):
    """Check `data` and store it as this tenant's upload (its row)."""
    svc = services()
    image = uploads.decode(data, field=field, max_pixels=svc.settings.input_max_pixels, mask=mask)
    row = uploads.store(
        request_session(), svc.storage, current_tenant(), image, ttl=svc.settings.input_ttl
    )
    return row


def checked_png(image, *, field: str) -> uploads.InputImage:
    """A PIL image (an edit's, converted) checked as an upload is, not stored yet."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    settings = services().settings
    return uploads.decode(buffer.getvalue(), field=field, max_pixels=settings.input_max_pixels)
