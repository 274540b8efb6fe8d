"""Hostile bodies against every operation that reads one: whatever arrives, the answer
is a 4xx that says what is wrong, never a 5xx (app/web/bodies.py)."""

from __future__ import annotations

import uuid

import pytest

from testbed.jobs import auth

from .conftest import new_key, submit

pytestmark = pytest.mark.services

DEEP = 3000
CORPUS: dict[str, bytes] = {
    "truncated": b'{"prompt":',
    "truncated in a string": b'{"prompt": "a',
    "empty object": b"{}",
    "not an object": b"[1, 2, 3]",
    "a bare number": b"7",
    "metadata nested 3,000 deep": (
        b'{"prompt": "a", "metadata": ' + b'{"a": ' * DEEP + b"1" + b"}" * DEEP + b"}"
    ),
    "a list nested 3,000 deep": b'{"prompt": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    "truncated and deep": b'{"prompt": ' + b"[" * DEEP,
    "a seed of 5,000 digits": b'{"prompt": "a", "seed": ' + b"9" * 5000 + b"}",
    "a negative seed of 5,000 digits": b'{"prompt": "a", "seed": -' + b"9" * 5000 + b"}",
    "a float beyond a double": b'{"prompt": "a", "guidance_scale": 1e400}',
    "NaN": b'{"prompt": "a", "seed": NaN}',
    "Infinity": b'{"prompt": "a", "n": -Infinity}',
    "a width of 10^30": b'{"prompt": "a", "width": 1000000000000000000000000000000}',
    "NUL in a string": b'{"prompt": "a\\u0000b"}',
    "a raw NUL byte": b'{"prompt": "a\x00b"}',
    "a lone surrogate": b'{"prompt": "\\ud800"}',
    "invalid UTF-8": b'{"prompt": "\xff\xfe"}',
    "UTF-16": '{"prompt": "a"}'.encode("utf-16"),
    "a key of NUL": b'{"\\u0000": 1, "prompt": "a"}',
    "wrong types": b'{"prompt": ["a"], "steps": "many", "seed": {}, "metadata": 3}',
    "a huge string": b'{"prompt": "' + b"a" * 200_000 + b'"}',
    "many keys": b"{" + b",".join(b'"k%d": 1' % i for i in range(5000)) + b"}",
    "duplicate keys": b'{"prompt": "a", "prompt": 3}',
    "a webhook on port 0": b'{"prompt": "a", "webhook": "https://example.com:0/hook"}',
    "a webhook on port 99999": b'{"prompt": "a", "webhook": "https://example.com:99999/h"}',
}


def _operations(app, ids: dict[str, str]) -> list[tuple[str, str]]:
    """Every operation that takes a body (POST, PUT, PATCH, DELETE), ids filled in."""
    found = []
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/v1/") or getattr(rule, "websocket", False):
            continue
        path = rule.rule.replace("<string:name>", "tiny")
        for name, value in ids.items():
            path = path.replace(f"<uuid:{name}>", value)
        for method in sorted(rule.methods & {"POST", "PUT", "PATCH", "DELETE"}):
            found.append((method, path))
    return sorted(found)


@pytest.mark.parametrize("database", ["postgresql", "sqlite"])
@pytest.mark.parametrize(
    "content_type",
    ["application/json", "application/jsonl", "multipart/form-data; boundary=xyz"],
)
def test_no_hostile_body_gets_a_5xx_from_any_operation(request, content_type, database):
    """On both databases: a statement fed a NUL, a huge number or a wrong type is refused
    with a 4xx, never a 5xx (a raw statement SQLite refused once answered every batch
    of `diffq up` with 503)."""
    if database == "postgresql":
        guarded_app, db = request.getfixturevalue("guarded_app"), request.getfixturevalue("db")
    else:
        guarded_app = request.getfixturevalue("guarded_embedded_app")
        db = guarded_app.db
    client = guarded_app.test_client()
    key = new_key(db, "hostile")
    job = submit(client, key)
    ids = {
        "job_id": job["id"],
        "upload_id": str(uuid.uuid4()),
        "file_id": str(uuid.uuid4()),
        "batch_id": str(uuid.uuid4()),
        "adapter_id": str(uuid.uuid4()),
        "video_id": str(uuid.uuid4()),
    }
    operations = _operations(guarded_app, ids)
    assert ("POST", "/v1/images/generations") in operations and len(operations) >= 10
    # Every id filled in: no operation is left out for a placeholder in its path.
    assert not [path for _, path in operations if "<" in path], operations
    failures, answered = [], {}
    for method, path in operations:
        for name, body in CORPUS.items():
            response = client.open(
                path,
                method=method,
                data=body,
                headers={**auth(key), "Content-Type": content_type},
            )
            answered[(path, name)] = response.status_code
            if response.status_code >= 500 or response.get_json(silent=True) is None:
                failures.append((method, path, name, response.status_code))
    client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))
    print(f"\n{len(answered)} hostile requests, statuses {sorted(set(answered.values()))}")
    assert not failures, failures


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/v1/jobs", b'{"prompt": "a", "seed": ' + b"1" * 5000 + b"}", 422, "seed"),
        ("/v1/images/generations", b'{"prompt":', 400, "Invalid JSON"),
        ("/v1/jobs", CORPUS["metadata nested 3,000 deep"], 422, "metadata"),
        ("/v1/images/generations", CORPUS["metadata nested 3,000 deep"], 422, "Nested"),
        ("/v1/jobs", CORPUS["a webhook on port 0"], 422, "port"),
    ],
)
def test_the_named_bodies_get_a_clear_refusal(guarded_app, db, path, body, status, says):
    client = guarded_app.test_client()
    key = new_key(db, "named")
    response = client.post(
        path, data=body, headers={**auth(key), "Content-Type": "application/json"}
    )
    assert response.status_code == status, response.get_data(as_text=True)[:300]
    assert says in response.get_data(as_text=True)


def test_hostile_query_strings_are_refused_not_crashed(guarded_app, db):
    client = guarded_app.test_client()
    key = new_key(db, "query")
    for query in (
        "limit=" + "9" * 5000,
        "limit=-1",
        "status=%00",
        "after=%ff%fe",
        "cursor=" + "A" * 10000,
        "limit=1e400",
    ):
        for path in ("/v1/jobs", "/v1/batches", "/v1/files", "/v1/usage"):
            answer = client.get(f"{path}?{query}", headers=auth(key))
            assert answer.status_code < 500, (path, query, answer.status_code)
