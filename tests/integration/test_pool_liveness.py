"""The pool's checkout (app/db/session.py): a connection the server ended is swapped for
a fresh one without a ping; only one idle for long is pinged."""

from __future__ import annotations

import time

import psycopg2
import pytest

from app.db import session as db_session
from app.db.session import make_engine
from testbed.waiting import wait_until

pytestmark = pytest.mark.services


def _last_query(dsn: str, pid: int) -> str | None:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", (pid,))
        row = cur.fetchone()
    conn.close()
    return row[0] if row else None


def _backend_pid(engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()


@pytest.fixture
def engine(db):
    engine = make_engine(db.url, pool_size=1)
    yield engine
    engine.dispose()


@pytest.fixture
def dsn(db) -> str:
    return db.url.replace("postgresql+psycopg2", "postgresql")


def test_a_connection_the_server_ended_is_replaced_without_an_error(engine, dsn):
    pid = _backend_pid(engine)
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
    conn.close()
    wait_until(lambda: _last_query(dsn, pid) is None, timeout=5)
    # The pooled connection is dead; the checkout notices and gives a new one.
    assert _backend_pid(engine) != pid


def test_a_recently_used_connection_is_not_pinged(engine, dsn, monkeypatch):
    monkeypatch.setattr(db_session, "PING_AFTER_IDLE", 60.0)
    pid = _backend_pid(engine)
    with engine.connect():  # checked out: polled, not pinged
        assert _last_query(dsn, pid) != "SELECT 1"


def test_a_connection_idle_for_long_is_pinged(engine, dsn, monkeypatch):
    pid = _backend_pid(engine)
    monkeypatch.setattr(db_session, "PING_AFTER_IDLE", 0.0)
    time.sleep(0.01)
    with engine.connect():
        assert _last_query(dsn, pid) == "SELECT 1"
