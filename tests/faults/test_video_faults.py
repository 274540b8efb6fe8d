"""Video jobs under faults: a worker killed mid-clip, and RabbitMQ's consumer_timeout (the
channel of a delivery left unacked too long is closed and the message requeued), with
the catalog check that keeps the time limit of every model whose jobs cannot span
deliveries inside it (those that checkpoint hand back before it:
tests/faults/test_delivery_handback.py)."""

from __future__ import annotations

import contextlib
import sys
import time

import pytest
import requests

from app.jobs.states import JobStatus
from testbed.jobs import auth
from testbed.processes import ManagedProcess
from testbed.services import broker_connection
from testbed.waiting import wait_until
from tests.faults.harness import REPORT, Figures, Scenario
from tests.faults.killing import kill_child

pytestmark = [pytest.mark.faults, pytest.mark.services]

# A clip whose denoising lasts long enough to be seen and killed late: the tiny LTX-Video
# takes about 5 ms a step on one core, so 400 steps give two seconds or more of
# "denoising" rows (progress is written at most every 0.1 s on the fault stack), and the
# fault catalog's `checkpoint_seconds = 0.2` stores its state several times a second.
CLIP = {
    "kind": "txt2vid",
    "model": "tiny-video",
    "num_frames": 25,
    "steps": 400,
    "width": 64,
    "height": 64,
}
KILLS = 3
LATE = 0.8  # killed once past this share of its steps, with a checkpoint stored


def _late(sc: Scenario, spared: set[str]):
    """A clip past LATE of its steps, with a checkpoint stored, not killed yet."""
    for job_id, row in sc.rows().items():
        progress = row.progress or {}
        if (
            job_id not in spared
            and row.status == JobStatus.RUNNING
            and progress.get("stage") == "denoising"
            and progress.get("step", 0) >= LATE * CLIP["steps"]
            and row.checkpoint_step is not None
        ):
            return row
    return None


