"""Private databases on PostgreSQL and private vhosts on RabbitMQ, for one test session."""

from __future__ import annotations

import os
import shutil
import subprocess
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg2
from kombu import Connection
from psycopg2 import sql

PG_ADMIN_URL = os.environ.get("DIFFQ_TEST_PG_URL", "postgresql://root@127.0.0.1:5432/postgres")
AMQP_URL = os.environ.get("DIFFQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672")

# How long a test's own AMQP connection may take to open, its handshake included. kombu's
# default is 5 s: a RabbitMQ node just booted, with the suite's four processes starting
# their stacks at once on two cores, once took longer (a fault stack's first declare).
CONNECT_TIMEOUT = 60.0


def broker_connection(url: str, **options) -> Connection:
    """A kombu connection for a test's own declarations and reads: a slow handshake is
    waited for, up to CONNECT_TIMEOUT, since it is not what the test is about."""
    return Connection(url, connect_timeout=CONNECT_TIMEOUT, **options)


def _with_path(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def create_database(name: str) -> str:
    """Create database `name` and return its SQLAlchemy URL."""
    conn = psycopg2.connect(PG_ADMIN_URL)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    conn.close()
    return _with_path(PG_ADMIN_URL, f"/{name}").replace(
        "postgresql://", "postgresql+psycopg2://", 1
    )


def drop_database(name: str) -> None:
    conn = psycopg2.connect(PG_ADMIN_URL)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    conn.close()


def _rabbitmqctl(*args: str) -> None:
    ctl = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    subprocess.run([ctl, "-q", *args], check=True, capture_output=True, timeout=60)


def create_vhost(name: str) -> str:
    """A fresh vhost for this session (needs local rabbitmqctl); returns its AMQP URL."""
    user = urlsplit(AMQP_URL).username or "guest"
    _rabbitmqctl("add_vhost", name)
    _rabbitmqctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
    return f"{AMQP_URL.rstrip('/')}/{quote(name, safe='')}"


def delete_vhost(name: str) -> None:
    _rabbitmqctl("delete_vhost", name)


def queue_state(broker_url: str, queue: str) -> tuple[int, int]:
    """(messages ready, consumers) of an existing queue, by passive declare."""
    with broker_connection(broker_url) as conn:
        channel = conn.channel()
        try:
            _name, messages, consumers = channel.queue_declare(queue=queue, passive=True)
        finally:
            channel.close()
    return messages, consumers
