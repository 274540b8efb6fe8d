"""tasks/batching.py on RabbitMQ: a batch takes further messages with basic.get, acks
each on its own, and passes back one it does not use as a fresh copy (not redelivered,
which would read as a dead worker's message); closing the connection hands back the rest."""

from __future__ import annotations

import uuid

import pytest

from app.broker.payload import GENERATE_TASK
from testbed.services import broker_connection

pytestmark = pytest.mark.services


@pytest.fixture
def queue(stack):
    from app.broker.topology import dead_letter_queue_name, declare_topology

    name = f"gpu.batch-test-{uuid.uuid4().hex[:8]}"
    with broker_connection(stack.broker_url) as conn:
        declare_topology(conn, [name])
    yield name
    with broker_connection(stack.broker_url) as conn:
        channel = conn.default_channel
        channel.queue_delete(name)
        channel.queue_delete(dead_letter_queue_name(name))


def _send(app, queue: str, job_id: str) -> None:
    from app.broker.topology import work_queue

    payload = {"job_id": job_id}
    app.send_task(GENERATE_TASK, args=[payload], task_id=job_id, queue=work_queue(queue))


def _ready(stack, queue: str) -> int:
    with broker_connection(stack.broker_url) as conn:
        return conn.default_channel.queue_declare(queue, passive=True).message_count


def test_take_ack_pass_back_and_close(stack, queue):
    from app.broker.celery import create_celery
    from app.broker.rabbitmq import BrokerPermits
    from app.config import load_settings
    from app.services import Services

    root = Services(load_settings())  # its own root: the process's stays untouched
    app = create_celery(lambda: root)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    for job_id in ids:
        _send(app, queue, job_id)

    permits = BrokerPermits(app, queue)
    taken = [permits.fetch() for _ in range(3)]
    assert permits.fetch() is None  # the queue is empty: never blocks
    assert [p.payload["job_id"] for p in taken] == ids
    assert not any(p.redelivered for p in taken)
    taken[0].ack()
    taken[1].pass_back()
    # The third is neither acked nor passed: closing hands it back (redelivered).
    permits.close()

    assert _ready(stack, queue) == 2
    again = BrokerPermits(app, queue)
    try:
        back = [again.fetch(), again.fetch()]
        assert again.fetch() is None
        by_id = {p.payload["job_id"]: p for p in back}
        print({job_id: p.redelivered for job_id, p in by_id.items()})
        assert set(by_id) == {ids[1], ids[2]}  # the acked one is gone for good
        assert by_id[ids[1]].redelivered is False  # passed back as a fresh copy
        assert by_id[ids[2]].redelivered is True  # handed back by the closed channel
        for p in back:
            p.ack()
    finally:
        again.close()
        root.close()
    assert _ready(stack, queue) == 0
