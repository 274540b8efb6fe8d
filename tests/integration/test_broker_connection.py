"""The suite's own AMQP connections wait out a slow handshake (testbed/services.py
`broker_connection`). A fault stack's first declare once failed with kombu's default 5 s:
its RabbitMQ node had just booted while the suite's four processes started their stacks
on two cores. Here the window is widened on purpose: a proxy holds every handshake 6 s."""

from __future__ import annotations

import pytest
from kombu import Connection
from kombu.exceptions import OperationalError

from testbed.faultproxy import FaultProxy
from testbed.services import broker_connection

pytestmark = pytest.mark.services


def _through(proxy: FaultProxy, broker_url: str) -> str:
    _scheme, rest = broker_url.split("://", 1)
    credentials, hostpath = rest.split("@", 1)
    vhost = hostpath.split("/", 1)[1] if "/" in hostpath else ""
    return f"amqp://{credentials}@127.0.0.1:{proxy.port}/{vhost}"


def test_a_handshake_slower_than_kombus_default_is_waited_for(stack):
    port = int(stack.broker_url.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    proxy = FaultProxy(port).start()
    proxy.lag = 6.0
    url = _through(proxy, stack.broker_url)
    try:
        # kombu's default bound (5 s) gives up on the handshake: the fault stack's flake.
        slow = (OperationalError, TimeoutError)
        with pytest.raises(slow, match="timed out"), Connection(url) as plain:
            plain.connect()
        with broker_connection(url) as conn:
            conn.connect()
            name, _messages, _consumers = conn.default_channel.queue_declare(
                "gpu.tiny", passive=True
            )
        assert name == "gpu.tiny"
    finally:
        proxy.stop()
