"""Listing and pagination, probes, the OpenAPI document, and the error envelope."""

from __future__ import annotations

import uuid

import pytest

from testbed.jobs import auth

pytestmark = pytest.mark.services


def test_list_is_newest_first_with_cursor_pages(client, tenant_key):
    ids = []
    for i in range(5):
        response = client.post(
            "/v1/jobs", json={"prompt": f"job {i}", "steps": 1}, headers=auth(tenant_key)
        )
        ids.append(response.json["id"])
    seen, cursor, pages = [], None, 0
    while True:
        query = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/jobs", query_string=query, headers=auth(tenant_key)).json
        pages += 1
        seen += [job["id"] for job in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == list(reversed(ids))


def test_list_filters_by_status(client, tenant_key):
    client.post("/v1/jobs", json={"prompt": "one", "steps": 1}, headers=auth(tenant_key))
    failed = client.get("/v1/jobs?status=failed", headers=auth(tenant_key)).json
    assert failed["data"] == [] and failed["next_cursor"] is None
    everything = client.get("/v1/jobs", headers=auth(tenant_key)).json
    assert len(everything["data"]) == 1


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("status=done", "status"),
        ("cursor=zzz", "cursor"),
        ("cursor=%00", "cursor"),
        ("status=queued%00", "status"),
        ("stauts=failed", "stauts"),  # a misspelt filter is refused, not ignored
    ],
)
def test_bad_list_parameters_are_422(client, tenant_key, query, field):
    response = client.get(f"/v1/jobs?{query}", headers=auth(tenant_key))
    assert response.status_code == 422
    assert field in response.json["errors"]["query"]


def test_health_and_readiness_check_every_dependency(client):
    assert client.get("/healthz").json == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.json
    assert ready.json["checks"] == {
        "database": "ok",
        "schema": "ok",
        "broker": "ok",
        "storage": "ok",
    }
    assert ready.json["required"] == ["database", "schema"]


def test_openapi_document_describes_routes_limits_and_auth(client):
    spec = client.get("/openapi.json").json
    assert spec["info"]["title"] == "diffq"
    paths = spec["paths"]
    for path in ("/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/images/{index}", "/readyz"):
        assert path in paths, path
    post = paths["/v1/jobs"]["post"]
    assert post["summary"] == "Submit a job"
    assert {"202", "401", "413", "422"} <= set(post["responses"])
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    schema = spec["components"]["schemas"]["JobCreate"]
    assert "prompt" in schema["required"]
    assert "max_steps" in schema["properties"]["steps"]["description"]
    assert paths["/healthz"]["get"]["security"] == []


def _filled(path: str, parameters: list[dict]) -> str:
    """`path` with each of its parameters given a value of its type (none exists)."""
    for parameter in parameters:
        if parameter.get("in") != "path":
            continue
        schema = parameter.get("schema", {})
        value = {"integer": "0"}.get(schema.get("type"), str(uuid.uuid4()))
        path = path.replace("{" + parameter["name"] + "}", value)
    return path


def test_every_keyed_operation_documents_its_401_and_answers_it(client):
    """The document's `security` covers every operation but the public ones, and each
    covered operation documents `401` (app/web/openapi.py `KeyedOperations`) and answers
    it without a key, before it reads a body or looks anything up."""
    spec = client.get("/openapi.json").json
    keyed = public = 0
    for n, (path, item) in enumerate(spec["paths"].items()):
        for method, operation in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            if operation.get("security") == []:
                public += 1
                assert "401" not in operation["responses"], (method, path)
                continue
            keyed += 1
            assert "401" in operation["responses"], (method, path)
            parameters = item.get("parameters", []) + operation.get("parameters", [])
            # An address of its own: failed keys are counted against an address.
            address = f"198.18.{n // 200}.{n % 200 + 1}"
            answer = client.open(
                _filled(path, parameters), method=method.upper(),
                environ_base={"REMOTE_ADDR": address},
            )  # fmt: skip
            assert answer.status_code == 401, (method, path, answer.status_code)
    assert keyed > public >= 1, (keyed, public)


def test_every_operation_has_a_summary_and_a_description(client):
    """A route's docstring is its documentation: its first line the summary, the rest
    what a client needs beyond the schema (the README and /docs read the same)."""
    spec = client.get("/openapi.json").json
    bare = [
        (method, path)
        for path, item in spec["paths"].items()
        for method, operation in item.items()
        if method in ("get", "post", "put", "patch", "delete")
        and not (operation.get("summary") and operation.get("description"))
    ]
    assert bare == []


