"""Rate limits and queued-job caps hold exactly across several API processes, and a
revoked key is refused at once."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from testbed.jobs import auth
from testbed.processes import ApiServer, ManagedProcess
from testbed.waiting import wait_until

pytestmark = pytest.mark.services

RATE = 20
QUEUED_CAP = 5
IN_FLIGHT_CAP = 2


@pytest.fixture(scope="module")
def limited(stack):
    env = {
        **stack.env,
        "DIFFQ_RATE_LIMIT": str(RATE),
        "DIFFQ_MAX_QUEUED": str(QUEUED_CAP),
        "DIFFQ_MAX_RUNNING": str(IN_FLIGHT_CAP),
    }
    # Two gunicorn processes: a per-process counter would let twice the limit through.
    api = ApiServer(env, stack.logs, name="api-limits", workers=2).start()
    relay = ManagedProcess(
        "relay-limits",
        [sys.executable, "-m", "cli", "relay", "--interval", "0.2"],
        env,
        stack.logs,
    ).start()
    yield api
    relay.stop()
    api.stop()


def _burst(count: int, call) -> list[requests.Response]:
    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(lambda _i: call(), range(count)))


def test_the_request_rate_limit_is_exact_across_processes(limited, tenant_key):
    url = f"{limited.url}/v1/jobs?limit=1"
    into_minute = time.time() % 60  # windows are wall-clock minutes: keep to one
    if into_minute > 50:
        time.sleep(60.5 - into_minute)
    answers = _burst(3 * RATE, lambda: requests.get(url, headers=auth(tenant_key), timeout=10))
    codes = [a.status_code for a in answers]
    refused = [a for a in answers if a.status_code == 429]
    print(
        f"\nburst of {len(codes)} requests, limit {RATE}/min: {codes.count(200)} answered, "
        f"{len(refused)} refused with 429"
    )
    assert codes.count(200) == RATE
    assert codes.count(200) + len(refused) == len(codes)
    assert all(0 < int(a.headers["Retry-After"]) <= 60 for a in refused)
    assert "Rate limit" in refused[0].json()["message"]


def test_the_queued_job_cap_is_exact_under_a_burst(limited, other_key):
    # Model tiny-b has no worker in this session: its jobs stay queued.
    def post():
        return requests.post(
            f"{limited.url}/v1/jobs",
            json={"prompt": "cap", "model": "tiny-b"},
            headers=auth(other_key),
            timeout=10,
        )

    answers = _burst(12, post)
    codes = [a.status_code for a in answers]
    print(
        f"\nburst of 12 submits, cap {QUEUED_CAP} queued: {codes.count(202)} accepted, "
        f"{codes.count(429)} refused"
    )
    assert codes.count(202) == QUEUED_CAP and codes.count(429) == 12 - QUEUED_CAP
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.headers["Retry-After"] and "queued jobs" in refused.json()["message"]
    for answer in answers:  # cancel what was accepted: a slot frees at once
        if answer.status_code == 202:
            cancel = f"{limited.url}/v1/jobs/{answer.json()['id']}/cancel"
            assert requests.post(cancel, headers=auth(other_key), timeout=10).status_code == 200
    again = post()
    assert again.status_code == 202
    cancel = f"{limited.url}/v1/jobs/{again.json()['id']}/cancel"
    assert requests.post(cancel, headers=auth(other_key), timeout=10).status_code == 200


def test_a_revoked_key_is_refused_at_once(limited, stack, db):
    from app.keys import create_key, get_or_create_tenant, key_id_of

    with db.session() as session:
        key = create_key(session, get_or_create_tenant(session, "revocation"), "to revoke")
    url = f"{limited.url}/v1/jobs?limit=1"
    assert requests.get(url, headers=auth(key), timeout=10).status_code == 200
    listed = subprocess.run(
        [sys.executable, "-m", "cli", "keys", "list", "--tenant", "revocation"],
        env=stack.env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert key_id_of(key) in listed.stdout and "active" in listed.stdout
    assert key not in listed.stdout  # never the secret
    subprocess.run(
        [sys.executable, "-m", "cli", "keys", "revoke", key_id_of(key)],
        env=stack.env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert requests.get(url, headers=auth(key), timeout=10).status_code == 401


def test_a_database_dump_holds_no_usable_key(stack, db):
    import hashlib
    import shutil

    from app.keys import create_key, get_or_create_tenant

    with db.session() as session:
        key = create_key(session, get_or_create_tenant(session, "dumped"), "dump")
    pg_dump = shutil.which("pg_dump") or "/usr/lib/postgresql/15/bin/pg_dump"
    url = stack.database_url.replace("+psycopg2", "")
    dump = subprocess.run(
        [pg_dump, "--data-only", "--table=api_keys", url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    secret = key.split("_", 2)[2]  # dq_<id>_<secret>; the secret itself may hold "_"
    assert len(secret) == 43
    assert hashlib.sha256(key.encode()).hexdigest() in dump  # the row is in the dump
    assert key not in dump and secret not in dump  # but nothing that authenticates


def test_a_tenant_has_at_most_its_cap_of_jobs_in_flight(limited, tenant_key, db):
    """Jobs over the cap wait in PostgreSQL, unpublished; the relay lets the next one
    through as soon as one in flight ends."""
    from app.db.models.jobs import Job

    def post(i):
        body = {"prompt": f"held-{i}", "model": "tiny-b"}  # no worker: nothing finishes
        response = requests.post(
            f"{limited.url}/v1/jobs", json=body, headers=auth(tenant_key), timeout=10
        )
        assert response.status_code == 202, response.text
        return response.json()["id"]

    ids = [post(i) for i in range(QUEUED_CAP)]

    def rows():
        with db.session() as session:
            return {str(j.id): j for j in session.query(Job).filter(Job.id.in_(ids))}

    def in_flight():
        return [j for j, row in rows().items() if row.admitted_at and row.status.value == "queued"]

    first = in_flight()
    assert len(first) == IN_FLIGHT_CAP
    # Confirms are recorded in batches, a few milliseconds after the 202.
    wait_until(lambda: all(rows()[j].published_at is not None for j in first), timeout=5)
    held = [j for j in ids if j not in first]
    assert all(rows()[j].published_at is None for j in held)  # never reached the broker

    cancel = f"{limited.url}/v1/jobs/{first[0]}/cancel"
    assert requests.post(cancel, headers=auth(tenant_key), timeout=10).status_code == 200
    released = wait_until(lambda: (now := in_flight()) and len(now) == IN_FLIGHT_CAP and now, 10)
    newcomer = (set(released) - set(first)).pop()
    assert newcomer == held[0]  # oldest first
    wait_until(lambda: rows()[newcomer].published_at is not None, timeout=10)
    print(
        f"\nin-flight cap {IN_FLIGHT_CAP}: {len(ids)} submitted, {len(first)} let through, "
        f"the next released after a cancel"
    )
    for job_id in ids:  # leave nothing queued for the tests after this one
        requests.post(
            f"{limited.url}/v1/jobs/{job_id}/cancel", headers=auth(tenant_key), timeout=10
        )
