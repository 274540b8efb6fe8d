"""A process in a network namespace (testbed/netns.py) reaching the fault stack's broker,
PostgreSQL and S3 through forwarders on the host end of its link, one port per service,
so that `NetNS.partition(port)` cuts it from one of them."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def _through(url: str, host: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def linked_env(stack, ns) -> tuple[dict[str, str], dict[str, int]]:
    """The stack's environment pointed through `ns`'s link, and each service's port there.
    Celery's settings carry a 4 s AMQP heartbeat, so a silent link is noticed in seconds."""
    ports = {
        "broker": ns.forward(stack.rabbit.port),
        "postgres": ns.forward(stack.pg.port),
        "s3": ns.forward(urlsplit(stack.s3.endpoint).port),
    }
    env = {
        **stack.env,
        "DIFFQ_BROKER_URL": _through(
            stack.env["DIFFQ_BROKER_URL"], ns.host_address, ports["broker"]
        ),
        "DIFFQ_DATABASE_URL": _through(
            stack.env["DIFFQ_DATABASE_URL"], ns.host_address, ports["postgres"]
        ),
        "DIFFQ_S3_ENDPOINT_URL": f"http://{ns.host_address}:{ports['s3']}",
        "DIFFQ_CELERY_CONFIG": "tests.faults.partition_celeryconfig",
    }
    return env, ports
