"""Workers killed, stopped, overrun and poisoned: every accepted job still ends truthfully."""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time

import pytest

from app.jobs.states import JobStatus
from testbed.waiting import wait_until
from tests.faults.harness import FLOORS, Scenario
from tests.faults.killing import (
    child_pid,
    kill_child,
    kill_worker,
    parent_pid,
    worker_main_pid,
)

pytestmark = [pytest.mark.faults, pytest.mark.services]


def _assert_nothing_lost(fig, accepted: int) -> None:
    assert fig.lost == 0, fig.line()
    assert fig.duplicate_results == 0, fig.line()
    assert fig.undelivered == 0, fig.line()  # every succeeded job's webhook arrived
    assert fig.succeeded + sum(fig.failed.values()) == accepted


def _reclaimed_after(sc: Scenario, job_id: str, attempts: int, since: float) -> float:
    """Seconds from `since` until the job is claimed again (or finished)."""

    def moved():
        row = sc.rows([job_id])[job_id]
        return row.attempts > attempts or row.status.terminal

    wait_until(moved, timeout=60, interval=0.05)
    return time.monotonic() - since


KILLS = FLOORS["F1"]


@pytest.mark.timeout(900)  # the kills' budget and the settle after them
def test_f1_pool_child_killed_mid_generation(fault_stack):
    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario(f"F1 kill -9 pool child, {KILLS} times", stack, stack.new_key())
    killed: set[str] = set()
    # Each kill waits for a new pool process to load the model: about 2.5 s a kill on
    # an idle 2-core machine, 9 s on one running the suite's four processes and more
    # (run 52: 67 of 70 in 600 s). The budget lets the floor be reached on such a
    # machine; an idle one stops at the floor in about two minutes.
    deadline = time.monotonic() + 600
    while len(killed) < KILLS and time.monotonic() < deadline:
        rows = sc.rows()
        if sum(not row.status.terminal for row in rows.values()) < 4:
            sc.submit(prompt="f1", steps=40)  # keep work in flight to kill
            continue
        victims = [
            row
            for job_id, row in rows.items()
            if job_id not in killed
            and row.status == JobStatus.RUNNING
            and (row.progress or {}).get("stage") == "denoising"
        ]
        if not victims:
            time.sleep(0.05)
            continue
        for victim in victims[: KILLS - len(killed)]:  # both workers' jobs at once
            started = time.monotonic()
            if kill_child(victim, sc.row, lambda: sc.rows().values()):
                killed.add(str(victim.id))
                sc.figures.faults += 1
                if len(sc.figures.recovery_seconds) < 3:
                    sc.figures.recovery_seconds.append(
                        _reclaimed_after(sc, str(victim.id), victim.attempts, started)
                    )
    fig = sc.report(sc.settle(180))  # asserts its floor
    _assert_nothing_lost(fig, len(sc.accepted))
    assert fig.succeeded == len(sc.accepted)  # one kill per job stays under the cap


def test_f18_image_jobs_killed_mid_generation_find_their_inputs_again(fault_stack):
    """Jobs that start from an uploaded image (img2img, inpainting with an inline mask):
    the pool process is killed mid-job, the redelivery reads the input from the store
    again, and every job succeeds once."""
    import base64
    import io

    import requests
    from PIL import Image

    from testbed.jobs import auth

    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario("F18 kill -9 mid-job, image inputs", stack, stack.new_key())

    def png(image) -> bytes:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return buffer.getvalue()

    picture = Image.new("RGB", (128, 96), (90, 140, 200))
    answer = requests.post(
        f"{stack.api.url}/v1/uploads",
        files={"file": ("in.png", png(picture))},
        headers=auth(sc.key),
        timeout=30,
    )
    assert answer.status_code == 201, answer.text
    image = answer.json()["id"]
    mask = Image.new("L", (128, 96), 0)
    mask.paste(255, (32, 24, 96, 72))
    inline = "data:image/png;base64," + base64.b64encode(png(mask)).decode()
    # Enough steps that each job's "denoising" is written and seen before it ends, even on
    # a fast machine (a progress write at most every 0.1 s).
    for i in range(6):
        if i % 2:
            sc.submit(kind="inpaint", prompt=f"f18-{i}", image=image, mask=inline, steps=64)
        else:
            sc.submit(kind="img2img", prompt=f"f18-{i}", image=image, strength=0.8, steps=80)
    killed: set[str] = set()
    deadline = time.monotonic() + 240
    while len(killed) < 4 and time.monotonic() < deadline:
        victims = [
            row
            for job_id, row in sc.rows().items()
            if job_id not in killed
            and row.status == JobStatus.RUNNING
            and (row.progress or {}).get("stage") == "denoising"
        ]
        if not victims:
            time.sleep(0.05)
            continue
        if kill_child(victims[0], sc.row):
            killed.add(str(victims[0].id))
            sc.figures.faults += 1
    fig = sc.report(sc.settle(180))
    _assert_nothing_lost(fig, len(sc.accepted))
    assert fig.succeeded == len(sc.accepted)
    rows = sc.rows()
    # Each killed job ran again and found its input (a lease lapsed on a loaded host
    # may add an attempt; the result is still recorded once).
    assert min(rows[job_id].attempts for job_id in killed) >= 2


