"""Probes that mean what they say, the GPU-seconds backlog, and high-priority routing."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta

import pytest

from app.catalog import Catalog, ModelSpec
from app.config import load_settings
from app.jobs import service
from app.jobs.states import JobStatus, Priority
from testbed.factories import job_request

pytestmark = pytest.mark.services


def _app(**env):
    import os

    from app.web.factory import create_app

    return create_app(load_settings({**os.environ, **env}))


def test_readyz_gates_on_the_database_not_the_broker(stack):
    # A broker nobody listens on: jobs are still accepted (the relay publishes them later).
    from tasks.celery_app import create_celery

    app = _app()
    app.extensions["diffq"].publisher.celery = create_celery(
        broker_url="amqp://guest:guest@127.0.0.1:1//"
    )
    ready = app.test_client().get("/readyz")
    print("readyz with the broker away:", ready.json)
    assert ready.status_code == 200, ready.json
    assert ready.json["checks"]["broker"].startswith("unavailable")
    assert ready.json["checks"]["database"] == ready.json["checks"]["schema"] == "ok"


def test_readyz_fails_without_the_database(stack):
    app = _app(DIFFQ_DATABASE_URL="postgresql+psycopg2://nobody:x@127.0.0.1:1/none")
    ready = app.test_client().get("/readyz")
    assert ready.status_code == 503, ready.json
    assert ready.json["checks"]["database"].startswith("unavailable")


def test_readyz_fails_while_the_schema_is_behind(stack):
    from app.db.migrate import upgrade
    from testbed import services

    name = f"diffq_behind_{uuid.uuid4().hex[:8]}"
    url = services.create_database(name)
    try:
        upgrade(url, "0003")
        app = _app(DIFFQ_DATABASE_URL=url)
        ready = app.test_client().get("/readyz")
        assert ready.status_code == 503, ready.json
        assert ready.json["checks"]["schema"] == "unavailable (SchemaBehind)"
        upgrade(url)
        assert app.test_client().get("/readyz").status_code == 200
        app.extensions["diffq"].db.dispose()
    finally:
        services.drop_database(name)


def test_readyz_is_ready_before_a_created_on_upload_bucket_exists(stack):
    missing = f"diffq-missing-{uuid.uuid4().hex[:8]}"
    created = _app(DIFFQ_STORAGE_URL=f"s3://{missing}", DIFFQ_S3_CREATE_BUCKET="true")
    body = created.test_client().get("/readyz").json
    assert body["status"] == "ready" and body["checks"]["storage"] == "ok", body
    # Without bucket creation the missing bucket is reported (and still does not gate).
    strict = _app(DIFFQ_STORAGE_URL=f"s3://{missing}", DIFFQ_S3_CREATE_BUCKET="false")
    body = strict.test_client().get("/readyz").json
    assert body["checks"]["storage"].startswith("unavailable"), body
    assert body["status"] == "ready"


def test_worker_liveness_fails_only_when_its_own_loop_stalls(monkeypatch):
    from workers import heartbeat

    heartbeat.beat()
    assert heartbeat.health()[0] == 200
    later = heartbeat._state["beat"] + heartbeat.STALE_SECONDS + 1
    status, body = heartbeat.health(now=later)
    assert status == 503 and body["state"] == "consuming", body
    # The broker went away: the consumer stopped its steps and is reconnecting.
    heartbeat.set_state("reconnecting")
    later = heartbeat._state["beat"] + 10 * heartbeat.STALE_SECONDS
    assert heartbeat.health(now=later) == (
        200,
        {
            "status": "ok",
            "state": "reconnecting",
            "last_beat_age": round(later - heartbeat._state["beat"], 1),
        },
    )


def _job(session, tenant_id, queue, model, steps, **fields):
    job = service.create_job(
        session,
        tenant_id,
        model=model,
        queue=queue,
        priority=Priority.NORMAL,
        request=job_request(model=model, prompt="p", steps=steps, seed=1),
        metadata=None,
    )
    for name, value in fields.items():
        setattr(job, name, value)
    return job


def test_backlog_counts_gpu_seconds_of_queued_jobs_only(db):
    from app.db.types import utcnow
    from app.gauges.backlog import FALLBACK_UNIT_SECONDS, backlog_seconds
    from app.keys import get_or_create_tenant

    run = uuid.uuid4().hex[:8]
    queue, model, fresh_queue = f"gpu.backlog-{run}", f"backlog-{run}", f"gpu.fresh-{run}"
    now = utcnow()
    with db.session() as session:
        tenant = get_or_create_tenant(session, f"backlog-{run}")
        # Two successes of different sizes: fixed 2 s + 0.5 s per step.
        for steps, seconds in ((10, 7.0), (20, 12.0)):
            _job(
                session,
                tenant.id,
                queue,
                model,
                steps,
                status=JobStatus.SUCCEEDED,
                started_at=now - timedelta(seconds=seconds + 1),
                finished_at=now - timedelta(seconds=1),
            )
        _job(session, tenant.id, queue, model, 8)  # counts: 2 + 4 = 6 s
        _job(session, tenant.id, queue, model, 4)  # counts: 2 + 2 = 4 s
        _job(session, tenant.id, queue, model, 50, status=JobStatus.CANCELED)
        _job(session, tenant.id, queue, model, 50, deadline_at=now - timedelta(seconds=1))
        _job(session, tenant.id, queue, model, 50, admitted_at=None)  # held by the tenant cap
        _job(session, tenant.id, queue, model, 50, status=JobStatus.RUNNING, started_at=now)
        _job(session, tenant.id, fresh_queue, f"fresh-{run}", 3)  # no history: the fallback
    backlog = backlog_seconds(db)
    print(f"backlog {queue}: {backlog.get(queue)} s, {fresh_queue}: {backlog.get(fresh_queue)} s")
    assert backlog[queue] == pytest.approx(10.0)
    # The fallback is a second per unit: a step of one 512 x 512 image (these are 64 x 64).
    assert backlog[fresh_queue] == pytest.approx(3 * FALLBACK_UNIT_SECONDS * 64 * 64 / 512**2)


def test_backlog_charges_each_queued_job_for_its_size(db):
    """A unit is one step of one 512 x 512 image: two 256 x 192 jobs queued behind a model
    that ran 64 x 64 and 256 x 192 jobs are charged as 256 x 192 jobs."""
    from app.db.types import utcnow
    from app.gauges.backlog import backlog_seconds
    from app.keys import get_or_create_tenant

    run = uuid.uuid4().hex[:8]
    queue, model = f"gpu.sized-{run}", f"sized-{run}"
    now = utcnow()
    with db.session() as session:
        tenant = get_or_create_tenant(session, f"sized-{run}")
        # 64 x 64 in 1 s and 256 x 192 in 4 s, 8 steps each: fixed 8/11 s, 24/11 s a unit.
        for (width, height), seconds in (((64, 64), 1.0), ((256, 192), 4.0)):
            job = _job(session, tenant.id, queue, model, 8, status=JobStatus.SUCCEEDED)
            job.input = {**job.input, "width": width, "height": height}
            job.started_at = now - timedelta(seconds=seconds + 1)
            job.finished_at = now - timedelta(seconds=1)
        for _ in range(2):
            job = _job(session, tenant.id, queue, model, 8)
            job.input = {**job.input, "width": 256, "height": 192}
    backlog = backlog_seconds(db)
    print(f"backlog of two 256x192 jobs: {backlog[queue]} s")
    assert backlog[queue] == pytest.approx(8.0)  # 4 s each, as the larger success took


def test_backlog_is_exported_on_the_api_metrics(flask_app, client):
    # On the metrics port (app/web/edge.py): the public port has no /metrics.
    port = flask_app.extensions["diffq"].settings.api_metrics_port
    assert client.get("/metrics").status_code == 404
    text = client.get("/metrics", base_url=f"http://localhost:{port}").get_data(as_text=True)
    assert 'diffq_queue_backlog_gpu_seconds{queue="gpu.tiny"}' in text


def test_high_priority_jobs_go_to_the_high_priority_queue(tmp_path):
    from workers.supervisor import queues_for

    spec = ModelSpec(
        name="sdxl", path=tmp_path, queue="gpu.sdxl", high_priority_queue="gpu.sdxl.high"
    )
    catalog = Catalog(models={"sdxl": spec}, default_model="sdxl")
    assert [spec.queue_for(p) for p in ("low", "normal", "high")] == [
        "gpu.sdxl",
        "gpu.sdxl",
        "gpu.sdxl.high",
    ]
    assert catalog.queues == ["gpu.sdxl", "gpu.sdxl.high"]
    assert catalog.models_for_queues(["gpu.sdxl.high"]) == [spec]
    assert queues_for(catalog, ["sdxl"]) == ["gpu.sdxl", "gpu.sdxl.high"]
    assert queues_for(catalog, None, ["gpu.sdxl.high"]) == ["gpu.sdxl.high"]
    with pytest.raises(ValueError, match="unknown queue"):
        queues_for(catalog, None, ["gpu.other"])
    plain = dataclasses.replace(spec, high_priority_queue="")
    assert plain.queue_for("high") == "gpu.sdxl"


def test_a_high_priority_submit_is_stored_on_the_high_priority_queue(
    stack, db, tenant_key, tmp_path
):
    from app.db.models.jobs import Job

    models = tmp_path / "models.toml"
    models.write_text(
        f'[models.tiny]\npath = "{stack.tiny_model}"\nqueue = "gpu.tiny"\n'
        f'high_priority_queue = "gpu.tiny.high"\ndtype = "float32"\n'
    )
    client = _app(DIFFQ_MODELS_FILE=str(models)).test_client()
    queues = {}
    for priority in ("high", "normal"):
        response = client.post(
            "/v1/jobs",
            json={"prompt": "p", "priority": priority, "steps": 2},
            headers={"Authorization": f"Bearer {tenant_key}"},
        )
        assert response.status_code == 202, response.json
        with db.session() as session:
            job = session.get(Job, uuid.UUID(response.json["id"]))
            queues[priority] = job.queue
            job.status = JobStatus.CANCELED  # nothing consumes these queues here
    assert queues == {"high": "gpu.tiny.high", "normal": "gpu.tiny"}
