"""Input images: decoded and checked once, at upload, never first in the worker.

An upload (`POST /v1/uploads`, or a `data:` URI in a job) must be a real PNG, JPEG or
WebP image. Its size is read from the header and refused before anything is decoded when
it has more pixels than DIFFQ_INPUT_MAX_PIXELS (decompression bombs); then it is decoded
in full (a truncated or lying file is refused), turned upright by its EXIF orientation,
and stored as PNG: RGB, RGBA where it has transparency, L for a mask. The PNG is what a
job reads, under the tenant's prefix, addressed by its SHA-256 (`input_key`): the same
image uploaded twice is one object, and a job names the digest, which also goes into its
cache key and manifest.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import logging
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from app.db.models.inputs import Upload
from app.db.models.jobs import Job
from app.db.types import utcnow
from app.jobs.states import JobStatus
from app.kinds import KINDS
from app.kinds.images import InputRef
from app.refused import FieldRefused
from app.storage import Storage, StorageError

log = logging.getLogger(__name__)

FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
# An upload held for a job whose results are kept for ever (DIFFQ_RESULT_RETENTION=0).
FOREVER = datetime(9999, 1, 1, tzinfo=UTC)
_DATA_URI = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w-]+=[\w.-]+)*);base64,")


class InputRefused(FieldRefused):
    """An input image no job could run on; `field` names the request's field."""


@dataclass(frozen=True)
class InputImage:
    """A checked input image, as stored: its PNG, digest, size and mode."""

    png: bytes
    sha256: str
    width: int
    height: int
    mode: str  # RGB, RGBA or L


def input_key(tenant_id: object, sha256: str) -> str:
    return f"{tenant_id}/inputs/{sha256}.png"