def test_the_submit_examples_show_every_job_kind_with_fields_of_its_own(client):
    """POST /v1/jobs documents one example per kind, each using only fields the request
    schema declares, and the kind's own fields only on that kind."""
    from app.kinds import KINDS

    spec = client.get("/openapi.json").json
    body = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    declared = set(spec["components"]["schemas"]["JobCreate"]["properties"])
    examples = {name: e["value"] for name, e in body["examples"].items()}
    shown = {value.get("kind", "txt2img") for value in examples.values()}
    assert shown == set(KINDS), shown
    for name, value in examples.items():
        assert set(value) <= declared, (name, set(value) - declared)
        kind = KINDS[value.get("kind", "txt2img")]
        foreign = {f for k in KINDS.values() for f in k.api_fields()} - set(kind.api_fields())
        assert not set(value) & foreign, (name, set(value) & foreign)


def test_interactive_docs_page_is_served(client):
    response = client.get("/docs")
    assert response.status_code == 200
    assert b"swagger-ui" in response.data


def test_unknown_route_and_method_use_the_error_envelope(client, tenant_key):
    missing = client.get("/v2/nothing")
    assert missing.status_code == 404 and missing.json["code"] == 404
    wrong = client.delete("/v1/jobs", headers=auth(tenant_key))
    assert wrong.status_code == 405 and wrong.json["status"] == "Method Not Allowed"
    assert set(wrong.headers["Allow"].split(", ")) == {"GET", "HEAD", "OPTIONS", "POST"}
    job_path = "/v1/jobs/00000000-0000-0000-0000-000000000000/cancel"
    wrong = client.get(job_path, headers=auth(tenant_key))
    assert wrong.status_code == 405 and "POST" in wrong.headers["Allow"].split(", ")


def test_openapi_declares_the_bounds_every_model_accepts(client, flask_app):
    catalog = flask_app.extensions["diffq"].catalog
    # The shared fields' bounds are the image models' (a video model's own rules are
    # num_frames and fps, and it names its limits in the descriptions).
    models = [m for m in catalog.models.values() if not m.video]
    videos = [m for m in catalog.models.values() if m.video]
    assert videos, "the test stack lists a video model"
    props = client.get("/openapi.json").json["components"]["schemas"]["JobCreate"]["properties"]
    for video in videos:
        assert video.name in props["width"]["description"]
        assert f"{video.name}: k x {video.frame_step} + 1" in props["num_frames"]["description"]
    for field, attr in (("width", "max_width"), ("height", "max_height")):
        assert props[field]["multipleOf"] == models[0].size_multiple
        assert props[field]["minimum"] == max(m.min_size for m in models)
        assert props[field]["maximum"] <= min(getattr(m, attr) for m in models)
        assert all(m.name in props[field]["description"] for m in models)
    assert props["width"]["maximum"] * props["height"]["maximum"] <= min(
        m.max_pixels for m in models
    )
    assert props["steps"]["maximum"] == min(m.max_steps for m in models)
    assert props["num_images"]["maximum"] == min(m.max_num_images for m in models)
    assert sorted(props["model"]["enum"]) == sorted(catalog.models)


def test_the_largest_request_the_document_allows_is_accepted_by_every_model(
    client, flask_app, tenant_key
):
    props = client.get("/openapi.json").json["components"]["schemas"]["JobCreate"]["properties"]
    for model in props["model"]["enum"]:
        body = {
            "prompt": "p" * props["prompt"]["maxLength"],
            "model": model,
            "width": props["width"]["maximum"],
            "height": props["height"]["maximum"],
            "steps": props["steps"]["maximum"],
            "num_images": props["num_images"]["maximum"],
            "guidance_scale": props["guidance_scale"]["maximum"],
            "scheduler": props["scheduler"]["enum"][-1],
        }
        if flask_app.extensions["diffq"].catalog.models[model].video:
            # A video model runs the video kinds alone, one clip a job, at its own sizes.
            body = {
                "prompt": body["prompt"],
                "model": model,
                "kind": "txt2vid",
                "steps": props["steps"]["maximum"],
            }
        response = client.post("/v1/jobs", json=body, headers=auth(tenant_key))
        assert response.status_code == 202, (model, response.json)
