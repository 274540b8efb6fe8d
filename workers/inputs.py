"""A job's input images, read from the result store by digest before its pipeline call
(app/uploads.py put them there, checked, at upload)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from app.kinds import JobRequest, kind_of
from app.kinds.images import as_mask
from app.storage.retry import get_kept
from app.uploads import input_key

if TYPE_CHECKING:
    from workers.runtime import WorkerRuntime


class InputMissing(Exception):
    """An input the job names is no longer stored (removed by retention, or never was)."""


def load_inputs(rt: WorkerRuntime, tenant_id: Any, request: JobRequest) -> dict[str, Any]:
    """The job's input images (PIL, by field; masks as L), retrying a store that is away
    as an upload does; raises InputMissing, or StorageUnavailable."""
    from PIL import Image

    kind = kind_of(request)
    loaded: dict[str, Any] = {}
    for field, digest in kind.inputs(request).items():
        gone = f"the input {field} ({digest[:12]}…) is no longer stored"
        data = get_kept(rt.storage, input_key(tenant_id, digest), rt.settings, InputMissing(gone))
        image = Image.open(io.BytesIO(data))
        image.load()
        loaded[field] = as_mask(image) if field in kind.mask_fields else image
    return loaded