def decode(data: bytes, *, field: str, max_pixels: int, mask: bool = False) -> InputImage:
    """Check and normalize an input image; raises InputRefused naming `field`."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if not data:
        raise InputRefused(field, "Empty: send a PNG, JPEG or WebP image.")
    try:
        image = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError) as exc:
        raise InputRefused(field, "Not an image: send a PNG, JPEG or WebP image.") from exc
    except Image.DecompressionBombError as exc:
        raise InputRefused(field, f"Too many pixels: at most {max_pixels}.") from exc
    if image.format not in FORMATS:
        raise InputRefused(
            field, f"A {image.format} image: send a PNG, JPEG or WebP image instead."
        )
    width, height = image.size
    if width < 1 or height < 1 or width * height > max_pixels:
        raise InputRefused(
            field, f"{width}x{height} is {width * height} pixels: at most {max_pixels}."
        )
    try:
        image.load()  # all of it: a truncated or lying file fails here, not in a worker
        image = ImageOps.exif_transpose(image)
    except Image.DecompressionBombError as exc:
        raise InputRefused(field, f"Too many pixels: at most {max_pixels}.") from exc
    except (OSError, ValueError, SyntaxError) as exc:
        raise InputRefused(field, f"A truncated or damaged {image.format} image.") from exc
    image = _normalized(image, mask=mask)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=6)
    png = buffer.getvalue()
    return InputImage(png, hashlib.sha256(png).hexdigest(), image.width, image.height, image.mode)


def _normalized(image, *, mask: bool):
    """RGB, or RGBA where the image has transparency; a mask is L (white = repaint)."""
    if mask:
        if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
            # A transparent mask paints where it is opaque: its alpha is the mask.
            return image.convert("RGBA").getchannel("A")
        return image.convert("L")
    has_alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    if has_alpha:
        image = image.convert("RGBA")
        if image.getchannel("A").getextrema() == (255, 255):
            return image.convert("RGB")  # an alpha channel that hides nothing
        return image
    return image.convert("RGB")


def decode_data_uri(value: str, *, field: str, max_bytes: int) -> bytes:
    """The bytes of a base64 `data:` URI, refused past `max_bytes` (decoded)."""
    match = _DATA_URI.match(value)
    if match is None:
        raise InputRefused(field, "A data: URI must be base64: data:image/png;base64,...")
    encoded = value[match.end() :]
    too_big = InputRefused(
        field,
        f"A data: URI may hold at most {max_bytes} bytes (DIFFQ_DATA_URI_MAX_BYTES); "
        "upload a larger image with POST /v1/uploads and give its id.",
        status=413,
    )
    if len(encoded) * 3 // 4 > max_bytes + 2:
        raise too_big
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InputRefused(field, "The data: URI's base64 does not decode.") from exc
    if len(data) > max_bytes:
        raise too_big
    return data


def store(
    session: Session,
    storage: Storage,
    tenant_id: uuid.UUID,
    image: InputImage,
    *,
    ttl: float,
) -> Upload:
    """Put the PNG under the tenant's prefix (once per digest) and record the upload: a
    new row, or the same image's row with its expiry moved on. Commits. The row is locked
    before the put (PostgreSQL), so that a `forget` of it cannot remove the object between
    this put and this commit."""
    row = session.scalar(
        select(Upload)
        .where(Upload.tenant_id == tenant_id, Upload.sha256 == image.sha256)
        .with_for_update()
    )
    storage.put(input_key(tenant_id, image.sha256), image.png, "image/png")
    now = utcnow()
    expires = now + timedelta(seconds=ttl)
    if row is None:
        row = Upload(
            tenant_id=tenant_id,
            sha256=image.sha256,
            width=image.width,
            height=image.height,
            bytes=len(image.png),
            mode=image.mode,
            created_at=now,
            expires_at=expires,
        )
        session.add(row)
    else:
        row.expires_at = max(_aware(row.expires_at), expires)
    session.commit()
    return row


def find(session: Session, tenant_id: uuid.UUID, upload_id: uuid.UUID) -> Upload | None:
    """The tenant's upload, unexpired; None for another tenant's, exactly as for none."""
    row = session.scalar(
        select(Upload).where(Upload.id == upload_id, Upload.tenant_id == tenant_id)
    )
    if row is None or _aware(row.expires_at) <= utcnow():
        return None
    return row


def hold(row: Upload, seconds: float) -> bool:
    """Keep the upload at least `seconds` from now (0: for ever), for a job that uses it;
    True when its expiry moved (the caller commits)."""
    until = FOREVER if seconds <= 0 else utcnow() + timedelta(seconds=seconds)
    if _aware(row.expires_at) >= until:
        return False
    row.expires_at = until
    return True


def needed(session: Session, row: Upload) -> bool:
    """Whether a job of the tenant that may still run, or whose results are kept, names
    the image in one of its input fields."""
    fields = sorted({name for kind in KINDS.values() for name in kind.image_fields})
    named = or_(*(Job.input[name].as_string() == row.sha256 for name in fields))
    live = or_(
        Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]),
        and_(Job.status == JobStatus.SUCCEEDED, Job.data_removed_at.is_(None)),
    )
    found = session.scalar(
        select(Job.id).where(Job.tenant_id == row.tenant_id, named, live).limit(1)
    )
    return found is not None


def remove(session: Session, storage: Storage, row: Upload) -> None:
    """Delete the upload's image from the store, then its row (committed): its links
    answer 404 from now on. Raises StorageError with the row left as it was."""
    storage.delete(input_key(row.tenant_id, row.sha256))
    session.delete(row)
    session.commit()


def forget(session: Session, storage: Storage, row: Upload) -> bool:
    """`DELETE /v1/uploads/{id}`: the id names nothing from now on, and the image goes at
    once unless a job that may still run, or whose results are kept, names it (then the
    retention sweep removes it after that job's results). True when it went now.

    The row is locked first (PostgreSQL), as `store` locks it: an upload of the same
    image at the same moment either comes after (and stores it again) or before (and is
    forgotten with it)."""
    locked = session.scalar(select(Upload).where(Upload.id == row.id).with_for_update())
    if locked is None:
        return False
    if not needed(session, locked):
        try:
            remove(session, storage, locked)
            return True
        except StorageError as exc:  # the store away: the retention sweep deletes it later
            log.warning("upload %s: its image not deleted yet (%s)", locked.id, exc)
    locked.expires_at = utcnow() - timedelta(seconds=1)
    session.commit()
    return False


def ref(row: Upload) -> InputRef:
    return InputRef(row.sha256, row.width, row.height, row.mode)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
