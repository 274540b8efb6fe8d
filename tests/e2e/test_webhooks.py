"""Webhooks on the real path: a GPU worker records events with its state changes, the
relay hands them to a delivery worker on the `webhooks` queue, which POSTs them to a real
receiver on loopback (opened by the operator allow-list); every delivery is verified with
the Standard Webhooks reference library."""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from datetime import datetime

import pytest
import requests
from standardwebhooks.webhooks import Webhook

from testbed.jobs import auth, submit, wait_terminal
from testbed.ports import free_port
from testbed.processes import ApiServer, ManagedProcess
from testbed.receiver import Answer, Receiver
from testbed.waiting import wait_until

pytestmark = pytest.mark.services

SCHEDULE = "0.4,0.4,0.4,0.4,0.4,0.4"  # six retries, fast: the real default spans 27.6 h


@pytest.fixture(scope="module")
def hooks(stack, worker):
    env = {
        **stack.env,
        "DIFFQ_WEBHOOK_ALLOW_CIDRS": "127.0.0.1/32",
        "DIFFQ_WEBHOOK_SCHEDULE": SCHEDULE,
        "DIFFQ_WEBHOOK_TIMEOUT": "1.5",
    }
    api = ApiServer(env, stack.logs, name="api-hooks").start()
    relay = ManagedProcess(
        "relay-hooks",
        [sys.executable, "-m", "cli", "relay", "--interval", "0.2"],
        env,
        stack.logs,
    ).start()
    metrics_port = free_port()
    delivery = ManagedProcess(
        "webhooks",
        [
            sys.executable,
            "-m",
            "cli",
            "webhooks",
            "--concurrency",
            "8",
            "--metrics-port",
            str(metrics_port),
        ],
        {**env, "DIFFQ_METRICS_DIR": str(stack.workdir / "metrics-hooks")},
        stack.logs,
    ).start()
    delivery.wait_for_log(r"ready\.", timeout=60)
    api.delivery_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    api.delivery = delivery  # its log has each attempt's details (the API shows a class)
    yield api
    delivery.stop()
    relay.stop()
    api.stop()


@pytest.fixture
def receiver():
    server = Receiver().start()
    yield server
    server.stop()


# The tiny model's steps are cheap at 64 x 64 (its VAE downsamples by 8): jobs whose
# events must spread over seconds use the catalog's largest size.
LONGER = {"width": 256, "height": 192}


def _secret(db, key: str) -> str:
    from sqlalchemy import select

    from app.db.models.tenants import ApiKey

    key_id = key.split("_")[1]
    with db.session() as session:
        return session.scalar(select(ApiKey).where(ApiKey.key_id == key_id)).tenant.webhook_secret


def _deliveries(api, key: str, job_id: str) -> list[dict]:
    response = requests.get(f"{api.url}/v1/jobs/{job_id}/webhooks", headers=auth(key), timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def _verified(secret: str, received) -> dict:
    return Webhook(secret).verify(received.body, received.headers)


def _outcomes(hooks) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(hooks.delivery_metrics, timeout=10).text
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "diffq_webhook_deliveries_total"
    }


def test_a_receiver_that_is_down_then_fails_gets_the_event_once(hooks, receiver, tenant_key, db):
    secret = _secret(db, tenant_key)
    before = _outcomes(hooks)
    receiver.stop()  # down: connections are refused
    job = submit(hooks.url, tenant_key, prompt="hook-1", steps=2, webhook=f"{receiver.url}/in")
    assert wait_terminal(hooks.url, tenant_key, job["id"])["status"] == "succeeded"
    wait_until(lambda: _deliveries(hooks, tenant_key, job["id"])[0]["attempts"], timeout=15)
    receiver.script = [Answer(500), Answer(429, {"Retry-After": "2"}), Answer(200)]
    receiver.start()
    wait_until(lambda: any(r.answered == 200 for r in receiver.requests()), timeout=30)
    time.sleep(1.5)  # nothing more may come once delivered

    got = receiver.requests()
    assert [r.answered for r in got] == [500, 429, 200]
    assert len({r.headers["webhook-id"] for r in got}) == 1
    bodies = [_verified(secret, r) for r in got]
    assert bodies[0] == bodies[-1]  # retries send the same bytes
    assert bodies[-1]["type"] == "job.succeeded"
    assert bodies[-1]["data"]["id"] == job["id"] and bodies[-1]["data"]["status"] == "succeeded"
    assert bodies[-1]["data"]["result"]["images"][0]["url"]
    assert got[2].at - got[1].at >= 1.9  # Retry-After: 2 was honoured
    [event] = _deliveries(hooks, tenant_key, job["id"])
    assert event["id"] == got[0].headers["webhook-id"] and event["state"] == "delivered"
    codes = [a["status_code"] for a in event["attempts"]]
    # A failed attempt shows its class only (docs/security.md): no status, no timing.
    assert codes[-3:] == [None, None, 200] and all(c is None for c in codes[:-3])
    errors = [a["error"] for a in event["attempts"]]
    assert errors[-3:] == ["non-2xx", "non-2xx", None]
    assert set(errors[:-3]) == {"unreachable"}
    assert event["attempts"][-1]["latency_ms"] is not None
    assert all(a["latency_ms"] is None for a in event["attempts"][:-1])
    after = _outcomes(hooks)
    assert after.get("delivered", 0) - before.get("delivered", 0) == 1
    assert after.get("retry", 0) - before.get("retry", 0) == len(codes) - 1
    print(f"\nwebhook: {len(codes)} attempts {codes}, delivered once, one webhook-id")


