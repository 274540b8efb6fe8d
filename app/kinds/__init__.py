"""Job kinds: what a job asks a model to do, one module per kind.

Each module declares a `JobKind` (app/kinds/base.py): its typed request, the API fields
and limits only it has, how a request normalizes, which jobs may share a pipeline call,
which diffusers pipeline it runs on (shared with the loaded model by `from_pipe`) and the
keywords of that call. The API's request schema and OpenAPI document, the estimate, the
cache key, the batch key and the worker's one pipeline call all take a kind's part from
here. Adding a kind is a module, its line in `KINDS`, its tests and a README section
(docs/architecture.md, "How to add a job kind").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.kinds import img2img, inpaint, txt2img, video
from app.kinds.base import JobKind, JobRequest

KINDS: dict[str, JobKind] = {
    kind.name: kind
    for kind in (txt2img.KIND, img2img.KIND, inpaint.KIND, video.TXT2VID, video.IMG2VID)
}
DEFAULT_KIND = txt2img.KIND.name
# Keys a stored input of an earlier version may lack, with the value it ran with.
EARLIER_DEFAULTS = {
    "kind": DEFAULT_KIND,
    "negative_prompt": None,
    "num_images": 1,
    "scheduler": "default",
    "output_format": "png",
    "priority": "normal",
    # Stored only where it is not `exact` (app/kinds/base.py `stored`): a row without it,
    # of any version, ran at `exact`.
    "quality": "exact",
}


class UnknownKind(ValueError):
    pass


def get_kind(name: str) -> JobKind:
    try:
        return KINDS[name]
    except KeyError:
        raise UnknownKind(f"unknown job kind {name!r}") from None


def kind_of(job: JobRequest) -> JobKind:
    return get_kind(job.kind)


def compatible(a: JobRequest, b: JobRequest) -> bool:
    """Whether two jobs may share one pipeline call (the kind's batch fields equal)."""
    return a.kind == b.kind and kind_of(a).batch_key(a) == kind_of(b).batch_key(b)


def job_request(job: Any) -> JobRequest:
    """The typed request a job row's `input` stores (app/db/models.py `Job`)."""
    return request_from_stored(job.input or {})


def request_from_stored(data: Mapping[str, Any]) -> JobRequest:
    """A job's typed request from its row's `input` (rows of earlier versions included:
    they had no `kind` and were text to image). Keys the type does not know are ignored,
    so a row written by a newer version still reads."""
    values = {**EARLIER_DEFAULTS, **data}
    kind = get_kind(values["kind"])
    names = kind.request_type.__dataclass_fields__
    return kind.request_type(**{k: v for k, v in values.items() if k in names})


__all__ = [
    "DEFAULT_KIND",
    "EARLIER_DEFAULTS",
    "KINDS",
    "JobKind",
    "JobRequest",
    "compatible",
    "get_kind",
    "kind_of",
    "request_from_stored",
]
