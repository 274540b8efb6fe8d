"""Connections a client (or a load balancer) reuses: kept alive longer than common idle
timeouts; an oversized body answered with its 413, unread, and a new connection."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
import requests

from testbed.jobs import auth

pytestmark = pytest.mark.services

IDLE_SECONDS = (1, 2, 3, 5, 30)


def test_a_session_reused_after_idle_spells_gets_answers(api_server, tenant_key):
    """One `requests.Session` per idle spell, all spells at once (the longest sets the
    test's length): request, wait, request again on the pooled connection."""
    failures: dict[int, str] = {}
    reused: dict[int, bool] = {}

    def spell(idle: int) -> None:
        with requests.Session() as session:
            try:
                first = session.get(f"{api_server.url}/v1/jobs", headers=auth(tenant_key))
                sock = _socket_of(session)
                time.sleep(idle)
                second = session.get(f"{api_server.url}/v1/jobs", headers=auth(tenant_key))
                reused[idle] = _socket_of(session) is sock and sock is not None
                if (first.status_code, second.status_code) != (200, 200):
                    failures[idle] = f"{first.status_code}, {second.status_code}"
            except requests.RequestException as exc:
                failures[idle] = repr(exc)

    threads = [threading.Thread(target=spell, args=(idle,)) for idle in IDLE_SECONDS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"\nreused after idle {list(IDLE_SECONDS)} s: {reused}; failures: {failures}")
    assert failures == {}
    assert all(reused[idle] for idle in IDLE_SECONDS), reused


def _socket_of(session: requests.Session):
    pool = next(iter(session.adapters["http://"].poolmanager.pools._container.values()), None)
    if pool is None or pool.pool is None or pool.pool.empty():
        return None
    conn = pool.pool.queue[-1]
    return conn.sock if conn is not None else None


def test_oversized_bodies_get_a_413_naming_the_limit_and_a_new_connection(api_server, tenant_key):
    """A body announced over the limit is refused from its head, unread (app/web/
    request_reader.py), and its connection then closes: the client gets the 413, not a
    reset, even while it is still sending, and its next request a new connection."""
    from app.config import load_settings

    limit = load_settings().max_body_bytes
    body = json.dumps({"prompt": "x", "metadata": {"pad": "y" * (limit + 1)}}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", api_server.port, timeout=30)
    headers = {**auth(tenant_key), "Content-Type": "application/json"}
    answers, sockets = [], set()
    try:
        for _ in range(50):
            conn.request("POST", "/v1/jobs", body=body, headers=headers)
            sockets.add(id(conn.sock))
            response = conn.getresponse()
            answers.append((response.status, response.getheader("Connection"), response.read()))
        conn.request("GET", "/v1/jobs", headers=headers)
        after = conn.getresponse()
        after.read()
    finally:
        conn.close()
    statuses = {status for status, _, _ in answers}
    print(f"\n50 oversized POSTs: statuses {statuses}, connections {len(sockets)}")
    assert statuses == {413}
    assert {connection for _, connection, _ in answers} == {"close"}
    assert after.status == 200
    message = json.loads(answers[-1][2])["message"]
    assert f"the limit is {limit} bytes" in message and f"is {len(body)} bytes" in message
    assert "DIFFQ_MAX_BODY_BYTES" in message
