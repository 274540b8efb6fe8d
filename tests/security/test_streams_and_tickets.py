"""Through gunicorn: open streams capped per tenant and per process without touching
other tenants, and WebSocket tickets that open one socket, for their tenant only, from
an allowed origin, and never reach the access log."""

from __future__ import annotations

import contextlib
import re

import pytest
import requests
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from testbed.jobs import auth, submit
from testbed.waiting import wait_until

from .conftest import PROCESS_STREAMS, PUBLIC_URL, TENANT_STREAMS, new_key

pytestmark = pytest.mark.services


def _queued(server, key: str, prompt: str = "held") -> dict:
    return submit(server.url, key, prompt=prompt, model="tiny-b", steps=2)


def _sse(server, key: str, job_id: str) -> requests.Response:
    return requests.get(
        f"{server.url}/v1/jobs/{job_id}/events", headers=auth(key), stream=True, timeout=10
    )


def _ws(server, job_id: str, headers=None, **query):
    url = f"ws://127.0.0.1:{server.port}/v1/jobs/{job_id}/ws"
    if query:
        url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    return connect(url, additional_headers=headers or {}, open_timeout=10)


def _status(opening) -> int:
    try:
        with opening():
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


def test_a_tenant_at_its_stream_cap_leaves_other_tenants_untouched(guarded_server, db):
    server = guarded_server
    greedy, other, third = new_key(db, "greedy"), new_key(db, "other"), new_key(db, "third")
    held: list = []
    try:
        job = _queued(server, greedy)
        # Wait out streams of earlier tests: the greedy tenant gets its whole share.
        first = wait_until(
            lambda: (r := _sse(server, greedy, job["id"])).status_code == 200 and r,
            timeout=15,
            interval=0.3,
        )
        held.append(first)
        for _ in range(TENANT_STREAMS - 1):
            opened = _sse(server, greedy, job["id"])
            assert opened.status_code == 200
            held.append(opened)
        over = _sse(server, greedy, job["id"])
        assert over.status_code == 429, over.text
        assert over.json()["errors"]["streams"] == ["tenant_streams_cap"]
        assert int(over.headers["Retry-After"]) > 0
        assert _status(lambda: _ws(server, job["id"], auth(greedy))) == 429
        # The greedy tenant's other requests still work...
        assert (
            requests.get(
                f"{server.url}/v1/jobs/{job['id']}", headers=auth(greedy), timeout=10
            ).status_code
            == 200
        )
        # ...and another tenant submits and streams as if nothing were held.
        theirs = _queued(server, other, "theirs")
        stream = _sse(server, other, theirs["id"])
        assert stream.status_code == 200
        held.append(stream)
        # The line iterator is kept: dropped, it would close the connection under it
        # (urllib3 closes a chunked read left unfinished), and the stream's slot with it.
        lines = stream.iter_lines(decode_unicode=True)
        assert next(lines).startswith("retry:")
        with _ws(server, theirs["id"], auth(other)) as ws:
            assert '"status"' in ws.recv(timeout=10)
        # The process's cap: filled, a third tenant is told so, not the tenant's cap.
        # (the WebSocket's slot comes back once the server has seen it close)
        while len(held) < PROCESS_STREAMS:
            extra = wait_until(
                lambda: (r := _sse(server, other, theirs["id"])).status_code == 200 and r,
                timeout=10,
                interval=0.3,
            )
            held.append(extra)
        job3 = _queued(server, third, "third")
        full = _sse(server, third, job3["id"])
        assert full.status_code == 429 and full.json()["errors"]["streams"] == [
            "process_streams_cap"
        ]
        # A stream closed gives its slot back.
        held.pop(0).close()
        reopened = wait_until(
            lambda: (r := _sse(server, third, job3["id"])).status_code == 200 and r,
            timeout=10,
            interval=0.3,
        )
        held.append(reopened)
    finally:
        for response in held:
            response.close()


