"""Tenants cannot reach each other: every route that takes an id answers another
tenant's id exactly as it answers an id that does not exist (404, the same body), and
changes nothing; every /v1 route answers 401 without a key."""

from __future__ import annotations

import io
import json
import re
import uuid

import pytest

from testbed.jobs import auth
from workers.tiny import build_tiny_lora

from .conftest import new_key, png, submit

pytestmark = pytest.mark.services

# Routes whose answer is not about one tenant's resource: public pages, signed links
# (their own signature is the key), probes.
NOT_TENANT_ROUTES = re.compile(r"^/(?:$|docs|ui|static|files/|healthz|readyz|metrics|openapi)")


def _resources(client, key: str) -> dict[str, str]:
    """One of each kind of a tenant's resources, by the route parameter that names it."""
    job = submit(client, key)
    upload = client.post(
        "/v1/uploads",
        data={"file": (io.BytesIO(png()), "in.png")},
        headers=auth(key),
        content_type="multipart/form-data",
    )
    assert upload.status_code == 201, upload.get_json()
    adapter = client.post(
        "/v1/adapters",
        data={
            "file": (io.BytesIO(build_tiny_lora(7)), "style.safetensors"),
            "model": "tiny",
        },
        headers=auth(key),
        content_type="multipart/form-data",
    )
    assert adapter.status_code == 201, adapter.get_json()
    lines = [
        {
            "custom_id": "a",
            "method": "POST",
            "url": "/v1/jobs",
            "body": {"prompt": "x", "model": "tiny-b", "steps": 2},
        }
    ]
    file = client.post(
        "/v1/files",
        data={"purpose": "batch", "file": (io.BytesIO(json.dumps(lines[0]).encode()), "b.jsonl")},
        headers=auth(key),
        content_type="multipart/form-data",
    )
    assert file.status_code == 200, file.get_json()
    batch = client.post(
        "/v1/batches",
        json={"requests": [{"custom_id": "b", "prompt": "y", "model": "tiny-b", "steps": 2}]},
        headers=auth(key),
    )
    assert batch.status_code in (200, 201, 202), batch.get_json()
    video = client.post(
        "/v1/videos", json={"prompt": "v", "model": "tiny-video"}, headers=auth(key)
    )
    assert video.status_code == 200, video.get_json()
    return {
        "video_id": video.get_json()["id"],
        "job_id": job["id"],
        "upload_id": upload.get_json()["id"],
        "file_id": file.get_json()["id"],
        "batch_id": batch.get_json()["id"],
        "adapter_id": adapter.get_json()["id"],
    }


def _tenant_routes(app) -> list[tuple[str, str]]:
    routes = []
    for rule in app.url_map.iter_rules():
        if NOT_TENANT_ROUTES.match(rule.rule):
            continue
        if "<uuid:" not in rule.rule or getattr(rule, "websocket", False):
            continue
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            routes.append((method, rule.rule))
    return sorted(set(routes))


def _fill(rule: str, ids: dict[str, str]) -> str:
    path = rule.replace("<int:index>", "0").replace("<string:name>", "tiny")
    return re.sub(r"<uuid:(\w+)>", lambda m: ids[m.group(1)], path)


def _answer(client, method: str, path: str, key: str | None, address: str = "127.0.0.1"):
    headers = auth(key) if key else {}
    body = {"json": {}} if method == "POST" else {}
    response = client.open(
        path, method=method, headers=headers, environ_base={"REMOTE_ADDR": address}, **body
    )
    return response.status_code, response.get_json(silent=True)


def test_another_tenants_ids_answer_exactly_as_ids_that_do_not_exist(guarded_app, db):
    client = guarded_app.test_client()
    owner, intruder = new_key(db, "owner"), new_key(db, "intruder")
    mine = _resources(client, owner)
    nobody = {name: str(uuid.uuid4()) for name in mine}
    routes = _tenant_routes(guarded_app)
    covered = {name for _, rule in routes for name in re.findall(r"<uuid:(\w+)>", rule)}
    assert covered == set(mine), covered  # every kind of id a route takes is tried
    assert len(routes) >= 18, routes
    rows = []
    for method, rule in routes:
        foreign = _answer(client, method, _fill(rule, mine), intruder)
        absent = _answer(client, method, _fill(rule, nobody), intruder)
        # From its own address each: failed authentications are not what is tested here.
        anonymous = _answer(client, method, _fill(rule, mine), None, f"192.0.2.{len(rows)}")
        rows.append((method, rule, foreign[0], absent[0], anonymous[0]))
        assert foreign == absent, (method, rule, foreign, absent)
        assert foreign[0] == 404, (method, rule, foreign)
        assert anonymous[0] == 401, (method, rule, anonymous)
    print(
        "\n"
        + "\n".join(f"{m:<6} {r:<50} other {f} absent {a} no key {n}" for m, r, f, a, n in rows)
    )
    # Nothing the intruder sent changed the owner's resources.
    assert (
        client.get(f"/v1/jobs/{mine['job_id']}", headers=auth(owner)).get_json()["status"]
        == "queued"
    )
    assert client.get(f"/v1/uploads/{mine['upload_id']}", headers=auth(owner)).status_code == 200
    assert client.get(f"/v1/files/{mine['file_id']}", headers=auth(owner)).status_code == 200
    adapter = f"/v1/adapters/{mine['adapter_id']}"
    assert client.get(adapter, headers=auth(owner)).status_code == 200
    batch = client.get(f"/v1/batches/{mine['batch_id']}", headers=auth(owner)).get_json()
    assert batch["status"] not in ("cancelling", "cancelled"), batch
    # And its lists show none of them.
    for path, field in (
        ("/v1/jobs", "data"),
        ("/v1/batches", "data"),
        ("/v1/files", "data"),
        ("/v1/adapters", "data"),
    ):
        listed = client.get(path, headers=auth(intruder)).get_json()[field]
        assert not {item["id"] for item in listed} & set(mine.values()), path
    client.post(f"/v1/jobs/{mine['job_id']}/cancel", headers=auth(owner))
    client.post(f"/v1/batches/{mine['batch_id']}/cancel", headers=auth(owner))


def test_every_v1_route_needs_a_key(guarded_app):
    client = guarded_app.test_client()
    seen = []
    for rule in guarded_app.url_map.iter_rules():
        if not rule.rule.startswith("/v1/"):
            continue
        if getattr(rule, "websocket", False):
            continue
        path = _fill(
            rule.rule,
            {
                n: str(uuid.uuid4())
                for n in ("job_id", "upload_id", "file_id", "batch_id", "adapter_id", "video_id")
            },
        )
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            # Each from its own address: the failures are not what is tested here.
            answer = client.open(
                path, method=method, environ_base={"REMOTE_ADDR": f"192.0.2.{len(seen) % 250}"}
            )
            seen.append((method, rule.rule, answer.status_code))
            assert answer.status_code == 401, (method, rule.rule, answer.status_code)
    assert len(seen) >= 25, seen
