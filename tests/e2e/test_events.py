"""Server-Sent Events read by a real HTTP client through gunicorn."""

from __future__ import annotations

import pytest
import requests

from testbed.jobs import auth, submit, wait_terminal
from testbed.sse import read_stream

pytestmark = pytest.mark.services

ORDER = ["queued", "running", "succeeded"]


# The tiny model's steps are cheap at 64 x 64 (its VAE downsamples by 8): jobs that must
# still be running while the test reads them use the catalog's largest size.
LONGER = {"width": 256, "height": 192}


def _events_url(api_server, job) -> str:
    return f"{api_server.url}/v1/jobs/{job['id']}/events"


def test_a_stream_carries_status_and_progress_and_closes_when_done(api_server, worker, tenant_key):
    job = submit(api_server.url, tenant_key, prompt="stream me", steps=30, **LONGER)
    stream = read_stream(_events_url(api_server, job), tenant_key)

    assert stream.closed_by_server
    statuses = [e.data["status"] for e in stream.named("status")]
    assert statuses[-1] == "succeeded"
    assert statuses == sorted(statuses, key=ORDER.index) and len(set(statuses)) == len(statuses)
    assert "running" in statuses
    steps = [e.data["step"] for e in stream.named("progress") if e.data["stage"] == "denoising"]
    assert len(set(steps)) >= 2 and steps == sorted(steps)
    ids = [e.id for e in stream.events if e.id is not None]
    assert ids == sorted(ids)
    final = stream.named("status")[-1].data
    assert final["result"]["images"][0]["url"]


def test_a_finished_stream_resumed_with_its_last_id_answers_204(api_server, worker, tenant_key):
    job = submit(api_server.url, tenant_key, prompt="done", steps=2)
    first = read_stream(_events_url(api_server, job), tenant_key)
    last_id = first.named("status")[-1].id
    again = read_stream(_events_url(api_server, job), tenant_key, last_event_id=last_id)
    assert again.status_code == 204


def test_a_stream_resumed_mid_run_sends_only_newer_events(api_server, worker, tenant_key):
    job = submit(api_server.url, tenant_key, prompt="resume me", steps=80, **LONGER)

    def started(events):
        return any(e.event == "progress" and e.data.get("step", 0) >= 2 for e in events)

    first = read_stream(_events_url(api_server, job), tenant_key, stop=started)
    seen = max(e.id for e in first.events if e.id is not None)
    rest = read_stream(_events_url(api_server, job), tenant_key, last_event_id=seen)
    assert rest.closed_by_server
    assert all(e.id > seen for e in rest.events if e.id is not None)
    assert rest.named("status")[-1].data["status"] == "succeeded"
    assert "queued" not in [e.data["status"] for e in rest.named("status")]


def test_a_queued_job_streams_its_position_and_keepalives(api_server, tenant_key):
    # No worker serves tiny-b here: the job stays queued.
    job = submit(api_server.url, tenant_key, prompt="waiting", model="tiny-b", steps=1)
    stream = read_stream(
        _events_url(api_server, job),
        tenant_key,
        stop=lambda events: any(e.comment == "keep-alive" for e in events),
        timeout=10,
    )
    assert stream.named("status")[0].data["status"] == "queued"
    progress = stream.named("progress")[0].data
    assert progress["stage"] == "queued" and progress["queue_position"] >= 0
    assert any(e.comment == "keep-alive" for e in stream.events)
    # Canceling ends the stream with the terminal status.
    requests.post(f"{api_server.url}/v1/jobs/{job['id']}/cancel", headers=auth(tenant_key))
    final = read_stream(_events_url(api_server, job), tenant_key, timeout=10)
    assert final.named("status")[-1].data["status"] == "canceled"
    assert wait_terminal(api_server.url, tenant_key, job["id"])["error"]["code"] == "canceled"


def test_another_tenants_stream_is_404(api_server, tenant_key, other_key):
    job = submit(api_server.url, tenant_key, prompt="private", model="tiny-b", steps=1)
    assert read_stream(_events_url(api_server, job), other_key).status_code == 404
    requests.post(f"{api_server.url}/v1/jobs/{job['id']}/cancel", headers=auth(tenant_key))


def test_a_waiting_stream_learns_its_new_position_when_the_queue_moves(api_server, tenant_key):
    first = submit(api_server.url, tenant_key, prompt="ahead", model="tiny-b", steps=1)
    second = submit(api_server.url, tenant_key, prompt="behind", model="tiny-b", steps=1)
    positions: list[int] = []

    def moved(events):
        positions[:] = [e.data["queue_position"] for e in events if e.event == "progress"]
        if len(positions) == 1:  # connected and told where it stands: move the queue
            requests.post(
                f"{api_server.url}/v1/jobs/{first['id']}/cancel", headers=auth(tenant_key)
            )
        return len(positions) >= 2

    stream = read_stream(_events_url(api_server, second), tenant_key, stop=moved, timeout=10)
    assert positions[1] == positions[0] - 1, positions
    assert len(stream.named("progress")) == 2
    requests.post(f"{api_server.url}/v1/jobs/{second['id']}/cancel", headers=auth(tenant_key))
