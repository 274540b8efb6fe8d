"""A generated job's images into the result store and its outcome into PostgreSQL: inline,
or handed to a post-processing thread so the GPU starts the next job at once (its
message is then acked at the hand-over, and its lease protects it until the outcome is
recorded: docs/gpu.md, "Post-processing off the critical path")."""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING, Any

from app import usage
from app.jobs.cache import cache_key
from app.jobs.states import ErrorCode
from app.kinds import kind_of
from app.logs import job_context
from app.storage import StorageUnavailable, image_key
from app.storage.retry import put_with_retry
from workers import record
from workers.call import Generation
from workers.encoding import encode_image
from workers.lease import LeaseKeeper
from workers.manifest import job_manifest
from workers.outcome import Outcome, Verdict
from workers.pipelines import LoadedModel, device_name

if TYPE_CHECKING:
    from workers.run import Member
    from workers.runtime import WorkerRuntime


def store(
    rt: WorkerRuntime,
    member: Member,
    model: LoadedModel,
    output: Generation,
    timing: tuple[float, float],
    gpu_seconds: float,
) -> Outcome:
    """Record a generated job: encode, upload and record it inline or hand it over.

    `timing`: when the job's run started and when its images were made; `gpu_seconds`:
    its share of the pipeline call (all of it, unless batched).
    """
    job, request = member.job, member.request
    outcome = {
        "charge": usage.Charge(gpu_seconds, device_name(model.device), len(output.images)),
        "manifest": {
            **job_manifest(model.manifest or {}, output.scheduler, request),
            **(member.checkpoints.manifest() if member.checkpoints else {}),
            **({"quality": output.quality} if output.quality else {}),
        },
        # The cache key from the weights this worker ran, not the ones the API assumed.
        "cache_key": cache_key(model.digest, request) if job.cache_key and model.digest else None,
    }
    if all(output.nsfw):
        return record.fail(
            rt,
            job,
            ErrorCode.CONTENT_FILTERED,
            "the model's safety checker blacked out every image",
        )
    if rt.postprocessor is None:
        member.reporter.stage("uploading", request.denoise_steps, request.denoise_steps)
        return finish(rt, member, output, outcome, timing)
    return _finish_later(rt, member, output, outcome, timing)


def finish(
    rt: WorkerRuntime,
    member: Member,
    output: Generation,
    outcome: dict[str, Any],
    timing: tuple[float, float],
) -> Outcome:
    """Encode, upload and record a generated job (inline, or on the post-processing thread)."""
    job = member.job
    try:
        if kind_of(member.request).video:
            files = _encode_and_upload_clip(rt, member, output.images[0], outcome["manifest"])
        else:
            files = {"images": _encode_and_upload(rt, member, output.images)}
    except StorageUnavailable as exc:
        return record.fail(rt, job, ErrorCode.STORAGE_UNAVAILABLE, str(exc))
    except Exception as exc:  # noqa: BLE001 (recorded in crashed)
        return record.crashed(rt, job, exc)
    for entry, flagged in zip(files["images"], output.nsfw, strict=True):
        if flagged:
            entry["nsfw_filtered"] = True  # a black image, not what was asked for
    steps = member.request.denoise_steps
    recorded = record.succeed(rt, job, files, steps, outcome, timing, member.reporter.writes)
    if member.checkpoints is not None:  # recorded: nothing will resume it again
        member.checkpoints.discard()
    return recorded


def _finish_later(
    rt: WorkerRuntime,
    member: Member,
    output: Generation,
    outcome: dict[str, Any],
    timing: tuple[float, float],
) -> Outcome:
    """Hand the finished job to the post-processing thread; the GPU is free at once.

    The message is acked when this returns. Until the outcome is recorded, a lease keeper
    of its own (not tied to the next job's stop flag) keeps the job's lease alive; if this
    process dies first, the lease runs out and the relay requeues the job. A job that
    fails after the hand-over gets the dead letter its message would have become.
    """
    assert rt.postprocessor is not None
    job, steps = member.job, member.request.denoise_steps
    lease = LeaseKeeper(
        member.renew, interval=rt.settings.lease_seconds / 3, stop=threading.Event()
    ).start()
    context = {"job_id": str(job.id), "tenant": str(job.tenant_id), "attempt": str(job.attempts)}

    def work() -> Outcome:
        try:
            with job_context(**context):
                # Even the stage write is off the GPU's path.
                member.reporter.stage("uploading", steps, steps)
                finished = finish(rt, member, output, outcome, timing)
                if finished.verdict == Verdict.DEAD_LETTER:
                    rt.dead_letter(job, finished.reason)
                if member.permit is None:  # the job of a task message: its monitors hear
                    rt.report(job, finished)
                return finished
        finally:
            lease.close()

    rt.postprocessor.submit(work)
    return Outcome(Verdict.HANDED_OVER, "generated; encode, upload and record handed over")


def _put(rt: WorkerRuntime, key: str, data: bytes, content_type: str) -> dict[str, Any]:
    """One file into the result store (with retry and backoff); its entry's common part."""
    settings = rt.settings
    put_with_retry(
        rt.storage,
        key,
        data,
        content_type,
        retries=settings.upload_retries,
        backoff=settings.upload_backoff,
        backoff_max=settings.upload_backoff_max,
    )
    return {
        "key": key,
        "content_type": content_type,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def _encode_and_upload(
    rt: WorkerRuntime, member: Member, images: list[Any]
) -> list[dict[str, Any]]:
    job, request = member.job, member.request
    results = []
    for index, image in enumerate(images):
        encoded = encode_image(image, request.output_format)
        key = image_key(job.tenant_id, job.id, index, encoded.extension)
        entry = _put(rt, key, encoded.data, encoded.content_type)
        seed = request.image_seed(index)
        results.append({**entry, "width": encoded.width, "height": encoded.height, "seed": seed})
    return results


def _encode_and_upload_clip(
    rt: WorkerRuntime, member: Member, frames: Any, manifest: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """A clip as an MP4 (encoded frame by frame) and its poster frame in the job's output
    format: `videos` and `images` of the result. The encoding goes in the manifest."""
    from workers.video import encode_video, poster

    job, request = member.job, member.request
    clip = encode_video(frames, request.fps)
    video = _put(
        rt, image_key(job.tenant_id, job.id, 0, clip.extension), clip.data, clip.content_type
    )
    video.update(
        width=clip.width,
        height=clip.height,
        frames=clip.frames,
        fps=clip.fps,
        seconds=round(clip.seconds, 3),
        seed=request.seed,
    )
    still = encode_image(poster(frames[0]), request.output_format)
    image = _put(
        rt, image_key(job.tenant_id, job.id, 0, still.extension), still.data, still.content_type
    )
    image.update(width=still.width, height=still.height, seed=request.seed, poster=True)
    manifest["video"] = {
        "frames": clip.frames,
        "fps": clip.fps,
        "codec": clip.codec,
        "pix_fmt": "yuv420p",
        "container": "mp4 (faststart)",
        "encoder": clip.encoder,
    }
    return {"images": [image], "videos": [video]}
