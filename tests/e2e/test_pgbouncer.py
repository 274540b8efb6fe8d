"""diffq behind PgBouncer in transaction mode (README, "Connection poolers"): an API and a
GPU worker whose pools go through the pooler (`DIFFQ_DATABASE_POOLED=1`), their LISTEN
sessions on PostgreSQL itself (`DIFFQ_DATABASE_LISTEN_URL`), the statement timeout the
database's. Own database, vhost and pooler; the stack's S3."""

from __future__ import annotations

import contextlib
import re
import types
import uuid

import psycopg2
import pytest
import requests

from app.jobs import listener
from testbed import pgbouncer, services
from testbed.jobs import auth, submit, wait_terminal
from testbed.processes import ApiServer, start_worker
from testbed.services import broker_connection
from testbed.stack import QUEUES
from testbed.waiting import wait_until

pytestmark = pytest.mark.services

POOL = 3  # the pooler's server connections for the database

WHY_NOT = pgbouncer.why_not()
if WHY_NOT:
    print(f"\nPgBouncer tests skipped: {WHY_NOT}")
    pytest.skip(f"PgBouncer tests: {WHY_NOT}", allow_module_level=True)


@contextlib.contextmanager
def _admin(database: str):
    """A cursor on the server itself, its connection closed after (not left to count)."""
    conn = psycopg2.connect(services._with_path(services.PG_ADMIN_URL, f"/{database}"))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            yield cur
    finally:
        conn.close()


@pytest.fixture(scope="module")
def pooled(stack):
    from app.broker.topology import declare_topology
    from app.db.migrate import upgrade
    from app.db.session import Database
    from app.keys import create_key, get_or_create_tenant

    name = f"diffq_pooled_{uuid.uuid4().hex[:8]}"
    direct = services.create_database(name)
    upgrade(direct)  # migrations go to PostgreSQL itself
    with _admin("postgres") as cur:
        cur.execute(f"ALTER DATABASE {name} SET statement_timeout = '15s'")
    broker_url = services.create_vhost(name)
    with broker_connection(broker_url) as conn:
        declare_topology(conn, QUEUES)
    bouncer = pgbouncer.PgBouncer(services.PG_ADMIN_URL, POOL).start()
    db = Database(direct, pool_size=1)
    with db.session() as session:
        key = create_key(session, get_or_create_tenant(session, f"pooled-{name}"), "pooled")
    db.dispose()
    env = {
        **stack.env,
        "DIFFQ_DATABASE_URL": bouncer.url(direct),
        "DIFFQ_DATABASE_POOLED": "1",
        "DIFFQ_DATABASE_LISTEN_URL": direct,
        "DIFFQ_BROKER_URL": broker_url,
        # No progress write carries a cancel to the worker before the job would end: it
        # can only arrive by the worker's LISTEN session.
        "DIFFQ_PROGRESS_INTERVAL": "1000",
    }
    processes = []
    try:
        processes.append(ApiServer(env, stack.logs, name="api-pooled").start())
        processes.append(start_worker(env, stack.logs, "worker-pooled", models="tiny"))
        yield types.SimpleNamespace(
            api=processes[0], worker=processes[1], key=key, name=name, bouncer=bouncer, env=env
        )
    finally:
        for process in reversed(processes):
            process.stop()
        bouncer.stop()
        services.delete_vhost(name)
        services.drop_database(name)


def _sessions(name: str) -> list[tuple[str, int]]:
    """The server sessions on the database: (application_name, client port)."""
    with _admin("postgres") as cur:
        cur.execute(
            "SELECT application_name, client_port FROM pg_stat_activity WHERE datname = %s",
            (name,),
        )
        return cur.fetchall()


def test_jobs_run_and_cancels_arrive_behind_the_pooler(pooled):
    api, key = pooled.api, pooled.key
    # `Prefer: wait` is answered on the API's notification of the job's end.
    answer = requests.post(
        f"{api.url}/v1/jobs",
        json={"prompt": "through the pooler", "model": "tiny", "steps": 2},
        headers={**auth(key), "Prefer": "wait=60"},
        timeout=90,
    )
    assert answer.status_code == 200 and answer.json()["status"] == "succeeded", answer.text
    image = requests.get(answer.json()["result"]["images"][0]["url"], timeout=10)
    assert image.content[:8] == b"\x89PNG\r\n\x1a\n"

    total = 400
    long = submit(api.url, key, prompt="long", steps=total, width=256, height=192)

    def first_write_done() -> bool:
        """The run's first progress write (after its claim's) is in: the next is 1000 s
        away, so from here only the LISTEN session can bring the worker a cancel."""
        with _admin(pooled.name) as cur:
            cur.execute("SELECT updated_at > started_at FROM jobs WHERE id = %s", (long["id"],))
            return bool(cur.fetchone()[0])

    wait_until(first_write_done, timeout=120, what="the long job's first progress write")
    sessions = _sessions(pooled.name)
    pooler = pooled.bouncer.server_ports()
    canceled = requests.post(long["urls"]["cancel"], headers=auth(key), timeout=10)
    assert canceled.status_code == 200 and canceled.json()["status"] == "canceled"
    pooled.worker.wait_for_log(rf"job {long['id']} stopped at step \d+", timeout=120)
    stopped = int(re.search(rf"job {long['id']} stopped at step (\d+)", pooled.worker.log())[1])
    listening = [port for app, port in sessions if app == listener.NAME]
    print(
        f"\nbehind PgBouncer: {len(sessions)} server sessions on the database, "
        f"{len(listening)} of them LISTEN, the pooler's {len(pooler)} (its pool {POOL}); "
        f"the canceled job stopped at step {stopped} of {total}"
    )
    assert stopped < total  # the cancel came by LISTEN: no progress write carried it
    # The API and the worker listen on PostgreSQL itself, not through the pooler, whose
    # few server connections carry everything else.
    assert len(listening) >= 2 and not set(listening) & pooler, (sessions, pooler)
    assert len(sessions) - len(listening) <= POOL, (sessions, pooler)
    done = wait_terminal(api.url, key, long["id"])
    assert done["status"] == "canceled"
    assert "statement_timeout" not in pooled.api.log() + pooled.worker.log()  # no warning


def test_the_statement_timeout_is_the_servers_and_its_absence_is_said(pooled):
    from app.db.session import Database

    through = Database(pooled.env["DIFFQ_DATABASE_URL"], pool_size=1, pooled=True)
    bare = Database(pooled.bouncer.url(services.PG_ADMIN_URL), pool_size=1, pooled=True)
    try:
        with through.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "15s"
        assert not through.unbounded_statements()
        assert bare.unbounded_statements()  # a database without the setting: warned of
    finally:
        through.dispose()
        bare.dispose()
    # Without DIFFQ_DATABASE_POOLED, diffq's session options are refused by the pooler.
    refused = Database(pooled.env["DIFFQ_DATABASE_URL"], pool_size=1)
    try:
        with pytest.raises(Exception, match="unsupported startup parameter"):
            refused.ping()
    finally:
        refused.dispose()