def _job(stack, key: str, job_id: str) -> dict:
    answer = requests.get(f"{stack.api.url}/v1/jobs/{job_id}", headers=auth(key), timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_f21_video_worker_killed_late_in_a_clip_resumes_from_its_checkpoint(fault_stack):
    """kill -9 of the pool process at about 80 % of a clip, once for each of 3 clips:
    each clip resumes on the restarted process from the checkpoint stored before the
    kill (never from step 0), succeeds once, one MP4 of every frame stored, one webhook
    delivered; its poster is the bytes of the same clip run without a kill. Prints the
    steps and GPU-seconds run twice."""
    stack = fault_stack
    stack.start_video_worker()
    try:
        sc = Scenario(f"F21 kill -9 at {LATE:.0%} of a clip, {KILLS} clips", stack, stack.new_key())
        for i in range(KILLS):
            sc.submit(prompt=f"f21-{i}", seed=i, **CLIP)
        assert len(sc.accepted) == KILLS, sc.figures.line()
        killed: dict[str, tuple[int, int]] = {}  # job: (its last step seen, its checkpoint's)
        deadline = time.monotonic() + 240
        while len(killed) < KILLS and time.monotonic() < deadline:
            rows = sc.rows()
            if all(row.status.terminal or job_id in killed for job_id, row in rows.items()):
                # A clip ended between the last look and its kill: keep one in flight.
                sc.submit(prompt=f"f21-more-{len(rows)}", seed=len(rows), **CLIP)
                continue
            victim = _late(sc, set(killed))
            if victim is None:
                time.sleep(0.02)
                continue
            started = time.monotonic()
            if kill_child(victim, sc.row, lambda: sc.rows().values()):
                job_id = str(victim.id)
                dead = sc.row(job_id)  # the dead run's last writes
                killed[job_id] = (dead.progress["step"], dead.checkpoint_step)
                sc.figures.faults += 1
                wait_until(
                    lambda job_id=job_id, attempts=victim.attempts: (
                        sc.row(job_id).attempts > attempts or sc.row(job_id).status.terminal
                    ),
                    timeout=90,
                    what=f"clip {job_id} claimed again after its kill",
                )
                sc.figures.recovery_seconds.append(time.monotonic() - started)
        rows = sc.settle(180)
        fig = sc.report(rows)
        assert sc.figures.faults == KILLS, fig.line()
        assert fig.lost == 0, fig.line()
        assert fig.duplicate_results == 0, fig.line()
        assert fig.duplicate_terminal == 0 and fig.duplicate_deliveries == 0, fig.line()
        assert fig.undelivered == 0, fig.line()  # every clip's job.succeeded webhook came
        assert fig.succeeded == len(sc.accepted), fig.line()
        repeated = []
        for job_id, (seen, stored) in killed.items():
            job = _job(stack, sc.key, job_id)
            resumes = job["result"]["manifest"]["resumes"]
            resumed = resumes[-1]["from_step"]
            # Resumed at the checkpoint stored before the kill, or a later one whose upload
            # had ended (the row names it a moment after the object exists).
            assert stored <= resumed <= CLIP["steps"], (job_id, stored, resumes)
            per_step = job["cost"]["gpu_seconds"] / (CLIP["steps"] - resumed + 1)
            repeated.append((max(0, seen - resumed), per_step))
            # Gone with the job's end: the post-processing thread removes the checkpoint
            # right after it records the success, so the row may be read in between.
            wait_until(
                lambda job_id=job_id: (
                    sc.row(job_id).checkpoint_step is None
                    and [k.rsplit("/", 1)[1] for k in sorted(stack.objects_of(sc.row(job_id)))]
                    == ["0.mp4", "0.png"]
                ),
                timeout=30,
                what=f"job {job_id}'s checkpoint removed after its end",
            )
        steps_twice = [steps for steps, _ in repeated]
        seconds_twice = [steps * per_step for steps, per_step in repeated]
        sc.figures.notes = (
            f"killed at steps {'/'.join(str(k[0]) for k in killed.values())} of "
            f"{CLIP['steps']}; steps run twice {'/'.join(map(str, steps_twice))} "
            f"({max(seconds_twice):.2f} GPU-s at most; checkpoint interval 0.2 s)"
        )
        print(sc.figures.notes)
        # The clip of one killed job run again without a kill: the same frames.
        first = next(iter(killed))
        index = sc.accepted.index(first)
        twin = sc.submit(
            prompt=f"f21-{index}" if index < KILLS else f"f21-more-{index}",
            seed=index,
            cache=False,
            **CLIP,
        )
        assert twin is not None
        sc.settle(120)
        posters = []
        for job_id in (first, twin):
            job = _job(stack, sc.key, job_id)
            assert job["status"] == "succeeded", job
            (poster,) = job["result"]["images"]
            posters.append(requests.get(poster["url"], timeout=30).content)
            (video,) = job["result"]["videos"]
            from workers.video import probe

            clip = probe(requests.get(video["url"], timeout=30).content)
            assert clip["codec"] == "h264" and clip["frames"] == CLIP["num_frames"], clip
        assert posters[0] == posters[1]
    finally:
        stack.stop_workers(["video"])  # two cores: no idle model process left for others


def test_f23_a_spot_notice_checkpoints_the_clip_and_hands_it_back(fault_stack):
    """SIGTERM (a spot node's notice, a deploy) to a worker mid-clip: the clip, far from
    its end, stores its state at its next step and goes back to the queue at once (not
    after DIFFQ_SHUTDOWN_GRACE); a worker started later resumes it at that step. One
    result, one webhook. Prints the seconds from the signal to the checkpoint stored and
    the message back in the queue (goal: 10 s)."""
    import threading

    stack = fault_stack
    # Any clip with more than 0 s left leaves at once: the tiny clip is short.
    stack.start_video_worker("spot", {"DIFFQ_SHUTDOWN_FINISH": "0"})
    sc = Scenario("F23 spot notice mid-clip", stack, stack.new_key())

    def ready() -> int:
        with broker_connection(stack.env["DIFFQ_BROKER_URL"]) as conn:
            return conn.default_channel.queue_declare("gpu.tiny-video", passive=True).message_count

    try:
        job_id = sc.submit(prompt="f23", seed=23, **CLIP)
        assert job_id is not None, sc.figures.line()
        wait_until(
            lambda: (sc.row(job_id).progress or {}).get("step", 0) >= CLIP["steps"] // 4,
            timeout=120,
            interval=0.02,
            what="the clip a quarter through its steps",
        )
        noticed = time.monotonic()
        stopping = threading.Thread(target=stack.stop_workers, args=(["spot"],))
        stopping.start()

        def handed_back():
            row = sc.row(job_id)
            back = row.status == JobStatus.QUEUED and row.checkpoint_step is not None
            return row if back and ready() >= 1 else None

        row = wait_until(handed_back, timeout=60, interval=0.02, what="the clip handed back")
        handed = time.monotonic() - noticed
        stopping.join(90)
        stored_step = row.checkpoint_step
        sc.figures.faults = 1
        sc.figures.recovery_seconds.append(handed)
        stack.start_video_worker()
        rows = sc.settle(180)
        fig = sc.report(rows)
        job = _job(stack, sc.key, job_id)
        resumes = job["result"]["manifest"]["resumes"]
        sc.figures.notes = (
            f"signal to checkpoint stored and message requeued {handed:.2f} s (goal 10 s); "
            f"handed back at step {stored_step} of {CLIP['steps']}; resumed {resumes}"
        )
        print(sc.figures.notes)
        assert fig.lost == 0 and fig.succeeded == 1, fig.line()
        assert fig.duplicate_results == 0 and fig.duplicate_terminal == 0, fig.line()
        assert fig.undelivered == 0 and fig.duplicate_deliveries == 0, fig.line()
        assert CLIP["steps"] // 4 <= stored_step < CLIP["steps"]
        assert [r["from_step"] for r in resumes] == [stored_step]
        assert rows[job_id].attempts == 1  # a hand-back spends no attempt
    finally:
        stack.stop_workers(["spot", "video"])


def test_f22_consumer_timeout_closes_the_channel_and_requeues(tmp_path):
    """RabbitMQ 3.10 closes the channel of a delivery left unacked past consumer_timeout
    (PRECONDITION_FAILED) and requeues the message: the next consumer gets it again,
    marked redelivered. Shown with kombu on a node of its own whose timeout is 2 s,
    checked every second instead of every minute."""
    from amqp.exceptions import PreconditionFailed
    from kombu import Consumer, Producer, Queue

    from testbed.private_rabbit import PrivateRabbitMQ

    rabbit = PrivateRabbitMQ(tmp_path / "rabbit", consumer_timeout_ms=2000, channel_tick_ms=1000)
    rabbit.start()
    try:
        # What the node runs with: both files were read.
        assert rabbit.app_env("consumer_timeout") == "{ok,2000}"
        assert rabbit.app_env("channel_tick_interval") == "{ok,1000}"
        fig = Figures("F22 consumer_timeout, unacked delivery")
        queue = Queue("f22", durable=True)
        deliveries: list[dict] = []
        with broker_connection(rabbit.url) as holder, broker_connection(rabbit.url) as taker:
            Producer(holder.default_channel).publish(
                {"job": "f22"}, routing_key="f22", declare=[queue], delivery_mode=2
            )
            fig.submitted = 1
            # One consumer takes the message and never acks it (a job running too long).
            channel = holder.channel()
            channel.basic_qos(0, 1, False)
            held = Consumer(
                channel,
                [queue],
                callbacks=[lambda _body, message: deliveries.append(message.delivery_info)],
                accept=["json"],
            )
            held.consume()
            holder.drain_events(timeout=10)
            assert len(deliveries) == 1 and deliveries[0]["redelivered"] is False
            taken = time.monotonic()
            closed: list[PreconditionFailed] = []

            def channel_closed() -> bool:
                try:
                    holder.drain_events(timeout=1)
                except TimeoutError:
                    return False
                except PreconditionFailed as exc:
                    closed.append(exc)
                    return True
                return False

            wait_until(channel_closed, timeout=60, interval=0, what="the held channel closed")
            held_for = time.monotonic() - taken
            error = closed[0]
            fig.faults = 1
            print(f"\nheld {held_for:.1f} s: {error.reply_code} {error.reply_text}")
            assert error.reply_code == 406
            assert "PRECONDITION_FAILED" in error.reply_text
            assert f"delivery acknowledgement on channel {channel.channel_id} timed out" in (
                error.reply_text
            )
            assert holder.connected  # the channel closed, not the connection
            # The message went back to the queue: another consumer gets it, redelivered.
            Consumer(
                taker.channel(),
                [queue],
                callbacks=[
                    lambda _body, message: (deliveries.append(message.delivery_info), message.ack())
                ],
                accept=["json"],
            ).consume()

            def delivered_again() -> bool:
                with contextlib.suppress(TimeoutError):
                    taker.drain_events(timeout=1)
                return len(deliveries) == 2

            wait_until(delivered_again, timeout=30, interval=0, what="the message given again")
            assert deliveries[1]["redelivered"] is True
            left = taker.default_channel.queue_declare("f22", passive=True).message_count
            assert left == 0
        fig.succeeded = 1  # acked by the second consumer
        fig.duplicate_generations = len(deliveries) - 1  # the held delivery, given again
        fig.recovery_seconds.append(held_for)
        fig.notes = f"{len(deliveries)} deliveries; {error.reply_text.split('. ')[0]}"
        REPORT.append(fig)
        print(fig.line())
        assert fig.duplicate_generations == 1
    finally:
        rabbit.close()


LONG_MODEL = """\
default_model = "tiny-long"

[models.tiny-long]
path = "{tiny}"
queue = "gpu.tiny-long"
dtype = "float32"
default_width = 64
default_height = 64
default_steps = 2
soft_time_limit = 1550
time_limit = 1600
checkpoint_seconds = 0
"""


def _worker(env: dict[str, str], logs, name: str, model: str) -> tuple[ManagedProcess, str]:
    """`diffq worker --gpus none --models MODEL`, until it exits (refused) or is ready."""
    models = ("--models", model)
    worker = ManagedProcess(
        name,
        [sys.executable, "-m", "cli", "worker", "--gpus", "none", "--name", name, *models],
        env,
        logs,
    ).start()

    def settled() -> str | None:
        if worker.process.poll() is not None:
            return "exited"
        return "ready" if worker.count(r"ready\.") else None

    try:
        return worker, wait_until(settled, timeout=180, interval=0.1, what=f"{name} settled")
    except BaseException:
        worker.stop()
        raise


def test_a_time_limit_past_the_consumer_timeout_is_refused(fault_stack, tmp_path):
    """A model whose jobs cannot span deliveries (no checkpoints, or batched) and whose
    time_limit does not end 300 s before the broker's consumer_timeout
    (DIFFQ_BROKER_CONSUMER_TIMEOUT, 1800 s by default) would have its messages requeued
    mid-job (test_f22): its worker refuses to start, naming consumer_timeout. With the
    setting raised (the broker's consumer_timeout raised with it) the worker starts; with
    it lowered, a batching model that fits the default is refused. The same model with
    checkpoints fits the default: its deliveries hand back before the timeout."""

    from app.broker.topology import declare_topology
    from app.catalog import load_catalog
    from app.config import load_settings

    stack = fault_stack
    models = tmp_path / "models.toml"
    models.write_text(LONG_MODEL.format(tiny=stack.logs.parent / "models" / "tiny"))
    env = {**stack.env, "DIFFQ_MODELS_FILE": str(models)}
    env.pop("DIFFQ_BROKER_CONSUMER_TIMEOUT", None)

    refused, outcome = _worker(env, tmp_path, "worker-long-default", "tiny-long")
    print(f"\ndefault setting: {outcome}, exit {refused.process.returncode}: {refused.log()}")
    assert outcome == "exited" and refused.process.returncode == 2, refused.log()
    assert "consumer_timeout" in refused.log() and "'tiny-long'" in refused.log()
    assert "time_limit 1600s" in refused.log()

    # The fault catalog's tiny-batch (time_limit 90 s, max_batch 4) past 380 - 300 s.
    lowered, outcome = _worker(
        {**stack.env, "DIFFQ_BROKER_CONSUMER_TIMEOUT": "380"}, tmp_path, "worker-low", "tiny"
    )
    print(f"setting 380: {outcome}, exit {lowered.process.returncode}: {lowered.log()}")
    assert outcome == "exited" and lowered.process.returncode == 2, lowered.log()
    assert "consumer_timeout" in lowered.log() and "'tiny-batch'" in lowered.log()

    models.write_text(LONG_MODEL.replace("checkpoint_seconds = 0\n", "").format(tiny="/m"))
    spans = load_catalog(load_settings(env)).models["tiny-long"]
    assert spans.spans_deliveries and spans.time_limit == 1600
    models.write_text(LONG_MODEL.format(tiny=stack.logs.parent / "models" / "tiny"))

    with broker_connection(stack.env["DIFFQ_BROKER_URL"]) as conn:
        declare_topology(conn, ["gpu.tiny-long"])
    try:
        raised, outcome = _worker(
            {**env, "DIFFQ_BROKER_CONSUMER_TIMEOUT": "3600"},
            tmp_path,
            "worker-long-raised",
            "tiny-long",
        )
        try:
            print(f"setting 3600: {outcome}")
            assert outcome == "ready", raised.log()[-3000:]
            assert "consumer_timeout" not in raised.log()
        finally:
            raised.stop()
    finally:
        with broker_connection(stack.env["DIFFQ_BROKER_URL"]) as conn:
            for queue in ("gpu.tiny-long", "gpu.tiny-long.dlq"):
                conn.default_channel.queue_delete(queue)