def test_a_tenants_waits_count_against_its_cap_as_streams_do(guarded_server, db):
    """`Prefer: wait` and the OpenAI endpoint hold a thread as a stream does, so they take
    a slot of the same per-tenant cap: at its cap, a tenant's wait is answered at once
    (the submit's 202) and the OpenAI endpoint says 429 before making any job, while
    another tenant still waits."""
    import time

    server = guarded_server
    greedy, other = new_key(db, "waiter"), new_key(db, "patient")
    held: list = []
    try:
        job = _queued(server, greedy)
        # Each opened once earlier tests' streams are gone (the process cap is small).
        while len(held) < TENANT_STREAMS:
            held.append(
                wait_until(
                    lambda: (r := _sse(server, greedy, job["id"])).status_code == 200 and r,
                    timeout=15,
                    interval=0.3,
                )
            )
        body = {"prompt": "w", "model": "tiny-b", "steps": 2}
        started = time.monotonic()
        waited = requests.post(
            f"{server.url}/v1/jobs",
            json=body,
            headers={**auth(greedy), "Prefer": "wait=20"},
            timeout=30,
        )
        assert waited.status_code == 202, waited.text
        assert "Preference-Applied" not in waited.headers
        assert time.monotonic() - started < 5  # not held: answered at once
        listed = lambda: len(  # noqa: E731 - the greedy tenant's jobs, counted
            requests.get(
                f"{server.url}/v1/jobs?limit=100", headers=auth(greedy), timeout=10
            ).json()["data"]
        )
        jobs_before = listed()
        openai = requests.post(
            f"{server.url}/v1/images/generations",
            json={"prompt": "w", "model": "tiny-b"},
            headers=auth(greedy),
            timeout=30,
        )
        assert openai.status_code == 429, openai.text
        assert openai.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(openai.headers["Retry-After"]) > 0
        # Refused before any job was made: the client's own retry makes no second one.
        assert "diffq-job-id" not in openai.headers
        assert openai.headers.get("x-should-retry") != "false"
        assert listed() == jobs_before

        # Another tenant's wait is held as asked (once earlier tests' streams, which
        # count against the small process cap here, are gone).
        def held_two_seconds():
            started = time.monotonic()
            patient = requests.post(
                f"{server.url}/v1/jobs",
                json=body,
                headers={**auth(other), "Prefer": "wait=2"},
                timeout=30,
            )
            return patient.status_code == 202 and time.monotonic() - started >= 1.9

        assert wait_until(held_two_seconds, timeout=20, interval=0.5)
    finally:
        for response in held:
            response.close()


def test_a_ticket_opens_one_socket_for_its_tenant_from_an_allowed_origin(guarded_server, db):
    server = guarded_server
    owner, stranger = new_key(db, "tickets"), new_key(db, "stranger")
    job = _queued(server, owner, "ticketed")

    def ticket() -> str:
        issued = requests.post(
            f"{server.url}/v1/jobs/{job['id']}/ws-ticket",
            headers={**auth(owner), "Host": "evil.example"},
            timeout=10,
        )
        assert issued.status_code == 201
        body = issued.json()
        assert body["url"].startswith(PUBLIC_URL.replace("https", "wss") + "/v1/jobs/")
        return body["ticket"]

    def opens(**kwargs) -> int:
        return wait_until(
            lambda: (s := _status(lambda: _ws(server, job["id"], **kwargs))) != 429 and s,
            timeout=10,
            interval=0.3,
        )

    once = ticket()
    assert opens(ticket=once) == 101
    assert opens(ticket=once) == 401  # spent
    # With another tenant's key beside it: refused, and not spent by the refusal.
    fresh = ticket()
    assert opens(ticket=fresh, headers=auth(stranger)) == 401
    assert opens(ticket=fresh, headers=auth(owner)) == 101
    # A page elsewhere cannot open it; the public origin can.
    framed = ticket()
    assert opens(ticket=framed, headers={"Origin": "https://evil.example"}) == 403
    assert opens(ticket=framed, headers={"Origin": PUBLIC_URL}) == 101
    assert opens(headers={**auth(owner), "Origin": "https://evil.example"}) == 403
    # The access log has the refused handshakes (spent, stranger, origin), no ticket.
    wait_until(lambda: server.count(r"ticket=\[redacted\]") >= 3, timeout=10)
    log = server.log()
    for value in (once, fresh, framed):
        assert value not in log
    assert re.search(r"GET /v1/jobs/[0-9a-f-]+/ws\?ticket=\[redacted\]", log)
    with contextlib.suppress(requests.RequestException):
        requests.post(f"{server.url}/v1/jobs/{job['id']}/cancel", headers=auth(owner), timeout=10)


def test_metrics_are_never_on_the_public_port(guarded_server):
    server = guarded_server
    assert requests.get(f"{server.url}/metrics", timeout=10).status_code == 404
    scraped = requests.get(server.metrics_url, timeout=10)
    assert scraped.status_code == 200 and "diffq_http_requests_total" in scraped.text
    base = server.metrics_url.removesuffix("/metrics")
    assert requests.get(f"{base}/healthz", timeout=10).status_code == 200
    for path in ("/v1/jobs", "/v1/models", "/", "/openapi.json", "/docs"):
        assert requests.get(f"{base}{path}", timeout=10).status_code == 404, path


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/jobs", b'{"prompt": "a", "seed": ' + b"1" * 5000 + b"}", 422),
        ("/v1/images/generations", b'{"prompt":', 400),
        ("/v1/jobs", b'{"prompt": "a", "metadata": ' + b'{"a": ' * 3000 + b"1" + b"}" * 3001, 422),
        ("/v1/images/generations", b'{"prompt": ' + b"[" * 3000 + b"]" * 3000 + b"}", 422),
    ],
)
def test_the_reported_bodies_are_refused_by_gunicorns_threads_too(
    guarded_server, db, path, body, status
):
    """A gunicorn thread's stack is smaller than the main thread's: deep nesting is
    refused there as well, not a crash."""
    key = new_key(db, "bodies")
    answer = requests.post(
        f"{guarded_server.url}{path}",
        data=body,
        headers={**auth(key), "Content-Type": "application/json"},
        timeout=10,
    )
    assert answer.status_code == status, answer.text[:300]
    assert answer.json()
