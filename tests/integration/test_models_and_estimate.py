"""GET /v1/models (the catalog's limits) and the estimate of a job's time before submit."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from app.db.types import utcnow
from app.jobs.estimate import estimate, work
from app.jobs.states import JobStatus, Priority
from testbed.factories import job_request
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
        assert model["kinds"] == list(spec.kinds)
        assert "path" not in model and "queue" not in model
    kinds = {model["name"]: model["kinds"] for model in body["data"]}
    assert kinds["tiny"] == ["txt2img", "img2img", "inpaint"] and kinds["tiny-b"] == ["txt2img"]
    assert kinds["tiny-video"] == ["txt2vid", "img2vid"]
    adapters = {
        m["name"]: (m["lora_family"], m["max_loras"], m["shared_adapters"]) for m in body["data"]
    }
    assert adapters == {
        "tiny": ("tiny", 2, ["ink"]),
        "tiny-b": (None, 0, []),
        "tiny-video": (None, 0, []),
    }
    quality = {m["name"]: m["quality"] for m in body["data"]}
    assert quality["tiny"]["tiers"] == {
        "exact": {},
        "balanced": {"guidance_until": 0.8},
        "fast": {"guidance_until": 0.5},
    }
    assert quality["tiny-b"] == {
        "default": "exact",
        "tiers": {"exact": {}, "fast": {"guidance_until": 0.75}},
        "psnr": {"fast": 41.5},  # as its catalog table declares it
    }
    refused = client.post(
        "/v1/jobs",
        json={"prompt": "x", "model": "tiny-b", "quality": "balanced"},
        headers=auth(tenant_key),
    )
    assert refused.status_code == 422
    assert refused.json["errors"]["json"]["quality"] == [
        "Must be one of: exact, fast (the tiers model 'tiny-b' offers)."
    ]
    video = {m["name"]: m["video"] for m in body["data"]}
    assert video["tiny"] is None
    assert video["tiny-video"] == {
        "fps": 24,
        "max_fps": 60,
        "default_frames": 9,
        "max_frames": 25,
        "frame_step": 8,
    }


def test_a_clip_is_estimated_by_its_frames(client, tenant_key):
    def estimate(**query):
        response = client.get(
            "/v1/models/tiny-video/estimate", query_string=query, headers=auth(tenant_key)
        )
        assert response.status_code == 200, response.json
        return response.json

    assert estimate(kind="txt2vid", num_frames=9)["model"] == "tiny-video"
    refused = client.get(
        "/v1/models/tiny-video/estimate",
        query_string={"kind": "txt2vid", "num_frames": 10},
        headers=auth(tenant_key),
    )
    assert refused.status_code == 422 and "num_frames" in refused.json["errors"]["query"]
    foreign = client.get(
        "/v1/models/tiny/estimate", query_string={"num_frames": 9}, headers=auth(tenant_key)
    )
    assert foreign.status_code == 422 and "num_frames" in foreign.json["errors"]["query"]


@pytest.mark.parametrize(
    ("query", "field", "fragment"),
    [
        ("width=100", "width", "multiple of 8"),
        ("steps=11", "steps", "between 1 and 10"),
        ("num_images=3", "num_images", "between 1 and 2"),
        ("width=128&height=128", "width", "8192"),
        ("steps=x", "steps", "integer"),
        ("loras=1", "loras", "At most 0 adapters"),
        ("controls=1", "controls", "At most 0 controls"),
        ("controls=-1", "controls", "greater than or equal to 0"),
    ],
)
def test_an_estimate_breaking_a_limit_is_a_422_naming_the_field(
    client, tenant_key, query, field, fragment
):
    response = client.get(f"/v1/models/tiny-b/estimate?{query}", headers=auth(tenant_key))
    assert response.status_code == 422
    assert fragment in " ".join(response.json["errors"]["query"][field])


def test_an_estimate_counts_the_jobs_adapters(client, tenant_key):
    plain = client.get("/v1/models/tiny/estimate", headers=auth(tenant_key))
    two = client.get("/v1/models/tiny/estimate?loras=2", headers=auth(tenant_key))
    assert plain.status_code == two.status_code == 200, two.json  # the work: tests/unit
    three = client.get("/v1/models/tiny/estimate?loras=3", headers=auth(tenant_key))
    assert three.status_code == 422 and "loras" in three.json["errors"]["query"]


def test_an_estimate_counts_the_jobs_controls_up_to_the_kinds_limit(client, tenant_key):
    two = client.get("/v1/models/tiny/estimate?controls=2", headers=auth(tenant_key))
    assert two.status_code == 200, two.json  # each control's work: tests/unit/test_addons.py
    three = client.get("/v1/models/tiny/estimate?controls=3", headers=auth(tenant_key))
    assert three.status_code == 422
    assert three.json["errors"]["query"]["controls"] == [
        "At most 2 controls for model 'tiny' (txt2img)."
    ]
    clip = client.get(
        "/v1/models/tiny-video/estimate?kind=txt2vid&controls=1", headers=auth(tenant_key)
    )
    assert clip.status_code == 422 and "(txt2vid)" in clip.json["errors"]["query"]["controls"][0]


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
    assert set(body) == {
        "model",
        "run_seconds",
        "queue_seconds",
        "queued",
        "running",
        "samples",
        "paused",
    }
    assert body["paused"] is False


def test_work_grows_with_pixels_steps_and_images():
    base = job_request(width=512, height=512, steps=1, num_images=1)
    assert base.work == 1.0 == work(base.stored())
    assert job_request(width=1024, height=512, steps=3, num_images=2).work == 12.0


def _job(session, tenant_id, model, status, request, *, ran=None, progress=None):
    from app.jobs import service

    job = service.create_job(
        session,
        tenant_id,
        model=model,
        queue=f"gpu.{model}",
        priority=Priority.NORMAL,
        request=request,
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


def test_the_estimate_fits_size_and_charges_the_queue(db, tenant_key, monkeypatch):
    from app.keys import get_or_create_tenant

    model = f"est-{uuid.uuid4().hex[:8]}"  # a model of its own: no other test's jobs
    with db.session() as session:
        tenant = get_or_create_tenant(session, model)
        asked = job_request(model=model, width=64)
        assert estimate(session, model, f"gpu.{model}", asked).run_seconds is None
        # Finished jobs that took exactly 1 s + 2 s per unit (a 512 x 512 step).
        for side, steps in ((64, 4), (128, 4), (256, 8), (512, 8)):
            done = job_request(model=model, width=side, height=side, steps=steps)
            _job(session, tenant.id, model, JobStatus.SUCCEEDED, done, ran=1 + 2 * done.work)
        for _ in range(2):  # 5 s each
            waiting = job_request(model=model, width=256, height=256, steps=8)
            _job(session, tenant.id, model, JobStatus.QUEUED, waiting)
        # Running for 1 s, 2 of 8 steps done: 3 s left at its own pace.
        progress = {"stage": "denoising", "step": 2, "total_steps": 8}
        running = job_request(model=model, steps=8)
        _job(session, tenant.id, model, JobStatus.RUNNING, running, progress=progress)
        session.commit()
        asked = job_request(model=model, width=512, height=512, steps=8)
        found = estimate(session, model, f"gpu.{model}", asked)
    print(f"estimate: {found}")
    assert found.samples == 4 and found.queued == 2 and found.running == 1
    assert found.run_seconds == pytest.approx(17.0, abs=0.1)
    assert found.queue_seconds == pytest.approx(13.0, abs=0.3)
    # A tier doing 3/4 of the work: 1 s + 2 s x 8 x 0.75. Both asked at one instant (the
    # running job's time left moves with the clock), the queue is priced alike.
    from app.jobs import estimate as estimating

    instant = estimating.utcnow()
    monkeypatch.setattr(estimating, "utcnow", lambda: instant)
    with db.session() as session:
        full = estimate(session, model, f"gpu.{model}", asked)
        cheaper = estimate(session, model, f"gpu.{model}", asked, share=0.75)
    assert cheaper.run_seconds == pytest.approx(13.0, abs=0.1)
    assert full.run_seconds == pytest.approx(17.0, abs=0.1)
    assert cheaper.queue_seconds == full.queue_seconds  # the queue's jobs are as they were


def test_an_image_jobs_estimate_counts_the_steps_its_strength_leaves(client, tenant_key):
    """img2img and inpaint are estimated at their output's size and int(steps x strength)
    steps; a strength that leaves no step, or one on a kind without it, is a 422."""
    base = "/v1/models/tiny/estimate?width=64&height=64&steps=8"
    for query in ("&kind=img2img&strength=0.5", "&kind=inpaint", "&kind=img2img"):
        answer = client.get(base + query, headers=auth(tenant_key))
        assert answer.status_code == 200, (query, answer.json)
    for query, field in (
        ("&kind=img2img&strength=0.05", "strength"),
        ("&kind=img2img&strength=0", "strength"),  # none at any step count: was a 500
        ("&strength=0.5", "strength"),  # txt2img has none
        ("&kind=img2img", "kind"),  # on tiny-b, which offers txt2img only
    ):
        path = base.replace("/tiny/", "/tiny-b/") if field == "kind" else base
        answer = client.get(path + query, headers=auth(tenant_key))
        assert answer.status_code == 422 and field in answer.json["errors"]["query"], query


def test_an_estimate_counts_the_share_of_the_work_its_tier_does(client, tenant_key, monkeypatch):
    """tiny-b's `fast` cuts guidance after 0.75 of the steps: (1 + 0.75) / 2 of the work at
    its default guidance, all of it unguided (nothing to cut) or at `exact`; a tier it does
    not offer is a 422 naming `quality`, as a job's is."""
    from app.web.resources.models import routes

    shares = []

    def seen(session, model, queue, request, share=1.0):
        shares.append(share)
        return estimate(session, model, queue, request, share)

    monkeypatch.setattr(routes, "estimate", seen)
    base = "/v1/models/tiny-b/estimate?steps=8"
    for query in ("", "&quality=exact", "&quality=fast", "&quality=fast&guidance_scale=1"):
        answer = client.get(base + query, headers=auth(tenant_key))
        assert answer.status_code == 200, (query, answer.json)
    assert shares == [1.0, 1.0, pytest.approx(0.875), 1.0]
    for query in ("&quality=balanced", "&quality=best"):
        answer = client.get(base + query, headers=auth(tenant_key))
        assert answer.status_code == 422 and "quality" in answer.json["errors"]["query"], query
