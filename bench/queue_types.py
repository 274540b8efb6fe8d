"""Classic (with priorities) vs quorum queues on the local RabbitMQ, same run, same load.

    .venv/bin/python -m bench.queue_types [--messages 2000]

Publishes persistent messages with publisher confirms, then consumes them with
prefetch 1 and one ack each (how a GPU worker consumes). Ratios are against classic.
"""

from __future__ import annotations

import argparse
import time
import uuid

from kombu import Connection, Consumer, Exchange, Queue

from bench.report import print_table
from testbed import services

KINDS = {
    "classic + x-max-priority (diffq)": {"x-max-priority": 9},
    "quorum + x-delivery-limit": {"x-queue-type": "quorum", "x-delivery-limit": 3},
}


def _run(broker_url: str, arguments: dict, messages: int) -> tuple[float, float]:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    exchange = Exchange(name, type="direct", durable=True)
    queue = Queue(name, exchange, routing_key=name, durable=True, queue_arguments=arguments)
    body = {"v": 2, "job_id": str(uuid.uuid4()), "tenant": str(uuid.uuid4())}
    with Connection(broker_url, transport_options={"confirm_publish": True}) as conn:
        channel = conn.channel()
        queue(channel).declare()
        producer = conn.Producer(channel, exchange=exchange, serializer="json")
        started = time.perf_counter()
        for _ in range(messages):
            producer.publish(body, routing_key=name, delivery_mode=2)
        publish_rate = messages / (time.perf_counter() - started)

        received = 0

        def on_message(_body, message):
            nonlocal received
            message.ack()
            received += 1

        consume_channel = conn.channel()
        consume_channel.basic_qos(0, 1, False)
        with Consumer(consume_channel, queues=[queue], callbacks=[on_message]):
            started = time.perf_counter()
            while received < messages:
                conn.drain_events(timeout=10)
            consume_rate = messages / (time.perf_counter() - started)
        queue(channel).delete()
        exchange(channel).delete()
    return publish_rate, consume_rate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args()
    vhost = f"diffq-bench-{uuid.uuid4().hex[:8]}"
    broker_url = services.create_vhost(vhost)
    try:
        results = {
            kind: _run(broker_url, arguments, args.messages) for kind, arguments in KINDS.items()
        }
    finally:
        services.delete_vhost(vhost)
    base_publish, base_consume = next(iter(results.values()))
    rows = [
        {
            "queue": kind,
            "publish msg/s (confirms)": publish,
            "consume msg/s (prefetch 1, ack)": consume,
            "publish ratio": publish / base_publish,
            "consume ratio": consume / base_consume,
        }
        for kind, (publish, consume) in results.items()
    ]
    print_table(
        f"RabbitMQ queue types, {args.messages} persistent messages each",
        rows,
        list(rows[0]),
    )


if __name__ == "__main__":
    main()