def test_every_selected_event_arrives_in_order_and_signed(hooks, receiver, tenant_key, db):
    secret = _secret(db, tenant_key)
    events = ["job.running", "job.progress", "job.succeeded"]
    job = submit(
        hooks.url,
        tenant_key,
        prompt="hook-2",
        steps=40,
        **LONGER,
        webhook=f"{receiver.url}/all",
        webhook_events=events,
    )
    assert job["webhook_events"] == events
    wait_terminal(hooks.url, tenant_key, job["id"])

    def types_received() -> list[str]:
        return [json.loads(r.body)["type"] for r in receiver.requests()]

    # Each event is its own delivery and may land out of order: wait for the first and
    # the last, then order them by their own timestamps.
    wait_until(lambda: {"job.running", "job.succeeded"} <= set(types_received()), timeout=20)
    bodies = [_verified(secret, r) for r in receiver.requests()]
    by_time = sorted(bodies, key=lambda b: datetime.fromisoformat(b["timestamp"]))
    types = [b["type"] for b in by_time]
    assert types[0] == "job.running" and types[-1] == "job.succeeded"
    assert set(types) <= set(events)
    progress = [b for b in by_time if b["type"] == "job.progress"]
    stamps = sorted(datetime.fromisoformat(b["timestamp"]) for b in progress)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]
    assert all(gap >= 0.99 for gap in gaps), gaps  # coalesced: at most one a second
    assert len({b["data"]["id"] for b in bodies}) == 1
    print(f"\nwebhook events received: {types}")


def test_410_gone_stops_every_later_event_of_the_job(hooks, receiver, tenant_key):
    receiver.default = Answer(410)
    job = submit(
        hooks.url,
        tenant_key,
        prompt="hook-3",
        steps=60,  # the 410 to job.running lands long before the job ends
        **LONGER,
        webhook=f"{receiver.url}/gone",
        webhook_events=["job.running", "job.succeeded"],
    )
    wait_terminal(hooks.url, tenant_key, job["id"])
    wait_until(lambda: receiver.requests(), timeout=15)
    time.sleep(2)
    assert len(receiver.requests()) == 1
    states = [e["state"] for e in _deliveries(hooks, tenant_key, job["id"])]
    assert states and all(state == "gone" for state in states), states


def test_redirects_are_not_followed_and_a_failed_event_can_be_redelivered(
    hooks, receiver, tenant_key, db
):
    trap = Receiver().start()  # where the redirect points: it must never be called
    try:
        receiver.default = Answer(302, {"Location": f"{trap.url}/trap"})
        job = submit(hooks.url, tenant_key, prompt="hook-4", steps=2, webhook=f"{receiver.url}/r")
        wait_terminal(hooks.url, tenant_key, job["id"])
        failed = wait_until(
            lambda: [
                e for e in _deliveries(hooks, tenant_key, job["id"]) if e["state"] == "failed"
            ],
            timeout=30,
        )
        assert not trap.requests()
        attempts = failed[0]["attempts"]
        assert len(attempts) == 7 and {a["status_code"] for a in attempts} == {None}
        assert all(a["error"] == "non-2xx" for a in attempts)

        receiver.default = Answer(200)
        response = requests.post(
            f"{hooks.url}/v1/jobs/{job['id']}/webhooks/redeliver",
            headers=auth(tenant_key),
            timeout=10,
        )
        assert response.status_code == 202 and response.json()["id"] == failed[0]["id"]
        wait_until(lambda: any(r.answered == 200 for r in receiver.requests()), timeout=15)
        delivered = receiver.requests()[-1]
        assert delivered.headers["webhook-id"] == failed[0]["id"]
        _verified(_secret(db, tenant_key), delivered)
    finally:
        trap.stop()


def test_another_tenant_sees_no_deliveries(hooks, tenant_key, other_key, receiver):
    job = submit(hooks.url, tenant_key, prompt="hook-5", steps=2, webhook=f"{receiver.url}/x")
    for path in ("webhooks",):
        response = requests.get(
            f"{hooks.url}/v1/jobs/{job['id']}/{path}", headers=auth(other_key), timeout=10
        )
        assert response.status_code == 404
    response = requests.post(
        f"{hooks.url}/v1/jobs/{job['id']}/webhooks/redeliver", headers=auth(other_key), timeout=10
    )
    assert response.status_code == 404
    wait_terminal(hooks.url, tenant_key, job["id"])


