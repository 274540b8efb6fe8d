"""The job object is one function of the row (app/jobs/view.py): the API's answer and a
webhook's `data` are the same object, and the webhook worker renders it without Flask."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta

import pytest

PUBLIC_URL = "https://api.example.com"


def _job():
    from app.db.models.jobs import Job
    from app.jobs.states import JobStatus, Priority

    created = datetime(2026, 11, 23, 12, 0, 0, 123456, tzinfo=UTC)
    return Job(
        id=uuid.uuid4(),
        tenant_id=uuid.uuid4(),
        status=JobStatus.SUCCEEDED,
        model="tiny",
        queue="gpu.tiny",
        input={"prompt": "a red cube", "steps": 2, "seed": 7},
        progress={"stage": "done", "step": 2, "total_steps": 2, "percent": 100.0},
        priority=Priority.NORMAL,
        attempts=1,
        result={
            "images": [
                {
                    "key": "jobs/a/0.png",
                    "width": 64,
                    "height": 64,
                    "seed": 7,
                    "content_type": "image/png",
                    "bytes": 1234,
                    "sha256": "ab" * 32,
                }
            ]
        },
        manifest={"model": "tiny", "seed": 7, "dtype": "float32"},
        created_at=created,
        started_at=created + timedelta(seconds=1.5),
        finished_at=created + timedelta(seconds=4),
        gpu_seconds=1.23456,
        device="cpu",
        client_metadata={"order": 42},
        webhook_url="https://hooks.example.com/in",
        webhook_events=None,
        version=5,
    )


@pytest.fixture
def settings_env(tmp_path, monkeypatch):
    for name in [n for n in os.environ if n.startswith("DIFFQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("DIFFQ_HOME", str(tmp_path))
    monkeypatch.setenv("DIFFQ_PUBLIC_URL", PUBLIC_URL)
    monkeypatch.setattr("app.storage.local.time.time", lambda: 1_800_000_000.0)
    # This process's root is built from these settings, not kept from an earlier test.
    monkeypatch.setattr("app.services._root", None)


def test_the_links_are_the_apis_routes(settings_env):
    from flask import url_for

    from app.config import load_settings
    from app.jobs.view import job_links
    from app.web.factory import create_app

    job_id = uuid.uuid4()
    flask_app = create_app(load_settings())
    for base in ("https://api.example.com", "https://example.com/diffq/"):
        with flask_app.test_request_context(base_url=base):
            routes = {
                "self": url_for("jobs.JobById", job_id=job_id, _external=True),
                "cancel": url_for("jobs.JobCancel", job_id=job_id, _external=True),
                "events": url_for("job_events.JobEvents", job_id=job_id, _external=True),
            }
        assert job_links(base, job_id) == routes


def test_a_webhooks_data_is_the_apis_job_object(settings_env):
    """The delivery worker's view of a job equals the API's answer for it (both signed
    and linked against DIFFQ_PUBLIC_URL), field for field."""
    import tasks.webhooks
    from app import services as root
    from app.config import load_settings
    from app.web.factory import create_app
    from app.web.resources.jobs.presenter import job_view
    from app.web.resources.jobs.schemas import JobSchema
    from app.web.services import services

    job = _job()
    try:
        data = tasks.webhooks.worker_root().view(job)
    finally:
        root.reset()
    flask_app = create_app(load_settings())
    with flask_app.test_request_context(base_url=PUBLIC_URL):
        svc = services()
        answered = JobSchema().dump(job_view(job, svc.storage, svc.settings.presign_ttl))
    assert data == answered
    assert data["urls"]["self"] == f"{PUBLIC_URL}/v1/jobs/{job.id}"
    [image] = data["result"]["images"]
    assert image["url"].startswith(f"{PUBLIC_URL}/files/jobs/a/0.png?expires=")
    assert "key" not in image and image["sha256"] == "ab" * 32
    assert data["created_at"] == "2026-11-23T12:00:00.123456+00:00"
    assert data["metrics"] == {"queue_seconds": 1.5, "run_seconds": 2.5}
    assert data["webhook_events"] == ["job.succeeded", "job.failed", "job.canceled"]
    assert data["cost"] == {"gpu_seconds": 1.2346, "device": "cpu", "model": "tiny"}


def test_the_webhook_worker_renders_jobs_without_flask(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIFFQ_")}
    env.update(DIFFQ_HOME=str(tmp_path), DIFFQ_PUBLIC_URL=PUBLIC_URL)
    code = (
        "import sys\n"
        "from tasks import app\n"
        "app.loader.import_default_modules()  # the task modules, as the worker does\n"
        "import tasks.webhooks\n"
        "from tests.unit.test_job_view import _job\n"
        "data = tasks.webhooks.worker_root().view(_job())\n"
        "assert data['urls']['self'].startswith('https://api.example.com/v1/jobs/'), data\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = {name.split(".")[0] for name in out.stdout.split()}
    assert "tasks" in loaded and "celery" in loaded  # the check ran where it should
    assert not loaded & {"flask", "flask_smorest", "flask_sock", "werkzeug"}


def _fresh(**changes):
    from app.db.models.jobs import Job
    from app.jobs.states import JobStatus, Priority
    from app.jobs.transitions import progress_of

    values = {
        "id": uuid.uuid4(),
        "tenant_id": uuid.uuid4(),
        "status": JobStatus.QUEUED,
        "model": "tiny",
        "queue": "gpu.tiny",
        "input": {"prompt": "a red cube", "steps": 3, "seed": 7, "width": 64},
        "progress": progress_of("queued", 0, 3),
        "priority": Priority.HIGH,
        "attempts": 0,
        "created_at": datetime(2026, 11, 23, 12, 0, 0, 123456, tzinfo=UTC),
        "version": 0,
    }
    return Job(**{**values, **changes})


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"client_metadata": {"order": 42, "tags": ["a", "b"]}},
        {"webhook_url": "https://hooks.example.com/in", "webhook_events": ["completed"]},
        {"webhook_url": "https://hooks.example.com/in", "webhook_events": None},
        {"replay_of": uuid.uuid4()},
        {"progress": {"stage": "queued", "step": 0, "total_steps": 0, "percent": 0}},
        {"progress": None, "attempts": 2},
    ],
)
def test_a_fresh_jobs_json_is_the_schemas(changes):
    """The submit's 202 renders a job just stored by hand (app/jobs/view.py): it must be
    what the documented schema gives, field for field."""
    from app.jobs.queue_info import QueueInfo
    from app.jobs.view import _JOB_SCHEMA, _is_fresh, job_json, job_view
    from app.storage.local import LocalStorage

    job = _fresh(**changes)
    storage = LocalStorage(root="/nonexistent", secret_key="secret")
    for queue in (None, QueueInfo(position=3, eta_seconds=12)):
        view = job_view(job, storage, 60, PUBLIC_URL, queue)
        assert _is_fresh(view)
        # As JSON text: 0 and 0.0 are equal as Python values, not on the wire.
        mine, documented = job_json(view), _JOB_SCHEMA.dump(view)
        assert json.dumps(mine, sort_keys=True) == json.dumps(documented, sort_keys=True)


def test_a_job_that_ran_is_not_taken_for_fresh():
    from app.jobs.states import JobStatus
    from app.jobs.view import _is_fresh, job_view
    from app.storage.local import LocalStorage

    storage = LocalStorage(root="/nonexistent", secret_key="secret")
    assert not _is_fresh(job_view(_job(), storage, 60, PUBLIC_URL))
    started = _fresh(status=JobStatus.RUNNING, started_at=datetime.now(UTC))
    assert not _is_fresh(job_view(started, storage, 60, PUBLIC_URL))
