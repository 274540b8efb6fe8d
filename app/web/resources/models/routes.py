"""Model routes: the catalog, and an estimate of a job's time before it is submitted."""

from __future__ import annotations

from flask.views import MethodView
from flask_smorest import Blueprint, abort

from app.catalog import ModelSpec
from app.jobs.estimate import estimate
from app.rules import model_limit_errors
from app.web.auth import require_api_key
from app.web.resources.models.schemas import (
    LIMIT_FIELDS,
    EstimateQuerySchema,
    EstimateSchema,
    ModelListSchema,
)
from app.web.services import request_session, services

blp = Blueprint(
    "models", __name__, url_prefix="/v1/models", description="The models a job may name."
)
blp.before_request(require_api_key)


def _view(spec: ModelSpec, default: str) -> dict:
    return {
        "name": spec.name,
        "default": spec.name == default,
        "limits": {name: getattr(spec, name) for name in LIMIT_FIELDS},
        "schedulers": list(spec.schedulers),
        "sizes": list(spec.sizes),
        "sizes_required": spec.sizes_required,
    }


@blp.route("")
class Models(MethodView):
    @blp.response(200, ModelListSchema)
    @blp.alt_response(401, description="No or bad API key.")
    def get(self):
        """List the models and their limits"""
        catalog = services().catalog
        return {
            "data": [_view(spec, catalog.default_model) for spec in catalog.models.values()],
            "default_model": catalog.default_model,
        }


@blp.route("/<string:name>/estimate")
class ModelEstimate(MethodView):
    @blp.arguments(EstimateQuerySchema, location="query")
    @blp.response(200, EstimateSchema)
    @blp.alt_response(401, description="No or bad API key.")
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
        errors = model_limit_errors(spec, args)
        if errors:
            abort(422, errors={"query": errors})
        params = {
            "width": args.get("width", spec.default_width),
            "height": args.get("height", spec.default_height),
            "steps": args.get("steps", spec.default_steps),
            "num_images": args.get("num_images", 1),
        }
        found = estimate(request_session(), spec.name, spec.queue, params)
        return {
            "model": spec.name,
            "run_seconds": found.run_seconds,
            "queue_seconds": found.queue_seconds,
            "queued": found.queued,
            "running": found.running,
            "samples": found.samples,
        }