def test_f2_whole_worker_killed_then_restarted(fault_stack):
    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario("F2 kill -9 whole worker, restart", stack, stack.new_key())
    for i in range(12):
        sc.submit(prompt=f"f2-{i}", steps=40, seed=i)
    killed: set[str] = set()

    def next_victim():
        rows = sc.rows().items()
        return next((r for j, r in rows if j not in killed and worker_main_pid(r)), None)

    while len(killed) < 3:
        victim = wait_until(next_victim, timeout=60)
        main = worker_main_pid(victim)
        supervisor = parent_pid(main)
        started = time.monotonic()
        if main is None or not kill_worker(main, victim, sc.row):
            continue  # it had moved on to another job: pick again
        killed.add(str(victim.id))
        sc.figures.faults += 1
        sc.figures.recovery_seconds.append(
            _reclaimed_after(sc, str(victim.id), victim.attempts, started)
        )
        stack.restart_killed_worker(supervisor)
        for i in range(3):
            sc.submit(prompt=f"f2-more-{i}", steps=40)
    fig = sc.report(sc.settle(180))
    _assert_nothing_lost(fig, len(sc.accepted))
    assert fig.succeeded == len(sc.accepted)


def test_f3_rolling_sigterm_restarts_under_load(fault_stack):
    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario("F3 SIGTERM rolling restarts", stack, stack.new_key())
    stop = threading.Event()

    def submitter():
        for i in range(40):
            # Every fourth job outlasts the 3 s shutdown grace and must be handed back
            # (480 steps at 128 x 128: several seconds even on one fast core).
            if i % 4 == 0:
                sc.submit(prompt=f"f3-{i}", steps=480, width=128, height=128)
            else:
                sc.submit(prompt=f"f3-{i}", steps=16)
            if stop.wait(0.6):
                return

    def worker_on_a_long_job() -> str | None:
        """The worker running a long job that has most of its steps left, if any."""
        for row in sc.rows().values():
            steps = (row.progress or {}).get("step", 0)
            if row.status != JobStatus.RUNNING or row.input.get("steps") != 480 or steps > 160:
                continue
            pid = child_pid(row)
            while pid and pid > 1:
                for name, worker in stack.workers.items():
                    if worker.pid == pid:
                        return name
                pid = parent_pid(pid)
        return None

    thread = threading.Thread(target=submitter)
    thread.start()
    handbacks_before = sum(p.read_text().count("handed back") for p in stack.worker_logs())
    try:
        for turn in range(4):
            time.sleep(1.5)
            # Stop a worker in the middle of a long job (so that a hand-back is due),
            # else the next in turn.
            deadline = time.monotonic() + 20
            name = None
            while name is None and time.monotonic() < deadline:
                name = worker_on_a_long_job()
                time.sleep(0.1)
            name = name or ("fa", "fb")[turn % 2]
            stack.workers[name].stop(signal.SIGTERM, timeout=90)
            sc.figures.faults += 1
            started = time.monotonic()
            stack.start_worker(name)
            sc.figures.recovery_seconds.append(time.monotonic() - started)
    finally:
        stop.set()
        thread.join()
    fig = sc.report(sc.settle(240))
    handbacks = sum(p.read_text().count("handed back") for p in stack.worker_logs())
    fig.notes = f"{handbacks - handbacks_before} jobs handed back by stopping workers"
    print(fig.notes)
    _assert_nothing_lost(fig, len(sc.accepted))
    assert fig.succeeded == len(sc.accepted)
    assert handbacks > handbacks_before


def test_f7_a_poison_job_is_dead_lettered_and_does_not_block_the_queue(fault_stack):
    from testbed.services import broker_connection

    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario("F7 poison job crashes its worker", stack, stack.new_key())

    def latencies(job_ids) -> list[float]:
        rows = sc.settle(120)
        return [
            (rows[j].finished_at - rows[j].created_at).total_seconds()
            for j in job_ids
            if rows[j].status == JobStatus.SUCCEEDED
        ]

    baseline = latencies([sc.submit(prompt=f"f7-base-{i}", steps=24) for i in range(8)])
    poison = sc.submit(prompt="f7-poison", steps=400)
    others = [sc.submit(prompt=f"f7-{i}", steps=24) for i in range(8)]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        row = sc.rows([poison])[poison]
        if row.status.terminal:
            break
        if (row.progress or {}).get("stage") == "denoising" and kill_child(row, sc.row):
            sc.figures.faults += 1
            time.sleep(0.5)
        time.sleep(0.05)
    during = latencies(others)
    fig = sc.report(sc.settle(120))
    ratio = statistics.median(during) / statistics.median(baseline)
    fig.notes = f"other jobs' latency p50 {ratio:.2f}x the run without the poison"
    print(fig.notes)
    row = sc.rows([poison])[poison]
    assert row.status == JobStatus.FAILED and row.error_code == "dead_lettered", fig.line()
    assert sc.figures.faults == 3  # attempt cap 3: the fourth delivery is dead-lettered
    _assert_nothing_lost(fig, len(sc.accepted))
    assert len(during) == len(others)
    # Not blocked: other jobs finished while the poison was still being retried (an order
    # of recorded events; the latency ratio is a figure, printed, never asserted: it
    # failed once at 4.5 under load while nothing was blocked).
    rows = sc.rows([poison, *others])
    ahead = [j for j in others if rows[j].finished_at < rows[poison].finished_at]
    assert ahead, "every other job waited for the poison job's end"

    def dead_letters() -> int:
        with broker_connection(stack.env["DIFFQ_BROKER_URL"]) as conn:
            return conn.default_channel.queue_declare("gpu.tiny.dlq", passive=True).message_count

    # The row is failed first, then the message rejected into the dead-letter queue.
    assert wait_until(dead_letters, timeout=30) >= 1


