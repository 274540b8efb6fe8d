"""Model routes: the catalog, and an estimate of a job's time before it is submitted."""

from __future__ import annotations

from flask import g
from flask.views import MethodView
from flask_smorest import abort

from app.addons import ADDONS
from app.catalog import ModelSpec
from app.jobs import pauses
from app.jobs.estimate import estimate
from app.kinds import KINDS
from app.kinds.images import InputRef
from app.rules import model_limit_errors
from app.web.auth import operator_only, require_api_key
from app.web.bodies import Blueprint
from app.web.openapi import answers
from app.web.resources.models.schemas import (
    LIMIT_FIELDS,
    EstimateQuerySchema,
    EstimateSchema,
    ModelListSchema,
    PauseRequestSchema,
    PauseSchema,
)
from app.web.services import request_session, services

blp = Blueprint(
    "models", __name__, url_prefix="/v1/models", description="The models a job may name."
)
blp.before_request(require_api_key)


def _view(spec: ModelSpec, default: str, paused: dict[str, pauses.Pause]) -> dict:
    pause = paused.get(spec.name)
    return {
        "name": spec.name,
        "default": spec.name == default,
        "limits": {name: getattr(spec, name) for name in LIMIT_FIELDS},
        "family": spec.family,
        "quantize": spec.quantize or None,
        "preset": spec.preset,
        "schedulers": list(spec.schedulers),
        "sizes": list(spec.sizes),
        "sizes_required": spec.sizes_required,
        "kinds": list(spec.kinds),
        "video": {
            "fps": spec.fps,
            "max_fps": spec.max_fps,
            "default_frames": spec.default_frames,
            "max_frames": spec.max_frames,
            "frame_step": spec.frame_step,
        }
        if spec.video
        else None,
        "lora_family": spec.lora_family or None,
        "max_loras": spec.lora_limit,
        "shared_adapters": sorted(
            a.name for a in services().catalog.adapters.values() if a.family == spec.lora_family
        )
        if spec.lora_limit
        else [],
        "max_controls": spec.control_limit,
        "controlnets": sorted(
            c.name for c in services().catalog.controlnets.values() if c.family == spec.lora_family
        )
        if spec.control_limit
        else [],
        "quality": {
            "default": spec.default_quality,
            "tiers": {tier.name: tier.settings() for tier in spec.tiers},
            "psnr": {t.name: t.psnr for t in spec.tiers if t.psnr is not None},
        },
        "paused": pause.as_dict() if pause else None,
    }


@blp.route("")
class Models(MethodView):
    @blp.response(200, ModelListSchema)
    def get(self):
        """List the models and their limits

        Every model of the catalog: its limits (sizes, steps, images, prompt length), family
        and preset, schedulers, job kinds, video rules, add-ons (`lora_family`, shared
        adapters, ControlNets, how many a job may name) and whether an operator paused it.
        The model a request without `model` runs on is marked `default`.
        """
        catalog = services().catalog
        paused = pauses.paused(request_session())
        return {
            "data": [
                _view(spec, catalog.default_model, paused) for spec in catalog.models.values()
            ],
            "default_model": catalog.default_model,
        }


@blp.route("/<string:name>/estimate")
class ModelEstimate(MethodView):
    @blp.arguments(EstimateQuerySchema, location="query")
    @blp.response(200, EstimateSchema)
    @blp.alt_response(404, description="No such model.")
    def get(self, args, name: str):
        """Estimate a job's time before submitting it

        The same size, steps and image count as a job would carry, checked against the
        model's limits as a job is (a 422 names the field). An estimate, not a promise:
        it follows the model's recent successes and what its queue holds now.
        """
        spec = services().catalog.models.get(name)
        if spec is None:
            abort(404, message="No such model.")
        kind = KINDS[args.pop("kind")]
        if kind.name not in spec.kinds:
            offered = ", ".join(spec.kinds)
            abort(422, errors={"query": {"kind": [f"Model '{name}' offers: {offered}."]}})
        for own in ("strength", "num_frames", "fps"):
            if own in args and own not in kind.api_fields():
                abort(422, errors={"query": {own: [f"Not a field of kind '{kind.name}'."]}})
        # The job's request as a submit would normalize it: its prompt does not count,
        # and its input images only by their size (the output's).
        width = args.get("width", spec.default_width)
        height = args.get("height", spec.default_height)
        data = {**args, "prompt": "", "width": width, "height": height}
        data.update({field: InputRef("", width, height, "RGB") for field in kind.image_fields})
        # Add-ons count by number only (each adds its `work`: app/addons).
        counts = {name: data.pop(name, 0) for name in ADDONS}
        errors = model_limit_errors(spec, data)
        for field, messages in kind.limit_errors(spec, data).items():
            errors.setdefault(field, []).extend(messages)
        for name, addon in ADDONS.items():
            if refused := addon.too_many(spec, kind, counts[name]):
                errors[name] = refused
        if errors:
            abort(422, errors={"query": errors})
        data.update({name: addon.placeholders(counts[name]) for name, addon in ADDONS.items()})
        request = kind.normalize(spec, data)
        share = spec.tier(request.quality).work_share(request.guidance_scale > 1)
        found = estimate(request_session(), spec.name, spec.queue, request, share)
        paused = pauses.is_paused(request_session(), spec.name)
        return {
            "model": spec.name,
            "run_seconds": found.run_seconds,
            "queue_seconds": None if paused else found.queue_seconds,
            "paused": paused,
            "queued": found.queued,
            "running": found.running,
            "samples": found.samples,
        }


def _refused(exc: pauses.PauseRefused):
    abort(404 if exc.unknown else 409, message=str(exc))


@blp.route("/<string:name>/pause")
class ModelPaused(MethodView):
    @operator_only
    @blp.arguments(PauseRequestSchema)
    @blp.response(200, PauseSchema)
    @answers(
        blp,
        """
        403 Not an operator's key.
        404 No such model.
        409 Its queue also serves a model left running.
        """,
    )
    def put(self, args, name: str):
        """Pause a model (operators)

        Its workers stop taking its jobs within a second; its queued jobs wait in their
        places (their ETAs are null) and nothing is lost. Its running jobs finish, or, with
        `now`, the ones that checkpoint go back to the queue at their next step and resume
        from it once the model is resumed. Pausing a paused model updates its reason (and
        `now`). Needs an operator's key. A model whose queue also serves another model is
        paused together with it (`diffq queue pause A B`): 409 names them.
        """
        session = request_session()
        try:
            (found,) = pauses.pause(
                session,
                services().catalog,
                [name],
                now=args["now"],
                reason=args.get("reason"),
                by=f"key {g.key_id}",
            )
        except pauses.PauseRefused as exc:
            _refused(exc)
        session.commit()
        return found.as_dict()

    @operator_only
    @blp.response(204)
    @answers(
        blp,
        """
        403 Not an operator's key.
        404 No such model.
        409 Its queue also serves a model still paused.
        """,
    )
    def delete(self, name: str):
        """Resume a paused model (operators)

        Its workers take its jobs again within a second, in the order they would have
        run. Resuming a model that is not paused does nothing. Needs an operator's key.
        """
        session = request_session()
        try:
            pauses.resume(session, services().catalog, [name])
        except pauses.PauseRefused as exc:
            _refused(exc)
        session.commit()
