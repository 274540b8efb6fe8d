"""F19: a batch (POST /v1/batches) through pool processes killed with -9 and the broker
stopped and started under it. Every line must end exactly once in one of the batch's two
files (output or error), and its completion webhook be recorded and delivered once."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

import pytest
import requests
from sqlalchemy import select

from app.jobs.states import TERMINAL as TERMINAL_STATES
from app.jobs.states import JobStatus
from testbed.jobs import auth
from tests.faults.harness import REPORT, Figures, floor_of
from tests.faults.killing import kill_child

pytestmark = [pytest.mark.faults, pytest.mark.services]

LINES = 40
KILLS = 4
STEPS = 40
# The first lines run longer, so that KILLS of them are caught mid-denoising on a fast or
# a busy machine before the batch ends (short jobs alone left the loop one kill short).
LONG_STEPS, LONG_LINES = 200, 2 * KILLS


def _rows(stack, batch_id: uuid.UUID) -> dict[str, object]:
    from app.db.models.jobs import Job

    with stack.db.session() as session:
        jobs = session.scalars(select(Job).where(Job.batch_id == batch_id))
        return {str(job.id): job for job in jobs}


def _file(stack, key: str, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    answer = requests.get(
        f"{stack.api.url}/v1/files/{file_id}/content", headers=auth(key), timeout=60
    )
    assert answer.status_code == 200, answer.text
    return [json.loads(line) for line in answer.text.splitlines()]


def test_f19_a_batch_through_worker_kills_and_a_broker_restart(fault_stack):
    stack = fault_stack
    stack.ensure_workers()
    key = stack.new_key()
    fig = Figures("F19 batch: kill -9 x4 + broker restart")
    lines = [
        {
            "custom_id": f"f19-{i}",
            "prompt": f"f19 {i}",
            "steps": LONG_STEPS if i < LONG_LINES else STEPS,
            "seed": i,
        }
        for i in range(LINES)
    ]
    answer = requests.post(
        f"{stack.api.url}/v1/batches",
        json={"requests": lines, "webhook": f"{stack.receiver.url}/batches"},
        headers=auth(key),
        timeout=60,
    )
    assert answer.status_code == 202, answer.text
    batch_id = uuid.UUID(answer.json()["id"])
    fig.submitted = LINES
    killed: set[str] = set()
    deadline = time.monotonic() + 240
    while len(killed) < KILLS and time.monotonic() < deadline:
        rows = _rows(stack, batch_id)
        victims = [
            row
            for job_id, row in rows.items()
            if job_id not in killed
            and row.status == JobStatus.RUNNING
            and (row.progress or {}).get("stage") == "denoising"
        ]
        if not victims:
            if rows and all(row.status in TERMINAL_STATES for row in rows.values()):
                break  # every line ended before the kills: the floor check below says so
            time.sleep(0.05)
            continue
        victim = victims[0]
        if kill_child(victim, lambda job_id: _rows(stack, batch_id).get(job_id)):
            killed.add(str(victim.id))
            fig.faults += 1
    stack.rabbit.stop()  # the broker away with the batch's messages in it
    fig.faults += 1
    time.sleep(2)
    stack.rabbit.start()

    ended = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ended = requests.get(
            f"{stack.api.url}/v1/batches/{batch_id}", headers=auth(key), timeout=30
        ).json()
        if ended["status"] in ("completed", "expired", "cancelled", "failed"):
            break
        time.sleep(0.5)
    assert ended and ended["status"] == "completed", ended
    output = _file(stack, key, ended["output_file_id"])
    errors = _file(stack, key, ended["error_file_id"])
    seen = Counter(line["custom_id"] for line in output + errors)
    wanted = {line["custom_id"] for line in lines}
    fig.lost = len(wanted - set(seen))
    fig.duplicate_results = sum(1 for n in seen.values() if n > 1)
    fig.succeeded = len(output)
    for line in errors:
        fig.failed[(line.get("error") or {}).get("code") or "error"] += 1
    # Generations per job from the workers' logs (a takeover after a kill is one more).
    logs = "".join(p.read_text(errors="replace") for p in stack.worker_logs())
    claims = Counter(
        job_id for job_id in _rows(stack, batch_id) if f"job {job_id} claimed (attempt" in logs
    )
    fig.duplicate_generations = sum(
        max(0, logs.count(f"job {job_id} succeeded in") - 1) for job_id in claims
    )
    # The batch's completion webhook: one event, delivered once.
    deadline = time.monotonic() + 60
    delivered: set[str] = set()
    while time.monotonic() < deadline and not delivered:
        for received in stack.receiver.requests():
            body = json.loads(received.body)
            if body["type"].startswith("batch.") and body["data"]["id"] == str(batch_id):
                delivered.add(received.headers["webhook-id"])
        time.sleep(0.5)
    fig.duplicate_deliveries = max(0, len(delivered) - 1)
    fig.undelivered = 0 if delivered else 1
    fig.notes = (
        f"lines submitted={LINES} lost={fig.lost} duplicated={fig.duplicate_results}; "
        f"output {len(output)}, errors {len(errors)}; killed {sorted(killed)[:2]}…"
    )
    REPORT.append(fig)
    print("\n" + fig.line())
    print(f"F19: submitted {LINES}, lost {fig.lost}, duplicated {fig.duplicate_results}")
    assert fig.faults >= floor_of(fig.scenario), "fewer faults than its floor"
    assert fig.lost == 0 and fig.duplicate_results == 0, fig.line()
    assert len(output) + len(errors) == LINES
    assert ended["request_counts"]["total"] == LINES
    assert ended["request_counts"]["completed"] == len(output)
    assert fig.undelivered == 0 and fig.duplicate_deliveries == 0, fig.line()