def test_a_hanging_receiver_does_not_slow_the_gpu_worker(hooks, receiver, tenant_key):
    def run(**extra) -> tuple[float, list[str]]:
        ids = [
            submit(hooks.url, tenant_key, prompt=f"hang-{i}", steps=4, **extra)["id"]
            for i in range(6)
        ]
        jobs = [wait_terminal(hooks.url, tenant_key, j) for j in ids]
        assert all(j["status"] == "succeeded" for j in jobs)
        runs = [j["metrics"]["run_seconds"] for j in jobs]
        return statistics.median(runs), ids

    baseline, _ = run()
    receiver.default = Answer(200, delay=5.0)  # longer than the 1.5 s attempt timeout
    hanging, ids = run(
        webhook=f"{receiver.url}/hang",
        webhook_events=["job.running", "job.progress", "job.succeeded"],
    )
    ratio = hanging / baseline
    print(f"\nGPU run time p50 with a hanging receiver: {ratio:.2f}x the run without webhooks")

    def timed_out() -> list[dict]:
        return [
            attempt
            for job_id in ids
            for event in _deliveries(hooks, tenant_key, job_id)
            for attempt in event["attempts"]
            if attempt["error"] == "unreachable"
        ]

    # The receiver really hung: its calls were cut at the attempt timeout, not answered.
    assert wait_until(timed_out, timeout=30)
    assert hooks.delivery.count(r"no answer within 1\.5s") >= 1
    assert receiver.requests("/hang")
    # A worker that waited on even one delivery attempt would add its 1.5 s timeout.
    assert hanging < baseline + 1.0, (hanging, baseline)


def test_a_delivery_the_policy_refuses_fails_at_once(hooks, receiver, tenant_key, db):
    """An address allowed at submit that the policy refuses at delivery (as when a name
    starts resolving to a private address): one attempt, failed, no retries, counted."""
    from sqlalchemy import update

    from app.db.models.jobs import Job

    before = _outcomes(hooks)
    job = submit(hooks.url, tenant_key, prompt="refused", steps=2, webhook=f"{receiver.url}/ok")
    wait_terminal(hooks.url, tenant_key, job["id"])
    wait_until(
        lambda: [e for e in _deliveries(hooks, tenant_key, job["id"]) if e["state"] != "pending"],
        timeout=20,
    )
    with db.session() as session:  # now pointing at a range the allow-list does not open
        session.execute(
            update(Job).where(Job.id == job["id"]).values(webhook_url="http://0x7f.0.0.2/in")
        )
    response = requests.post(
        f"{hooks.url}/v1/jobs/{job['id']}/webhooks/redeliver", headers=auth(tenant_key), timeout=10
    )
    assert response.status_code == 202
    [event] = wait_until(
        lambda: [e for e in _deliveries(hooks, tenant_key, job["id"]) if e["state"] == "failed"],
        timeout=20,
    )
    time.sleep(1.5)  # three retry delays of the fast schedule: none may come
    [event] = _deliveries(hooks, tenant_key, job["id"])
    assert event["state"] == "failed" and event["next_attempt_at"] is None
    first, *after_redelivery = event["attempts"]  # the first one was delivered
    assert first["status_code"] == 200
    assert len(after_redelivery) == 1, event["attempts"]
    # The tenant reads the class; the worker's log, for operators, the reason.
    assert after_redelivery[0]["error"] == "refused"
    assert after_redelivery[0]["status_code"] is None
    assert hooks.delivery.count(r"refused: 127\.0\.0\.2 is not a public") == 1
    after = _outcomes(hooks)
    assert after.get("refused", 0) - before.get("refused", 0) == 1
    print(f"\nrefused delivery: {after_redelivery[0]['error']}")


def test_a_clips_webhook_arrives_signed_with_its_video(
    hooks, video_worker, receiver, tenant_key, db
):
    """A video job's events go out as an image job's do: signed, in order, the succeeded
    event's job carrying the MP4's link and its poster."""
    secret = _secret(db, tenant_key)
    job = submit(
        hooks.url,
        tenant_key,
        kind="txt2vid",
        model="tiny-video",
        prompt="hook-clip",
        num_frames=9,
        steps=2,
        webhook=f"{receiver.url}/clip",
        webhook_events=["job.running", "job.succeeded"],
    )
    assert wait_terminal(hooks.url, tenant_key, job["id"])["status"] == "succeeded"

    def bodies() -> list[dict]:
        return [_verified(secret, r) for r in receiver.requests()]

    # Each event is its own delivery: job.running may land after job.succeeded (a retry,
    # or two deliveries at once); their order is the events' own timestamps.
    expected = {"job.running", "job.succeeded"}
    wait_until(lambda: expected <= {b["type"] for b in bodies()}, timeout=20)
    types = [b["type"] for b in sorted(bodies(), key=lambda b: b["timestamp"])]
    assert types == ["job.running", "job.succeeded"], types
    done = next(b for b in bodies() if b["type"] == "job.succeeded")["data"]
    (clip,) = done["result"]["videos"]
    assert clip["frames"] == 9 and clip["content_type"] == "video/mp4"
    assert requests.get(clip["url"], timeout=10).content[4:8] == b"ftyp"  # an MP4
    assert done["result"]["images"][0]["poster"] is True
