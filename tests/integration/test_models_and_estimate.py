"""GET /v1/models (the catalog's limits) and the estimate of a job's time before submit."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from app.db.types import utcnow
from app.jobs.estimate import estimate, work
from app.jobs.states import JobStatus, Priority
from testbed.jobs import auth

pytestmark = pytest.mark.services


def test_models_list_every_model_with_its_limits(client, tenant_key, flask_app):
    assert client.get("/v1/models").status_code == 401
    body = client.get("/v1/models", headers=auth(tenant_key)).json
    catalog = flask_app.extensions["diffq"].catalog
    assert [m["name"] for m in body["data"]] == list(catalog.models)
    assert body["default_model"] == catalog.default_model
    for model in body["data"]:
        spec = catalog.models[model["name"]]
        assert model["default"] == (spec.name == catalog.default_model)
        assert model["limits"]["max_pixels"] == spec.max_pixels
        assert model["limits"]["max_steps"] == spec.max_steps
        assert model["schedulers"] == list(spec.schedulers)
        assert model["sizes"] == list(spec.sizes)
        assert model["sizes_required"] is spec.sizes_required
        assert "path" not in model and "queue" not in model


@pytest.mark.parametrize(
    ("query", "field", "fragment"),
    [
        ("width=100", "width", "multiple of 8"),
        ("steps=11", "steps", "between 1 and 10"),
        ("num_images=3", "num_images", "between 1 and 2"),
        ("width=128&height=128", "width", "8192"),
        ("steps=x", "steps", "integer"),
    ],
)
def test_an_estimate_breaking_a_limit_is_a_422_naming_the_field(
    client, tenant_key, query, field, fragment
):
    response = client.get(f"/v1/models/tiny-b/estimate?{query}", headers=auth(tenant_key))
    assert response.status_code == 422
    assert fragment in " ".join(response.json["errors"]["query"][field])


def test_an_estimate_for_an_unknown_model_is_a_404(client, tenant_key):
    response = client.get("/v1/models/nope/estimate", headers=auth(tenant_key))
    assert response.status_code == 404


def test_a_valid_estimate_answers_with_the_models_figures(client, tenant_key):
    response = client.get(
        "/v1/models/tiny-b/estimate?width=64&height=64&steps=2", headers=auth(tenant_key)
    )
    assert response.status_code == 200, response.json
    body = response.json
    assert body["model"] == "tiny-b"
    assert set(body) == {"model", "run_seconds", "queue_seconds", "queued", "running", "samples"}


def test_work_grows_with_pixels_steps_and_images():
    base = work({"width": 512, "height": 512, "steps": 1, "num_images": 1})
    assert base == 1.0
    assert work({"width": 1024, "height": 512, "steps": 3, "num_images": 2}) == 12.0


def _job(session, tenant_id, model, status, params, *, ran=None, progress=None):
    from app.jobs import service

    job = service.create_job(
        session,
        tenant_id,
        model=model,
        queue=f"gpu.{model}",
        priority=Priority.NORMAL,
        params={"num_images": 1, **params},
        metadata=None,
    )
    job.status = status
    now = utcnow()
    if ran is not None:
        job.started_at = now - timedelta(seconds=ran + 60)
        job.finished_at = job.started_at + timedelta(seconds=ran)
    if status == JobStatus.RUNNING:
        job.started_at = now - timedelta(seconds=1)
        job.progress = progress
    return job


def test_the_estimate_fits_size_and_charges_the_queue(db, tenant_key):
    from app.keys import get_or_create_tenant

    model = f"est-{uuid.uuid4().hex[:8]}"  # a model of its own: no other test's jobs
    with db.session() as session:
        tenant = get_or_create_tenant(session, model)
        assert estimate(session, model, f"gpu.{model}", {"width": 64}).run_seconds is None
        # Finished jobs that took exactly 1 s + 2 s per unit (a 512 x 512 step).
        for side, steps in ((64, 4), (128, 4), (256, 8), (512, 8)):
            params = {"width": side, "height": side, "steps": steps}
            _job(session, tenant.id, model, JobStatus.SUCCEEDED, params, ran=1 + 2 * work(params))
        for _ in range(2):  # 5 s each
            _job(
                session,
                tenant.id,
                model,
                JobStatus.QUEUED,
                {"width": 256, "height": 256, "steps": 8},
            )
        # Running for 1 s, 2 of 8 steps done: 3 s left at its own pace.
        progress = {"stage": "denoising", "step": 2, "total_steps": 8}
        _job(session, tenant.id, model, JobStatus.RUNNING, {"steps": 8}, progress=progress)
        session.commit()
        found = estimate(session, model, f"gpu.{model}", {"width": 512, "height": 512, "steps": 8})
    print(f"estimate: {found}")
    assert found.samples == 4 and found.queued == 2 and found.running == 1
    assert found.run_seconds == pytest.approx(17.0, abs=0.1)
    assert found.queue_seconds == pytest.approx(13.0, abs=0.3)
