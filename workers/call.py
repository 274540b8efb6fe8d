"""The one place diffq calls a diffusers pipeline.

A call runs one or more compatible jobs of one kind; a single job is a batch of one. The
kind (app/kinds) gives the pipeline, derived once from the loaded model with its
AutoPipeline's `from_pipe` (the same weights, no second copy), and the call's keywords.
What is each call's own is set here, under the model's lock, for every call: a new
scheduler built from the model's own (schedulers keep per-run state: timesteps, step
index, earlier samples), one seeded generator per image (image i of a job uses seed + i,
so a job's latents start the same batched or alone) and the step callback. Nothing a call
sets outlives it (the pipeline gets the model's own scheduler back) or reaches another
call.

Each job's `on_step(step, total)` is called after every denoising step; a False takes
that job out at once: its rows are cut from the running call (workers/rows.py) and
nothing of it is decoded. When every job has left, the call stops right there
(Interrupted: no remaining step, no VAE decode, no safety checker).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from app.addons import ADDONS
from app.kinds import JobKind, JobRequest, kind_of
from app.metrics.instruments import COMPILED_GRAPHS
from app.rules import SCHEDULERS
from workers import conditioning, denoise_state
from workers.compiled import denoiser_name, running
from workers.rows import cut_rows, cut_scheduler, row_inputs
from workers.tiers import TierCall

if TYPE_CHECKING:
    from workers.pipelines import LoadedModel


class Interrupted(Exception):
    """Every job of the call asked it to stop (lease lost, canceled, shutting down)."""


@dataclass(frozen=True)
class Generation:
    """One job's part of a call."""

    images: list[Any]  # PIL images; for a video kind, one clip: an array (F, H, W, 3)
    # Per image: True where the model's safety checker blacked it out.
    nsfw: list[bool]
    # The scheduler the call ran with (its class and configuration go in the manifest).
    scheduler: Any = None
    # The step it resumed from (a checkpoint's), or None: it ran from the first step.
    resumed_from: int | None = None
    # Its quality tier and what the call applied of it (workers/tiers.py).
    quality: dict[str, Any] | None = None


class ResumeRefused(Exception):
    """The checkpoint's state does not fit the call (found at its boundary step)."""


class Checkpointing(Protocol):
    """A single job's checkpoints (workers/checkpoints.py): where the call resumes from,
    and when it saves its state."""

    resume: denoise_state.DenoiseState | None

    def due(self, step: int, total: int) -> bool:
        """Whether to save the state after this step (its interval has passed)."""

    def save(self, state: denoise_state.DenoiseState, *, leaving: bool) -> None:
        """Store it; `leaving`: the job leaves the call now (handed back), so wait."""

    def refused(self, reason: str) -> None:
        """The resume state did not fit the call: it runs from the first step."""

    def resumed(self, step: int) -> None:
        """The call goes on from the resume state's step."""


def job_scheduler(model: LoadedModel, name: str) -> Any:
    """A new scheduler of the requested kind, configured from the model's own: a copy of
    one built once per model and name (`from_config` validates the whole configuration
    each time, 0.5-2 ms a call; a copy is 0.1 ms)."""
    import copy

    import diffusers

    template = model.schedulers.get(name)
    if template is None:
        own = model.scheduler
        chosen = SCHEDULERS[name]  # app/rules.py: the names a request may give
        if chosen.class_name is None:
            template = type(own).from_config(own.config)
        else:
            cls = getattr(diffusers, chosen.class_name)
            template = cls.from_config(own.config, **chosen.options)
        model.schedulers[name] = template
    return copy.deepcopy(template)


def _ready(model: LoadedModel, kind: JobKind, job: JobRequest, addons: Mapping) -> tuple[Any, bool]:
    """The kind's pipeline for a call with `job`'s add-ons, each made ready by its worker
    half (app/addons): LoRA's adapters active in the model's pipeline, the pipeline
    derived with ControlNet's modules; and whether an add-on derived it (its modules feed
    the denoiser inputs a compiled denoiser was not warmed with)."""
    key: tuple[str, ...] = ()
    keywords: dict[str, Any] = {}
    for name, addon in ADDONS.items():
        items, worker = getattr(job, name), addon.worker_half()
        fetched = addons.get(name) or {}
        worker.before_call(model, items, fetched)
        key += worker.pipeline_key(items)
        keywords.update(worker.derive(items, fetched))
    return kind_pipeline(model, kind, key, keywords), bool(key)


def kind_pipeline(
    model: LoadedModel,
    kind: JobKind,
    key: tuple[str, ...] = (),
    keywords: Mapping[str, Any] | None = None,
) -> Any:
    """The kind's pipeline on the model's weights, derived once per model, and per what
    add-ons derive it with (`key`: the ControlNets' names in the controls' order, one
    named twice counted twice; `keywords`: `from_pipe`'s, app/addons)."""
    if not key:
        pipeline = model.kind_pipelines.get(kind.name)
        if pipeline is None:
            pipeline = model.kind_pipelines[kind.name] = _derive(
                model.pipeline, kind.pipeline_for(model.spec.family)
            )
        return pipeline
    pipeline = model.kind_pipelines.get((kind.name, *key))
    if pipeline is None:
        pipeline = model.kind_pipelines[(kind.name, *key)] = _derive(
            model.pipeline, kind.pipeline_for(model.spec.family), keywords or {}
        )
    return pipeline


