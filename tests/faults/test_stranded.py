"""A delivery the broker strands (workers/stranded.py): a job's message held unacked by
a consumer that does nothing with it, while the one worker of its queue sits idle. This
is what a quorum queue's leader change can leave behind (the message counted as
delivered to a consumer that never got it); here another consumer holds it, which the
worker cannot tell apart. The worker reopens its broker connection, then hands the job
back to the outbox; the relay publishes it again and it runs, once."""

from __future__ import annotations

import contextlib
import time

import pytest

from app.jobs.states import JobStatus
from testbed.services import broker_connection
from testbed.waiting import wait_until
from tests.faults.harness import Scenario

pytestmark = [pytest.mark.faults, pytest.mark.services]

AFTER = 2.0  # the stranded worker's DIFFQ_STRANDED_AFTER


class Holder:
    """A consumer of `queue` that takes one message and keeps it unacked."""

    def __init__(self, url: str, queue: str) -> None:
        self.conn = broker_connection(url)
        self.channel = self.conn.channel()
        self.channel.basic_qos(0, 1, False)
        self.held = []
        self.channel.basic_consume(queue, callback=self.held.append)

    def take(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.held and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                self.conn.drain_events(timeout=0.5)
        assert self.held, "the holder never got the job's message"

    def close(self) -> None:
        self.conn.close()  # the broker hands back what it held


def test_f20_a_stranded_delivery_runs_on_the_idle_worker(fault_stack):
    stack = fault_stack
    stack.stop_workers()
    sc = Scenario("F20 stranded delivery", stack, stack.new_key())
    holder = Holder(stack.env["DIFFQ_BROKER_URL"], "gpu.tiny")
    worker = None
    try:
        job_id = sc.submit(prompt="f20", steps=4)
        assert job_id is not None
        holder.take(timeout=20)
        sc.figures.faults += 1
        held_job = holder.held[0].headers.get("id")
        assert held_job == job_id, "the held message is the job's own"
        started = time.monotonic()
        worker = stack.start_worker("stranded", {"DIFFQ_STRANDED_AFTER": str(AFTER)})
        rows = sc.settle(90)
        waited = time.monotonic() - started
        assert rows[job_id].status == JobStatus.SUCCEEDED, rows[job_id].status
        log = worker.log()
        assert "reopening the broker connection" in log
        assert "handed back to the outbox" in log
        # The held message comes back when its consumer goes: it meets a finished job.
        holder.close()
        wait_until(lambda: f"job {job_id} not run: finished" in worker.log(), timeout=30)
        sc.figures.recovery_seconds.append(waited)
        fig = sc.report(sc.rows())
        print(f"the job ran {waited:.1f} s after the idle worker started (watch: {AFTER:g} s)")
        assert fig.lost == 0 and fig.duplicate_generations == 0, fig.line()
        assert fig.duplicate_results == 0 and fig.undelivered == 0, fig.line()
    finally:
        holder.conn.close()
        if worker is not None:
            worker.stop(timeout=60)
            stack.workers.pop("stranded", None)
        stack.ensure_workers()


def test_reopen_hands_back_what_the_connection_held(fault_stack):
    """RabbitMQ.reopen on a consumer's connection: the delivery it held is ready again,
    redelivered, for the next consumer."""
    from app.broker.rabbitmq import RabbitMQ
    from app.config import load_settings

    url = fault_stack.env["DIFFQ_BROKER_URL"]
    queue = "stranded-reopen"
    with broker_connection(url) as admin:
        channel = admin.channel()
        channel.queue_declare(queue, durable=True, auto_delete=False)
        channel.queue_purge(queue)
        channel.basic_publish(channel.prepare_message(b"held"), exchange="", routing_key=queue)
    holder = Holder(url, queue)
    try:
        holder.take(timeout=10)
        broker = RabbitMQ(load_settings({**fault_stack.env}))
        assert broker.reopen(holder.conn)
        with broker_connection(url) as other:
            channel = other.channel()
            got = None
            deadline = time.monotonic() + 10
            while got is None and time.monotonic() < deadline:
                got = channel.basic_get(queue, no_ack=True)
                time.sleep(0.1)
            assert got is not None, "the held delivery never came back"
            assert got.body == b"held" and got.delivery_info["redelivered"]
            channel.queue_delete(queue)
    finally:
        holder.conn.close()
