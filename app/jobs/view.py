"""The job object clients see, as a plain function of the row: `job_view` gives what the
API answers GET /v1/jobs/{id} with (Python values: the REST response dumps it through
`JobSchema`, the event streams send it as it is), `job_json` its JSON form, which is a
webhook's `data`. No Flask here: the webhook worker renders jobs without an app.

Links and relative image URLs are made absolute against `base_url`, the API's external
URL: the request's in the API, DIFFQ_PUBLIC_URL in the webhook worker. Image URLs are
signed at read time, so they stay fresh.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urljoin

import marshmallow as ma
from marshmallow import fields

from app.db.models.jobs import Job
from app.jobs.changes import selected
from app.jobs.queue_info import QueueInfo
from app.jobs.results import RESULT_FILES
from app.storage import Storage

# The API's routes for one job (app/web/resources/jobs; a test checks they match).
JOB_PATHS = {
    "self": "/v1/jobs/{id}",
    "cancel": "/v1/jobs/{id}/cancel",
    "events": "/v1/jobs/{id}/events",
}


def job_links(base_url: str, job_id: uuid.UUID) -> dict[str, str]:
    base = base_url.rstrip("/")
    return {name: base + path.format(id=job_id) for name, path in JOB_PATHS.items()}


def image_url(storage: Storage, key: str, presign_ttl: int, base_url: str) -> str:
    """A URL that downloads the image without an API key (a local store's is a path on
    the API, made absolute here)."""
    return urljoin(base_url, storage.url(key, presign_ttl))


def _seconds(start, end) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def bytes_match(job: Job, original: Job | None) -> bool | None:
    """A replay's verdict: its images byte for byte equal to the original's; None until
    both have images with digests to compare."""
    if original is None or job.result is None or original.result is None:
        return None
    mine = [image.get("sha256") for image in job.result.get("images", [])]
    theirs = [image.get("sha256") for image in original.result.get("images", [])]
    if not mine or None in mine or None in theirs:
        return None
    return mine == theirs


def job_view(
    job: Job,
    storage: Storage,
    presign_ttl: int,
    base_url: str,
    queue: QueueInfo | None = None,
    original: Job | None = None,
) -> dict[str, Any]:
    result = None
    if job.result is not None:
        result = {"images": [], "manifest": job.manifest}
        for name in RESULT_FILES:  # a clip's job: its poster in images, the MP4 in videos
            if name not in job.result:
                continue
            shown_files = result[name] = []
            for entry in job.result[name]:
                shown = {k: v for k, v in entry.items() if k != "key"}
                shown["url"] = image_url(storage, entry["key"], presign_ttl, base_url)
                shown_files.append(shown)
    error = {"code": job.error_code, "message": job.error_message} if job.error_code else None
    return {
        "id": job.id,
        "status": job.status.value,
        "model": job.model,
        "input": job.input,
        "progress": job.progress,
        "queue_position": queue.position if queue else None,
        "eta_seconds": queue.eta_seconds if queue else None,
        "paused": queue.paused if queue else None,
        "priority": job.priority.value,
        "attempts": job.attempts,
        "result": result,
        "error": error,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "metrics": {
            "queue_seconds": _seconds(job.created_at, job.started_at),
            "run_seconds": _seconds(job.started_at, job.finished_at),
        },
        "urls": job_links(base_url, job.id),
        "cost": {"gpu_seconds": round(job.gpu_seconds, 4), "device": job.device, "model": job.model}
        if job.gpu_seconds is not None
        else None,
        "metadata": job.client_metadata,
        "data_removed": job.data_removed_at is not None,
        "webhook": job.webhook_url,
        "webhook_events": list(selected(job.webhook_events)) if job.webhook_url else None,
        "cached": job.cached_from is not None,
        "cached_from": job.cached_from,
        "replay": (
            {"of": job.replay_of, "bytes_match": bytes_match(job, original)}
            if job.replay_of
            else None
        ),
    }


def job_json(view: dict[str, Any]) -> dict[str, Any]:
    """The view as JSON values, exactly as the REST response carries it."""
    if _is_fresh(view):
        return _fresh_job_json(view)
    return _JOB_SCHEMA.dump(view)


def _is_fresh(view: dict[str, Any]) -> bool:
    """A job just stored: nothing has run, so nothing nested but its progress, links and
    replay reference."""
    return (
        view["status"] == "queued"
        and view["result"] is None
        and view["error"] is None
        and view["cost"] is None
        and view["started_at"] is None
        and view["finished_at"] is None
        and view["cached_from"] is None
        and not view["data_removed"]
    )


def _fresh_job_json(view: dict[str, Any]) -> dict[str, Any]:
    """`JobSchema().dump(view)` for a fresh job, done by hand: the schema's walk over every
    field costs more than the rest of a submit's answer (a test holds the two equal)."""
    progress = view["progress"]
    replay = view["replay"]
    events = view["webhook_events"]
    return {
        **view,
        "id": str(view["id"]),
        "input": dict(view["input"]),
        "progress": None
        if progress is None
        else {
            "stage": str(progress["stage"]),
            "step": int(progress["step"]),
            "total_steps": int(progress["total_steps"]),
            "percent": float(progress["percent"]),
        },
        "queue_position": None if view["queue_position"] is None else int(view["queue_position"]),
        "eta_seconds": None if view["eta_seconds"] is None else float(view["eta_seconds"]),
        "paused": None if view["paused"] is None else bool(view["paused"]),
        "attempts": int(view["attempts"]),
        "metrics": {"queue_seconds": None, "run_seconds": None},
        "created_at": view["created_at"].isoformat(),
        "metadata": None if view["metadata"] is None else dict(view["metadata"]),
        "webhook_events": None if events is None else [str(event) for event in events],
        "replay": None if replay is None else {"of": str(replay["of"]), "bytes_match": None},
    }


