"""Features end to end on `diffq up`'s embedded stores (SQLite, the filesystem broker,
local files), as a newcomer meets them: cancel (queued and running), a cancelled batch
that must not hold the jobs sent after it, caps on a batch, retention, and a ControlNet
control (the demo catalog's tiny one). The same
features run on PostgreSQL, RabbitMQ and S3 in their own modules; the examples of the
README run on both (tests/e2e/test_doc_examples.py)."""

from __future__ import annotations

import json
import os
import time

import pytest
import requests

from testbed.embedded import EmbeddedService
from testbed.jobs import auth, submit, wait_terminal
from testbed.waiting import wait_until

pytestmark = pytest.mark.services


def _get(service, key: str, path: str) -> dict:
    answer = requests.get(f"{service.url}{path}", headers=auth(key), timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _post(service, key: str, path: str, headers: dict | None = None, **kw) -> requests.Response:
    return requests.post(
        f"{service.url}{path}", headers={**auth(key), **(headers or {})}, timeout=60, **kw
    )


def _waiting_messages(service: EmbeddedService) -> list[str]:
    """The task ids (job ids) of the messages waiting in the embedded broker's queue."""
    folder = service.data / "broker" / "queue"
    names = [n for n in os.listdir(folder) if n.endswith(".msg") and not n.startswith(".")]
    return [n.split("_", 1)[1].split(".", 1)[0] for n in names]


def test_a_control_image_steers_a_job_on_the_embedded_stores(embedded):
    import base64
    import io

    from PIL import Image

    key = embedded.new_key()
    models = {m["name"]: m for m in _get(embedded, key, "/v1/models")["data"]}
    assert models["tiny"]["controlnets"] == ["tiny-canny"]
    square = Image.new("RGB", (64, 64), (10, 10, 10))
    square.paste((240, 200, 40), (12, 20, 52, 44))
    buffer = io.BytesIO()
    square.save(buffer, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    body = {"prompt": "a sign", "seed": 4, "steps": 2, "width": 64, "height": 64}
    control = {"controlnet": "tiny-canny", "image": uri, "preprocess": "canny"}
    jobs = [
        submit(embedded.url, key, **body),
        submit(embedded.url, key, **body, controls=[control]),
    ]
    plain, steered = (wait_terminal(embedded.url, key, j["id"], timeout=120) for j in jobs)
    assert plain["status"] == steered["status"] == "succeeded", (plain, steered)
    assert steered["result"]["manifest"]["controls"][0]["preprocess"] == "canny"
    pictures = [
        requests.get(job["result"]["images"][0]["url"], timeout=10).content
        for job in (plain, steered)
    ]
    assert pictures[0] != pictures[1]


def test_a_running_job_is_cancelled_at_its_next_step(embedded):
    key = embedded.new_key()
    long_job = submit(embedded.url, key, prompt="long", steps=50, width=512, height=512)
    wait_until(
        lambda: (
            (_get(embedded, key, f"/v1/jobs/{long_job['id']}").get("progress") or {}).get("step", 0)
            >= 2
        ),
        timeout=90,
    )
    answer = _post(embedded, key, f"/v1/jobs/{long_job['id']}/cancel")
    assert answer.status_code == 200 and answer.json()["status"] == "canceled", answer.text
    after = submit(embedded.url, key, prompt="after", steps=2, width=64, height=64)
    done = wait_terminal(embedded.url, key, after["id"], timeout=90)
    assert done["status"] == "succeeded", done
    final = _get(embedded, key, f"/v1/jobs/{long_job['id']}")
    assert final["status"] == "canceled" and final["progress"]["step"] < 50, final


def test_a_queued_jobs_message_leaves_the_queue_when_it_is_cancelled(embedded):
    key = embedded.new_key()
    blocker = submit(embedded.url, key, prompt="blocker", steps=50, width=512, height=512)
    wait_until(
        lambda: _get(embedded, key, f"/v1/jobs/{blocker['id']}")["status"] == "running",
        timeout=90,
    )
    queued = submit(embedded.url, key, prompt="never", steps=2, width=64, height=64)
    assert queued["id"] in _waiting_messages(embedded)
    answer = _post(embedded, key, f"/v1/jobs/{queued['id']}/cancel")
    assert answer.status_code == 200 and answer.json()["status"] == "canceled"
    assert queued["id"] not in _waiting_messages(embedded)
    _post(embedded, key, f"/v1/jobs/{blocker['id']}/cancel")
    shown = _get(embedded, key, f"/v1/jobs/{queued['id']}")
    assert shown["status"] == "canceled" and shown["started_at"] is None


def test_a_cancelled_batch_does_not_hold_the_jobs_sent_after_it(embedded):
    """A 900-job batch cancelled while its first job runs: its waiting messages leave the
    queue with the cancel, so a job sent next is the queue's only message, shown at
    position 0, and starts as soon as the running job stops (before, each cancelled
    message took a worker's poll first: 300 s for 5,000)."""
    key = embedded.new_key()
    lines = "".join(
        json.dumps(
            {"custom_id": f"row-{i}", "prompt": "a row", "steps": 50, "width": 512, "height": 512}
        )
        + "\n"
        for i in range(900)
    )
    made = _post(
        embedded,
        key,
        "/v1/batches",
        data=lines,
        headers={"Content-Type": "application/jsonl"},
    )
    assert made.status_code == 202, made.text
    batch = made.json()
    assert batch["counts"]["total"] == 900
    wait_until(
        lambda: _get(embedded, key, f"/v1/batches/{batch['id']}")["counts"]["running"],
        timeout=90,
    )
    cancelled = _post(embedded, key, f"/v1/batches/{batch['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    asked = time.monotonic()
    after = submit(embedded.url, key, prompt="after the batch", steps=2, width=64, height=64)
    # The batch's queued jobs' messages left with the cancel. What may wait besides the
    # new job's: the message of the job that was running, handed back when it stopped (a
    # permit for the next job, docs/fair-share.md).
    others = [m for m in _waiting_messages(embedded) if m != after["id"]]
    assert len(others) <= 1, others
    for job_id in others:
        assert _get(embedded, key, f"/v1/jobs/{job_id}")["started_at"] is not None
    shown = _get(embedded, key, f"/v1/jobs/{after['id']}")
    if shown["status"] == "queued":
        assert shown["queue_position"] == 0, shown
    done = wait_terminal(embedded.url, key, after["id"], timeout=120)
    waited = time.monotonic() - asked
    print(f"\na job sent after a cancelled 900-job batch finished {waited:.2f} s later")
    assert done["status"] == "succeeded", done
    ended = wait_until(
        lambda: (
            (b := _get(embedded, key, f"/v1/batches/{batch['id']}"))["status"] == "cancelled" and b
        ),
        timeout=60,
    )
    assert ended["counts"]["canceled"] + ended["counts"]["succeeded"] == 900, ended["counts"]


@pytest.fixture(scope="module")
def short_retention(tmp_path_factory):
    """`diffq up` keeping images 2 s (its relay passes every 2 s)."""
    service = EmbeddedService(
        tmp_path_factory.mktemp("embedded-retention"), DIFFQ_RESULT_RETENTION="2"
    ).start()
    yield service
    service.stop()


def test_images_past_retention_leave_the_embedded_store(short_retention):
    service = short_retention
    key = service.new_key()
    job = submit(service.url, key, prompt="kept briefly", steps=2, width=64, height=64)
    done = wait_terminal(service.url, key, job["id"], timeout=90)
    assert done["status"] == "succeeded", done  # (its images may be gone already)
    removed = wait_until(
        lambda: (j := _get(service, key, f"/v1/jobs/{job['id']}"))["data_removed"] and j,
        timeout=60,
        interval=0.5,
    )
    assert removed["result"] is None
    image = requests.get(
        f"{service.url}/v1/jobs/{job['id']}/images/0",
        headers=auth(key),
        allow_redirects=False,
        timeout=10,
    )
    assert image.status_code == 410
    left = [p for p in (service.data / "images").rglob("*") if p.is_file() and job["id"] in str(p)]
    assert not left, left