def _derive(base: Any, auto_class: str, keywords: Mapping[str, Any] | None = None) -> Any:
    import diffusers

    if not isinstance(base, diffusers.DiffusionPipeline):
        return base  # a stand-in for benchmarks and tests (workers/synthetic.py)
    derived = getattr(diffusers, auto_class).from_pipe(base, **(keywords or {}))
    if type(derived) is type(base) and not keywords:
        return base  # the loaded pipeline is already this kind's
    derived.set_progress_bar_config(disable=True)
    return derived


# Keywords a kind passes that only some of its pipelines take: LTX-Video's `frame_rate`;
# FLUX's ControlNet pipelines' `control_mode` (several plain ControlNets need one each,
# None); `negative_prompt`, which FLUX's ControlNet image-to-image and inpainting
# pipelines lack (a FLUX model ignores one anyway at diffq's true_cfg_scale of 1).
OPTIONAL_KEYWORDS = ("frame_rate", "control_mode", "negative_prompt")


def _fitted(pipeline: Any, arguments: dict[str, Any], job: JobRequest) -> dict[str, Any]:
    """The kind's keywords as this pipeline takes them: the job's output size where the
    kind left it out (image to image: the input's size is the output's; FLUX's
    image-to-image would make its default 1024² instead); the control images of a text
    to image job as `control_image` where the pipeline has no `image` (FLUX's; SD's
    text-to-image ControlNet pipelines name them `image`); the optional keywords it does
    not take left out."""
    import inspect

    accepted = inspect.signature(pipeline.__call__).parameters
    arguments = {k: v for k, v in arguments.items() if k not in OPTIONAL_KEYWORDS or k in accepted}
    if "image" in arguments and "image" not in accepted and "control_image" in accepted:
        arguments["control_image"] = arguments.pop("image")
    if "width" in accepted and "height" in accepted and "width" not in arguments:
        return {**arguments, "width": job.width, "height": job.height}
    return arguments


def generate(
    model: LoadedModel,
    jobs: Sequence[JobRequest],
    *,
    on_step: Sequence[Callable[[int, int], bool]],
    inputs: Sequence[Mapping[str, Any]] | None = None,
    addons: Mapping[str, Mapping[str, Any]] | None = None,
    checkpoints: Checkpointing | None = None,
) -> list[Generation | None]:
    """One Generation per job, in order; None for a job that left the call. `inputs`:
    each job's input images (PIL, by field: workers/inputs.py), for the kinds that start
    from one; the kind prepares them for the call and finishes its images with them.
    `addons`: what each add-on's worker half fetched for the jobs, by the add-on's field
    (app/addons: the LoRA adapters' tensors by digest, the ControlNets' modules by
    name); the jobs share one set of each (batch fields), made ready for this call alone.
    `checkpoints`: a single job's; the call saves its state at step boundaries when they
    say so, and resumes from theirs (workers/denoise_state.py).

    Raises Interrupted when every job has left (nothing is decoded).
    """
    try:
        return _call(model, jobs, on_step, inputs, addons or {}, checkpoints)
    except ResumeRefused as exc:  # the saved state did not fit this call: run it afresh
        checkpoints.refused(str(exc))
        return _call(model, jobs, on_step, inputs, addons or {}, checkpoints)


