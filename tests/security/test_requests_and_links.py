"""In-process guards: failed authentication throttled per address and per key id before
the database, forwarded headers believed only from trusted proxies, every link built on
the public URL, webhook targets and what a tenant learns of their failures."""

from __future__ import annotations

import uuid

import pytest

from app.webhooks.guard import UnsafeUrl, check_url
from testbed.jobs import auth

from .conftest import PUBLIC_URL, new_key, submit

pytestmark = pytest.mark.services

BAD_KEY = "dq_aaaaaaaaaaaa_" + "b" * 43


def _get(client, address: str, key: str | None = None, **headers):
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return client.get("/v1/jobs", headers=headers, environ_base={"REMOTE_ADDR": address})


def test_an_address_past_its_failures_gets_429_before_its_key_is_looked_up(guarded, db):
    address = f"198.51.100.{uuid.uuid4().int % 200 + 1}"
    good = new_key(db, "throttled")
    for _ in range(5):
        assert _get(guarded, address, f"dq_{uuid.uuid4().hex[:12]}_" + "c" * 43).status_code == 401
    refused = _get(guarded, address, good)
    # Even a valid key: the address is refused before any key is read.
    assert refused.status_code == 429, refused.get_json()
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert "failed authentications" in refused.get_json()["message"]
    # Another address is not affected, nor is the key from elsewhere.
    assert _get(guarded, "198.51.100.250", good).status_code == 200


def test_failures_naming_a_key_id_never_lock_its_owner_out(guarded, db):
    """A key id is public (logs, listings): addresses failing with it (a wrong secret)
    are refused themselves, but the key's owner, elsewhere, is not."""
    good = new_key(db, "named")
    key_id = good.split("_")[1]
    guessed = f"dq_{key_id}_" + "d" * 43
    attacker = f"203.0.113.{uuid.uuid4().int % 200 + 1}"
    for n in range(5):
        assert _get(guarded, f"203.0.113.{(n + 201) % 250}", guessed).status_code == 401
    for _ in range(5):
        _get(guarded, attacker, guessed)
    assert _get(guarded, attacker, guessed).status_code == 429
    assert _get(guarded, "198.18.7.7", good).status_code == 200


def test_forwarded_for_is_believed_only_from_a_trusted_proxy(guarded):
    # An untrusted peer cannot spread its failures over invented addresses.
    # An address no other test uses (test_tenancy.py spends failures on 192.0.2.x).
    peer = "198.18.2.9"
    for n in range(5):
        _get(guarded, peer, BAD_KEY, **{"X-Forwarded-For": f"100.64.0.{n}"})
    assert _get(guarded, peer, BAD_KEY, **{"X-Forwarded-For": "100.64.1.1"}).status_code == 429
    # Behind the trusted proxy, each client is counted on its own.
    proxy = "10.9.0.7"
    client_a, client_b = "198.18.0.1", f"198.18.1.{uuid.uuid4().int % 200 + 1}"
    for _ in range(5):
        _get(guarded, proxy, None, **{"X-Forwarded-For": client_a})
    assert _get(guarded, proxy, None, **{"X-Forwarded-For": client_a}).status_code == 429
    assert _get(guarded, proxy, None, **{"X-Forwarded-For": client_b}).status_code == 401


def test_links_are_built_on_the_public_url_whatever_the_host_and_forwarded_headers(guarded, db):
    key = new_key(db, "links")
    hostile = {"Host": "evil.example", "X-Forwarded-Proto": "http", "X-Forwarded-Host": "evil"}
    answer = guarded.post(
        "/v1/jobs",
        json={"prompt": "p", "model": "tiny-b", "steps": 2},
        headers={**auth(key), **hostile},
    )
    assert answer.status_code == 202
    job = answer.get_json()
    assert answer.headers["Location"] == f"{PUBLIC_URL}/v1/jobs/{job['id']}"
    assert job["urls"] and all(u.startswith(PUBLIC_URL + "/") for u in job["urls"].values())
    ticket = guarded.post(
        f"/v1/jobs/{job['id']}/ws-ticket", headers={**auth(key), **hostile}
    ).get_json()
    assert ticket["url"].startswith("wss://diffq.example.test/v1/jobs/"), ticket["url"]
    assert "evil" not in str(ticket) and "evil" not in str(job)
    guarded.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com:0/hook",
        "http://example.com:/hook",
        "https://example.com:65536/hook",
        "https://example.com:-1/hook",
        "https://example.com:http/hook",
    ],
)
def test_a_webhook_without_a_valid_port_is_refused_at_submit(guarded, db, url):
    with pytest.raises(UnsafeUrl):
        check_url(url)
    key = new_key(db, "port")
    answer = guarded.post(
        "/v1/jobs", json={"prompt": "p", "model": "tiny-b", "webhook": url}, headers=auth(key)
    )
    assert answer.status_code == 422, answer.get_json()
    assert "webhook" in str(answer.get_json()["errors"])


def test_webhook_failures_are_shown_as_a_class_not_as_a_port_scan(guarded, db):
    from app.db.models.webhooks import WebhookAttempt, WebhookEvent

    key = new_key(db, "hooks")
    job = submit(guarded, key)
    raw = [
        (None, 3, "connection failed (NewConnectionError)"),
        (None, 10002, "no answer within 10s"),
        (None, 1, "not resolved: [Errno -2] Name or service not known"),
        (302, 14, "redirect not followed"),
        (500, 9, "answered 500"),
        (None, 0, "refused: not a public address"),
        (200, 41, None),
    ]
    with db.session() as session:
        event = WebhookEvent(job_id=uuid.UUID(job["id"]), type="job.succeeded", state="delivered")
        session.add(event)
        session.flush()
        for status, latency, error in raw:
            session.add(
                WebhookAttempt(
                    event_id=event.id, status_code=status, latency_ms=latency, error=error
                )
            )
        session.commit()
    [shown] = guarded.get(f"/v1/jobs/{job['id']}/webhooks", headers=auth(key)).get_json()["data"]
    attempts = [(a["status_code"], a["latency_ms"], a["error"]) for a in shown["attempts"]]
    assert attempts == [
        (None, None, "unreachable"),
        (None, None, "unreachable"),
        (None, None, "unreachable"),
        (None, None, "non-2xx"),
        (None, None, "non-2xx"),
        (None, None, "refused"),
        (200, 41, None),
    ]
    guarded.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
