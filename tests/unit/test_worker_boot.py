"""A worker's start when the broker is away (a cluster node down or cut off): it still
starts whole, and a pool process never fails a task for want of its models.

Found by the quorum-cluster scenarios (tests/faults/test_quorum_cluster.py): a worker
restarted while a node was cut off timed out declaring its queues in worker_init, so the
pool-process hook was never connected, and every job it took failed
"worker runtime not initialised", its message dead-lettered, its row left queued.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

from celery import Celery

from tasks.boot import common, gpu


def test_a_broker_away_at_start_is_logged_not_raised(caplog):
    app = Celery(broker="amqp://guest:guest@127.0.0.1:1//")  # nothing listens on port 1
    app.conf.broker_connection_timeout = 0.2
    app.conf.broker_connection_max_retries = 1
    sender = SimpleNamespace(app=app)
    with caplog.at_level(logging.WARNING, logger=common.__name__):
        common.declare(sender, ["gpu.nowhere"])  # no exception
    assert "not declared at start" in caplog.text, caplog.text


def test_a_pool_process_without_its_runtime_loads_it_before_the_task(monkeypatch):
    loaded = []

    def load_models(**_kwargs):
        loaded.append(True)
        monkeypatch.setattr(gpu, "_runtime", "the runtime")

    monkeypatch.setattr(gpu, "_runtime", None)
    monkeypatch.setattr(gpu, "_queues", ["gpu.tiny"])
    monkeypatch.setattr(gpu, "load_models", load_models)
    assert gpu.runtime() == "the runtime"
    assert gpu.runtime() == "the runtime"
    assert loaded == [True]  # once


def test_the_pool_hook_is_connected_before_the_queues_are_declared():
    """In gpu.start, `declare` (the broker) comes after the pool-process hook."""
    import inspect

    source = inspect.getsource(gpu.start)
    assert source.index("worker_process_init.connect(load_models)") < source.index(
        "declare(sender, queues)"
    )


def test_a_workers_control_queue_can_be_declared_again_from_another_connection():
    """Celery's default exclusive control queue (`<node>.celery.pidbox`) refused the
    declare of a worker that failed over to another cluster node while the node it left
    still held it (RESOURCE_LOCKED), and Celery stopped the worker: the webhook
    deliverer stayed down and a GPU worker reloaded its models."""
    from tasks.celery_app import app

    mailbox = app.control.mailbox
    assert mailbox.queue_exclusive is False
    queue = mailbox.get_queue("worker-x@host")
    assert not queue.exclusive and queue.auto_delete  # still removed once unused