def _call(model, jobs, on_step, inputs, addons, checkpoints) -> list[Generation | None]:
    import torch

    if checkpoints is not None and len(jobs) > 1:
        raise ValueError("checkpoints are a single job's")

    kind = kind_of(jobs[0])
    try:
        tier = model.spec.tier(jobs[0].quality)
    except KeyError:
        raise ValueError(
            f"model {model.spec.name!r} does not offer the quality tier {jobs[0].quality!r} "
            f"(its catalog entry offers {', '.join(model.spec.quality)})"
        ) from None
    key = kind.batch_key(jobs[0])
    if any(kind_of(job) is not kind or kind.batch_key(job) != key for job in jobs[1:]):
        raise ValueError(f"jobs in one call must share {', '.join(kind.batch_fields)}")
    owner = [index for index, job in enumerate(jobs) for _ in range(job.num_images)]
    generators = [
        torch.Generator(device=model.device).manual_seed(job.image_seed(i))
        for job in jobs
        for i in range(job.num_images)
    ]
    active = [True] * len(jobs)
    discarded: set[int] = set()  # left where rows cannot be cut: run on, not kept
    prepared = [
        kind.prepared(job, job_inputs)
        for job, job_inputs in zip(jobs, inputs or [{}] * len(jobs), strict=True)
    ]

    with model.lock:
        pipeline, derived = _ready(model, kind, jobs[0], addons)
        scheduler = pipeline.scheduler = job_scheduler(model, jobs[0].scheduler)
        tiered = TierCall(pipeline, tier, model.spec.family)
        # Compiled where the warm-up compiled it: not with a step cache's hooks on the
        # blocks, nor a ControlNet's residuals among the denoiser's inputs.
        compiled_ok = tiered.compiled_ok and not derived
        stance = running(model, jobs[0].width, jobs[0].height, compiled_ok)
        cuttable = row_inputs(pipeline)
        resume = _resumable(checkpoints)
        skipping = _skip_denoiser(pipeline) if resume is not None else None
        resumed_from: list[int] = []

        def callback(pipe, step_index, _timestep, callback_kwargs):
            nonlocal skipping
            total = pipe.num_timesteps
            step = step_index + 1
            if skipping is not None and step == resume.step:
                skipping()  # the real denoiser back
                skipping = None
                if resume.total != total:
                    raise ResumeRefused(f"it was made for {resume.total} steps, not {total}")
                try:
                    callback_kwargs["latents"] = denoise_state.restore(
                        resume, callback_kwargs["latents"], pipe.scheduler, generators
                    )
                except denoise_state.StateError as exc:
                    raise ResumeRefused(str(exc)) from exc
                resumed_from.append(step)
                checkpoints.resumed(step)
            callback_kwargs = tiered.step(pipe, step, total, callback_kwargs, len(owner))
            leaving = []
            for index, still in enumerate(active):
                if still and not on_step[index](step_index + 1, total):
                    active[index] = False
                    leaving.append(index)
            saving = checkpoints is not None and skipping is None and step < total
            if saving and (not active[0] or checkpoints.due(step, total)):
                state = denoise_state.capture(
                    step, total, callback_kwargs["latents"], pipe.scheduler, generators
                )
                checkpoints.save(state, leaving=not active[0])
            if not any(active):
                raise Interrupted()  # nobody is left: no further step, no decode
            if not leaving:
                return callback_kwargs
            if cuttable is None:
                discarded.update(leaving)
                return callback_kwargs
            rows = len(owner)
            keep = [r for r, job in enumerate(owner) if active[job]]
            shape = tuple(callback_kwargs["latents"].shape)
            out = {name: cut_rows(value, keep, rows) for name, value in callback_kwargs.items()}
            cut_scheduler(pipe.scheduler, keep, rows, shape)
            # The pipeline holds this very list (scheduler.step's generator): cut it in place.
            generators[:] = [generators[r] for r in keep]
            owner[:] = [owner[r] for r in keep]
            return out

        try:
            encoded = conditioning.CACHE.around(
                pipeline, f"{model.digest}:{model.spec.name}", (jobs[0].adapter_set,)
            )
            graphs = _graphs() if model.compiled else 0
            with stance, torch.inference_mode(), tiered, encoded:
                output = pipeline(
                    **_fitted(pipeline, kind.call_arguments(jobs, prepared), jobs[0]),
                    generator=generators if len(generators) > 1 else generators[0],
                    callback_on_step_end=callback,
                    callback_on_step_end_tensor_inputs=tiered.tensor_inputs(
                        cuttable or ["latents"]
                    ),
                )
            if model.compiled:  # a model with a compiled denoiser: what the call traced
                COMPILED_GRAPHS.labels(model.spec.name).inc(_graphs() - graphs)
            if resume is not None and not resumed_from:  # its step never came
                raise ResumeRefused(f"the call ended before step {resume.step}")
        finally:
            if skipping is not None:
                skipping()
            pipeline.scheduler = model.scheduler  # between calls, the model's own
    images = kind.outputs(output)  # per row: an image, or a clip's frames
    flagged = getattr(output, "nsfw_content_detected", None) or [False] * len(images)
    results: list[Generation | None] = []
    for index in range(len(jobs)):
        if not active[index] or index in discarded:
            results.append(None)
            continue
        rows = [r for r, job in enumerate(owner) if job == index]
        made = kind.finish(jobs[index], [images[r] for r in rows], prepared[index])
        nsfw = [bool(flagged[r]) for r in rows]
        resumed = (resumed_from or [None])[0]
        results.append(Generation(made, nsfw, scheduler, resumed, tiered.applied()))
    return results


def _graphs() -> int:
    """Graphs dynamo has traced in this process."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _resumable(checkpoints: Checkpointing | None) -> denoise_state.DenoiseState | None:
    """The state to resume from, if there is one past the first step."""
    state = checkpoints.resume if checkpoints is not None else None
    if state is not None and not 1 <= state.step < state.total:
        checkpoints.refused(f"it holds step {state.step} of {state.total}")
        return None
    return state


def _skip_denoiser(pipeline: Any) -> Callable[[], None]:
    """Put a SkippedDenoiser in the pipeline; returns what puts the real one back."""
    name = denoiser_name(pipeline)
    real = getattr(pipeline, name)
    setattr(pipeline, name, denoise_state.SkippedDenoiser(real))
    return lambda: setattr(pipeline, name, real)
