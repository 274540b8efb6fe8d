"""Every /v1 route needs a valid key, and a tenant never sees another tenant's jobs."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import update

from testbed.jobs import auth

pytestmark = pytest.mark.services


def _submit(client, key: str) -> dict:
    response = client.post("/v1/jobs", json={"prompt": "mine", "steps": 1}, headers=auth(key))
    assert response.status_code == 202, response.json
    return response.json


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/v1/jobs"),
        ("get", "/v1/jobs"),
        ("get", f"/v1/jobs/{uuid.UUID(int=1)}"),
        ("get", f"/v1/jobs/{uuid.UUID(int=2)}/images/0"),
    ],
)
@pytest.mark.parametrize(
    "header",
    [
        None,
        "Bearer",
        "Bearer not-a-key",
        "Basic dXNlcjpwYXNz",
        "Bearer dq_aaaaaaaaaaaa_" + "b" * 43,
    ],
)
def test_every_v1_route_answers_401_without_a_valid_key(client, method, path, header):
    headers = {"Authorization": header} if header else {}
    response = getattr(client, method)(path, json={"prompt": "x"}, headers=headers)
    assert response.status_code == 401
    assert response.json["code"] == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_a_revoked_key_is_refused_at_once(client, tenant_key, db):
    from app.db.models.tenants import ApiKey
    from app.db.types import utcnow

    assert client.get("/v1/jobs", headers=auth(tenant_key)).status_code == 200
    key_id = tenant_key.split("_")[1]
    with db.session() as session:
        session.execute(update(ApiKey).where(ApiKey.key_id == key_id).values(revoked_at=utcnow()))
    assert client.get("/v1/jobs", headers=auth(tenant_key)).status_code == 401


def test_a_key_with_a_wrong_secret_is_refused(client, tenant_key):
    forged = tenant_key[:-4] + ("AAAA" if not tenant_key.endswith("AAAA") else "BBBB")
    assert client.get("/v1/jobs", headers=auth(forged)).status_code == 401


def test_another_tenant_gets_404_for_job_and_images_and_an_empty_list(
    client, tenant_key, other_key
):
    job = _submit(client, tenant_key)
    for path in (f"/v1/jobs/{job['id']}", f"/v1/jobs/{job['id']}/images/0"):
        response = client.get(path, headers=auth(other_key))
        assert response.status_code == 404, path
        assert response.json["message"] in ("No such job.",)
    listed = client.get("/v1/jobs", headers=auth(other_key)).json
    assert job["id"] not in [j["id"] for j in listed["data"]]
    own = client.get(f"/v1/jobs/{job['id']}", headers=auth(tenant_key))
    assert own.status_code == 200 and own.json["id"] == job["id"]


def test_an_absent_job_is_the_same_404_as_a_foreign_one(client, tenant_key):
    response = client.get(f"/v1/jobs/{uuid.uuid4()}", headers=auth(tenant_key))
    assert response.status_code == 404
    assert response.json["message"] == "No such job."


def test_the_database_holds_no_usable_key(client, tenant_key, db):
    from sqlalchemy import select

    from app.db.models.tenants import ApiKey

    key_id = tenant_key.split("_")[1]
    with db.session() as session:
        row = session.scalar(select(ApiKey).where(ApiKey.key_id == key_id))
    secret = tenant_key.split("_", 2)[2]
    assert secret not in row.secret_hash and tenant_key != row.secret_hash
    assert len(row.secret_hash) == 64
    # The stored hash presented as a key is worthless.
    assert client.get("/v1/jobs", headers=auth(row.secret_hash)).status_code == 401


def _v1_routes(flask_app, job_id: str) -> list[tuple[str, str]]:
    """Every /v1 route the app serves, as (method, path) with this job's id filled in."""
    routes = []
    for rule in flask_app.url_map.iter_rules():
        if not rule.rule.startswith("/v1/jobs/<"):
            continue
        path = rule.rule.replace("<uuid:job_id>", job_id).replace("<int:index>", "0")
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            routes.append((method.lower(), path))
    return routes


def test_tenant_isolation_matrix_over_every_job_route(flask_app, client, tenant_key, other_key):
    job = _submit(client, tenant_key)
    routes = _v1_routes(flask_app, job["id"])
    assert len(routes) >= 6  # get, cancel, events, images, webhooks, redeliver
    matrix = {}
    for method, path in routes:
        foreign = getattr(client, method)(path, headers=auth(other_key))
        anonymous = getattr(client, method)(path)
        matrix[(method, path)] = (foreign.status_code, anonymous.status_code)
    print(
        "\n"
        + "\n".join(
            f"{m.upper():<5} {p:<70} other tenant {f}, no key {a}"
            for (m, p), (f, a) in matrix.items()
        )
    )
    assert all(f == 404 and a == 401 for f, a in matrix.values()), matrix
    # And nothing the other tenant tried changed the job.
    assert client.get(f"/v1/jobs/{job['id']}", headers=auth(tenant_key)).json["status"] != (
        "canceled"
    )