class ProgressSchema(ma.Schema):
    stage = fields.String(
        metadata={
            "description": "queued, loading, encoding_prompt, denoising, decoding, uploading, done"
        }
    )
    step = fields.Integer()
    total_steps = fields.Integer()
    percent = fields.Float()
    seconds_per_step = fields.Float(
        metadata={
            "description": "While denoising: the seconds per step this run has measured, from "
            "its second step on (absent before). The job's `eta_seconds` uses it.",
            "example": 0.042,
        }
    )


class ImageSchema(ma.Schema):
    url = fields.String(metadata={"description": "Downloads without an API key; expires."})
    width = fields.Integer()
    height = fields.Integer()
    seed = fields.Integer()
    content_type = fields.String()
    bytes = fields.Integer()
    sha256 = fields.String(metadata={"description": "SHA-256 of the image file, hex."})
    poster = fields.Boolean(metadata={"description": "A video job's poster frame (its first)."})


class VersionsSchema(ma.Schema):
    diffq = fields.String()
    diffusers = fields.String()
    torch = fields.String()
    transformers = fields.String()


class VideoManifestSchema(ma.Schema):
    frames = fields.Integer()
    fps = fields.Integer()
    codec = fields.String(metadata={"example": "h264"})
    pix_fmt = fields.String(metadata={"example": "yuv420p"})
    container = fields.String(metadata={"example": "mp4 (faststart)"})
    encoder = fields.String(
        metadata={"description": "The encoder and its library versions.", "example": "libx264"}
    )


class SchedulerManifestSchema(ma.Schema):
    class_name = fields.String(
        attribute="class", data_key="class", metadata={"example": "EulerDiscreteScheduler"}
    )
    config = fields.Dict(metadata={"description": "The scheduler's full config as run."})


class LoraManifestSchema(ma.Schema):
    sha256 = fields.String(metadata={"description": "SHA-256 of the adapter's file."})
    scale = fields.Float(metadata={"example": 0.8})
    name = fields.String(metadata={"description": "A shared adapter's name (the catalog's)."})


class ControlManifestSchema(ma.Schema):
    controlnet = fields.String(
        metadata={"description": "The catalog's ControlNet.", "example": "canny"}
    )
    image = fields.String(metadata={"description": "SHA-256 of the control image."})
    scale = fields.Float(metadata={"example": 0.8})
    start = fields.Float(metadata={"example": 0.0})
    end = fields.Float(metadata={"example": 1.0})
    preprocess = fields.String(metadata={"example": "canny"})


class ResumeSchema(ma.Schema):
    from_step = fields.Integer(metadata={"description": "The step it went on from.", "example": 64})
    worker = fields.String(metadata={"example": "gpu0@node-7"})
    at = fields.String(metadata={"example": "2026-11-28T15:02:11+00:00"})
    reason = fields.String(
        metadata={
            "description": "Why the run before it went back to the queue, where it handed the "
            "job back as it stored the state: consumer_timeout (its delivery neared the "
            "broker's consumer_timeout), shutdown, paused, preempted, yield. Absent: that run "
            "was lost (a killed worker) or went back from an earlier checkpoint.",
            "example": "consumer_timeout",
        }
    )