def test_f12_worker_killed_after_recording_before_acking(fault_stack):
    stack = fault_stack
    # One consumer, so the redelivery comes back to it; a fresh supervisor, so the three
    # kills here are not added to earlier scenarios' within its crash window (5 in 600 s).
    stack.stop_workers()
    stack.ensure_workers(["fa"])
    sc = Scenario("F12 kill after record, before ack", stack, stack.new_key())
    try:
        for i in range(3):
            job_id = sc.submit(prompt=f"f12-{i}", steps=30)
            row = wait_until(
                lambda job_id=job_id: (r := sc.rows([job_id])[job_id]).lease_owner and r,
                timeout=60,
            )
            main = worker_main_pid(row)
            assert main is not None
            supervisor = parent_pid(main)
            os.kill(main, signal.SIGSTOP)  # the consumer that would ack is frozen
            wait_until(lambda job_id=job_id: sc.rows([job_id])[job_id].status.terminal, 60)
            kill_worker(main)
            sc.figures.faults += 1
            started = time.monotonic()
            stack.restart_killed_worker(supervisor)
            stack.workers["fa"].wait_for_log(rf"job {job_id} not run: finished", timeout=60)
            sc.figures.recovery_seconds.append(time.monotonic() - started)
    finally:
        stack.ensure_workers()
    fig = sc.report(sc.settle(60))
    _assert_nothing_lost(fig, len(sc.accepted))
    assert fig.succeeded == 3
    assert fig.duplicate_generations == 0


def test_f13_jobs_over_their_time_limit_fail_and_the_worker_keeps_serving(fault_stack):
    stack = fault_stack
    stack.ensure_workers()
    sc = Scenario("F13 job over its time limit", stack, stack.new_key())
    # 256² steps: far past the 2 s soft limit on any core (64² ones can finish in 1.8 s).
    slow = [
        sc.submit(prompt=f"f13-{i}", model="tiny-slow", steps=400, width=256, height=256)
        for i in range(4)
    ]
    after = [sc.submit(prompt=f"f13-after-{i}", steps=10) for i in range(4)]
    sc.figures.faults = len(slow)
    fig = sc.report(sc.settle(120))
    rows = sc.rows()
    assert [rows[j].error_code for j in slow] == ["timeout"] * 4, fig.line()
    assert "time limit of 2s" in rows[slow[0]].error_message
    assert all(rows[j].status == JobStatus.SUCCEEDED for j in after)
    _assert_nothing_lost(fig, len(sc.accepted))


def test_control_without_requeue_on_worker_loss_the_harness_sees_losses(fault_stack):
    """Proof that the harness can see a loss: turn off the safety and count."""
    stack = fault_stack
    stack.stop_relay()  # no reaper either
    stack.stop_workers()
    control = stack.start_worker(
        "control", {"DIFFQ_CELERY_CONFIG": "tests.faults.control_celeryconfig"}
    )
    sc = Scenario("control: reject_on_worker_lost off", stack, stack.new_key())
    try:
        jobs = [sc.submit(prompt=f"ctl-{i}", steps=40) for i in range(4)]
        killed: set[str] = set()
        deadline = time.monotonic() + 90
        while len(killed) < 3 and time.monotonic() < deadline:
            for job_id, row in sc.rows(jobs).items():
                running = (row.progress or {}).get("stage") == "denoising"
                if job_id not in killed and running and kill_child(row, sc.row):
                    killed.add(job_id)
                    sc.figures.faults += 1
            time.sleep(0.05)
        fig = sc.report(sc.settle(8))  # the lost ones never finish: no need to wait longer
        assert fig.lost > 0, fig.line()
    finally:
        control.stop(timeout=60)
        stack.workers.pop("control", None)
        stack.ensure_workers()
        stack.start_relay()
    # The reaper is the second net: their leases have expired, so it requeues them.
    rows = sc.settle(120)
    recovered = sum(row.status == JobStatus.SUCCEEDED for row in rows.values())
    print(f"after the reaper ran: {recovered} of {len(rows)} control jobs succeeded")
    assert recovered == len(rows)