class QualityManifestSchema(ma.Schema):
    tier = fields.String(metadata={"example": "fast"})
    step_cache = fields.String(
        metadata={"description": "The step cache it ran with (absent: none)."}
    )
    threshold = fields.Float(metadata={"description": "First Block Cache's threshold."})
    interval = fields.Integer(metadata={"description": "TaylorSeer's full-pass interval."})
    guidance_until = fields.Float(
        metadata={
            "description": "Guidance was cut after this fraction of the steps (absent: "
            "not cut: the tier sets no cut, or the pipeline or the job's guidance left none).",
            "example": 0.5,
        }
    )
    guided_steps = fields.Integer(
        metadata={"description": "The steps run with guidance before the cut.", "example": 4}
    )


class ManifestSchema(ma.Schema):
    model = fields.String()
    model_sha256 = fields.String(
        metadata={
            "description": "SHA-256 over all the loaded model fixes: its files, a separate "
            "VAE's, dtype, variant, safety checker, quantization (the result cache keys on "
            "it)."
        }
    )
    weights_sha256 = fields.String(
        metadata={"description": "SHA-256 over the model folder's files, computed at load."}
    )
    vae_sha256 = fields.String(
        allow_none=True, metadata={"description": "A separate VAE folder's (`vae_path`)."}
    )
    variant = fields.String(allow_none=True, metadata={"example": "fp16"})
    safety_checker = fields.Boolean()
    attention_backend = fields.String(
        metadata={
            "description": "The attention kernels the model ran (the catalog's "
            "`attention_backend`, resolved): `native` is PyTorch's SDPA.",
            "example": "native",
        }
    )
    quantize = fields.String(
        allow_none=True,
        metadata={
            "description": "The denoiser's quantized weights (the catalog's `quantize`: "
            "`int8`, `fp8`); null: the model's dtype.",
            "example": "int8",
        },
    )
    kind = fields.String(metadata={"example": "img2img"})
    inputs = fields.Dict(
        keys=fields.String(),
        values=fields.String(),
        metadata={
            "description": "The SHA-256 of each input image, by field (`image`, `mask`, "
            "`controls.0.image`).",
            "example": {"image": "3f5e…"},
        },
    )
    scheduler = fields.Nested(SchedulerManifestSchema)
    seed = fields.Integer()
    loras = fields.List(
        fields.Nested(LoraManifestSchema),
        metadata={"description": "The LoRA adapters it ran with, in order (absent: none)."},
    )
    controls = fields.List(
        fields.Nested(ControlManifestSchema),
        metadata={"description": "The ControlNet controls it ran with, in order (absent: none)."},
    )
    dtype = fields.String(metadata={"example": "float16"})
    device = fields.String(metadata={"example": "NVIDIA H100 80GB HBM3"})
    versions = fields.Nested(VersionsSchema)
    video = fields.Nested(
        VideoManifestSchema, metadata={"description": "A clip's encoding (video jobs only)."}
    )
    resumes = fields.List(
        fields.Nested(ResumeSchema),
        metadata={
            "description": "Each time a run of the job resumed from its checkpoint (after a "
            "worker was lost, a shutdown or a spot notice, a yield, or a delivery handed "
            "back before the broker's consumer_timeout), in order; absent: it ran from "
            "its first step. The images are the bytes an uninterrupted run makes."
        },
    )
    quality = fields.Nested(
        QualityManifestSchema,
        metadata={"description": "The quality tier it ran at and what the call applied."},
    )
    resume_note = fields.String(
        metadata={
            "description": "Why a stored checkpoint was not resumed (missing, unreadable, "
            "another model or diffq version): the job ran from its first step.",
            "example": "the checkpoint at step 12 was not resumed (its diffq is '0.9.0', "
            "not '1.0.0'): started afresh",
        }
    )


class VideoFileSchema(ma.Schema):
    url = fields.String(metadata={"description": "Downloads without an API key; expires."})
    width = fields.Integer()
    height = fields.Integer()
    frames = fields.Integer(metadata={"example": 33})
    fps = fields.Integer(metadata={"example": 16})
    seconds = fields.Float(metadata={"description": "frames / fps", "example": 2.062})
    seed = fields.Integer()
    content_type = fields.String(metadata={"example": "video/mp4"})
    bytes = fields.Integer()
    sha256 = fields.String(metadata={"description": "SHA-256 of the MP4 file, hex."})


class ResultSchema(ma.Schema):
    images = fields.List(
        fields.Nested(ImageSchema),
        metadata={"description": "The images; for a video job, its poster (first) frame."},
    )
    videos = fields.List(
        fields.Nested(VideoFileSchema),
        metadata={
            "description": "A video job's clip: an MP4 (H.264, yuv420p, faststart) that "
            "browsers play. Absent for image jobs."
        },
    )
    manifest = fields.Nested(
        ManifestSchema,
        allow_none=True,
        metadata={"description": "How the images were made: enough to make them again."},
    )


class ReplaySchema(ma.Schema):
    of = fields.UUID(metadata={"description": "The job whose inputs this one ran again."})
    bytes_match = fields.Boolean(
        allow_none=True,
        metadata={
            "description": "True if every image is byte for byte the original's; null until "
            "both have finished with images."
        },
    )


class JobErrorSchema(ma.Schema):
    code = fields.String(
        metadata={
            "description": "invalid_input, invalid_message, model_unavailable, gpu_oom, timeout, "
            "storage_unavailable, dead_lettered, internal_error, content_filtered (the model's "
            "safety checker blacked out every image), outcome_refused (the database refused "
            "what the job produced; not retried); for canceled jobs: canceled, "
            "deadline"
        }
    )
    message = fields.String()


class JobMetricsSchema(ma.Schema):
    queue_seconds = fields.Float(allow_none=True)
    run_seconds = fields.Float(allow_none=True)


class JobUrlsSchema(ma.Schema):
    self = fields.String()
    cancel = fields.String(metadata={"description": "POST here to cancel."})
    events = fields.String(metadata={"description": "Server-Sent Events: status and progress."})


class JobCostSchema(ma.Schema):
    gpu_seconds = fields.Float(
        metadata={
            "description": "Device seconds inside the pipeline call (not queue time, not "
            "the upload): what usage and quotas count.",
            "example": 1.8421,
        }
    )
    device = fields.String(
        metadata={"description": "The device's name, as prices name it.", "example": "cpu"}
    )
    model = fields.String(metadata={"example": "tiny"})


class JobSchema(ma.Schema):
    id = fields.UUID()
    status = fields.String(metadata={"description": "queued, running, succeeded, failed, canceled"})
    model = fields.String()
    input = fields.Dict(metadata={"description": "The normalized request, with the seed used."})
    progress = fields.Nested(ProgressSchema, allow_none=True)
    queue_position = fields.Integer(
        allow_none=True,
        metadata={
            "description": "While queued: jobs that will start before this one (0: next). "
            "Null in a submit's 202: the job's GET and its events have it."
        },
    )
    eta_seconds = fields.Float(
        allow_none=True,
        metadata={
            "description": "While queued: an estimate of the seconds until it starts, from the "
            "model's recent run times (by steps, images and pixels) and the jobs ahead; null "
            "until the model has run, and in a submit's 202. While running (GET): the seconds "
            "its denoising has left at its own pace so far (a long clip's time left); null "
            "before its first step. Null while its model is paused: no start can be promised."
        },
    )
    paused = fields.Boolean(
        allow_none=True,
        metadata={
            "description": "While queued: whether an operator paused its model. It waits in "
            "its place (its position holds; its ETA is null) and starts once the model is "
            "resumed. Null in a submit's 202 and while not queued.",
            "example": False,
        },
    )
    priority = fields.String(metadata={"description": "low, normal or high."})
    attempts = fields.Integer(
        metadata={
            "description": "Runs that spent an attempt (at most DIFFQ_MAX_ATTEMPTS): a run "
            "handed back unfinished (a shutdown, a yield, a delivery near the broker's "
            "consumer_timeout) spends none; `result.manifest.resumes` lists each resume."
        }
    )
    result = fields.Nested(ResultSchema, allow_none=True)
    error = fields.Nested(
        JobErrorSchema,
        allow_none=True,
        metadata={"description": "Why it failed, or why it was canceled (canceled, deadline)."},
    )
    created_at = fields.DateTime()
    started_at = fields.DateTime(allow_none=True)
    finished_at = fields.DateTime(allow_none=True)
    metrics = fields.Nested(JobMetricsSchema)
    urls = fields.Nested(JobUrlsSchema)
    cost = fields.Nested(
        JobCostSchema,
        allow_none=True,
        metadata={"description": "Once succeeded: what the job cost. Null before."},
    )
    metadata = fields.Dict(allow_none=True)
    data_removed = fields.Boolean(
        metadata={
            "description": "True once the images were deleted after the retention period "
            "(DIFFQ_RESULT_RETENTION); `result` is then null."
        }
    )
    webhook = fields.String(allow_none=True)
    webhook_events = fields.List(fields.String(), allow_none=True)
    cached = fields.Boolean(
        metadata={"description": "Answered from the result cache: no GPU run (see `cache`)."}
    )
    cached_from = fields.UUID(
        allow_none=True, metadata={"description": "The job whose images a cached job shares."}
    )
    replay = fields.Nested(ReplaySchema, allow_none=True)


_JOB_SCHEMA = JobSchema()
