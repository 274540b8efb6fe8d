"""Bodies the parser cannot take are 4xx problems that say what is wrong, on both
endpoints that read a body, and nothing is stored (app/web/bodies.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from app.web.bodies import MAX_DEPTH, MAX_NUMBER_CHARS, Blueprint, RequestParser, locate
from testbed.jobs import auth

pytestmark = pytest.mark.services

JSON = {"Content-Type": "application/json"}


def nested(depth: int) -> str:
    """A job body whose deepest value sits `depth` levels down (the body is level 1)."""
    inner = depth - 2  # the body, then the object `metadata` is
    return '{"prompt": "deep", "metadata": {"a": ' + "[" * inner + "]" * inner + "}}"


# (name, body, headers, status, where the problem is named, the field or header, fragment)
CASES = [
    ("nested 324 (650 bytes)", nested(324), JSON, 422, "json", "metadata", f"{MAX_DEPTH} levels"),
    ("nested 3000", nested(3000), JSON, 422, "json", "metadata", f"{MAX_DEPTH} levels"),
    ("nested one too deep", nested(MAX_DEPTH + 1), JSON, 422, "json", "metadata", "levels"),
    ("a NUL byte", b"\x00", JSON, 400, "json", None, "line 1 column 1"),
    ("cut short", '{"prompt":', JSON, 400, "json", None, "line 1 column 11"),
    ("not UTF-8", b'{"prompt": "\xff"}', JSON, 400, "json", None, "not UTF-8"),
    (
        "a seed of 5,000 digits",
        '{"prompt": "x", "seed": ' + "9" * 5000 + "}",
        JSON,
        422,
        "json",
        "seed",
        f"at most {MAX_NUMBER_CHARS}",
    ),
    ("NaN", '{"prompt": "x", "guidance_scale": NaN}', JSON, 422, "json", "guidance_scale", "NaN"),
    (
        "1e999",
        '{"prompt": "x", "guidance_scale": 1e999}',
        JSON,
        422,
        "json",
        "guidance_scale",
        "range",
    ),
    (
        "Infinity deep in metadata",
        '{"prompt": "x", "metadata": {"a": [1, -Infinity]}}',
        JSON,
        422,
        "json",
        "metadata",
        "Infinity",
    ),
    ("no Content-Type", '{"prompt": "x"}', {}, 415, "headers", "Content-Type", "Missing"),
    (
        "a form's Content-Type",
        '{"prompt": "x"}',
        {"Content-Type": "application/x-www-form-urlencoded"},
        415,
        "headers",
        "Content-Type",
        "application/json",
    ),
    (
        "text/plain",
        '{"prompt": "x"}',
        {"Content-Type": "text/plain"},
        415,
        "headers",
        "Content-Type",
        "text/plain",
    ),
    ("a lone surrogate", '{"prompt": "a\\ud800b"}', JSON, 422, "json", "prompt", "surrogate"),
]
IDS = [case[0] for case in CASES]


def _job_count(db) -> int:
    from app.db.models.jobs import Job

    with db.session() as session:
        return session.scalar(select(func.count()).select_from(Job))


@pytest.mark.parametrize(
    ("name", "body", "headers", "status", "where", "named", "fragment"), CASES, ids=IDS
)
def test_post_jobs_names_what_is_wrong_with_the_body(
    client, tenant_key, db, name, body, headers, status, where, named, fragment
):
    before = _job_count(db)
    response = client.post("/v1/jobs", data=body, headers={**auth(tenant_key), **headers})
    assert response.status_code == status, response.get_data(as_text=True)[:300]
    problem = response.json
    assert problem["code"] == status
    errors = problem["errors"][where]
    if named is None:  # the body as a whole
        messages = errors
    else:
        assert list(errors) == [named], errors
        messages = errors[named]
    assert any(fragment in message for message in messages), messages
    assert _job_count(db) == before


@pytest.mark.parametrize(
    ("name", "body", "headers", "status", "where", "named", "fragment"), CASES, ids=IDS
)
def test_the_openai_endpoint_says_the_same_in_its_own_envelope(
    client, tenant_key, db, name, body, headers, status, where, named, fragment
):
    before = _job_count(db)
    response = client.post(
        "/v1/images/generations", data=body, headers={**auth(tenant_key), **headers}
    )
    assert response.status_code == status, response.get_data(as_text=True)[:300]
    error = response.json["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == named
    assert fragment in error["message"]
    assert _job_count(db) == before


def test_the_deepest_body_allowed_is_accepted(client, tenant_key):
    response = client.post("/v1/jobs", data=nested(MAX_DEPTH), headers={**auth(tenant_key), **JSON})
    assert response.status_code == 202, response.json
    metadata = response.json["metadata"]["a"]
    depth = 2  # the body, then metadata
    while isinstance(metadata, list):
        depth += 1
        metadata = metadata[0] if metadata else None
    assert depth == MAX_DEPTH
    client.post(response.json["urls"]["cancel"], headers=auth(tenant_key))


def test_an_empty_body_reports_the_missing_prompt(client, tenant_key):
    response = client.post("/v1/jobs", data=b"", headers={**auth(tenant_key), **JSON})
    assert response.status_code == 422
    assert response.json["errors"]["json"] == {"prompt": ["Missing data for required field."]}


def test_a_failure_past_the_schema_keeps_the_openai_envelope(client, tenant_key, monkeypatch):
    """An error no handler expects (here: the store refusing a value) is still OpenAI's
    shape on its endpoint, and the usual envelope elsewhere."""
    from sqlalchemy.exc import DataError

    import app.web.resources.openai.routes as openai_routes

    def refuse(*_args, **_kwargs):
        raise DataError("INSERT …", {}, Exception("invalid input syntax"))

    monkeypatch.setattr(openai_routes, "submit", refuse)
    response = client.post(
        "/v1/images/generations", json={"prompt": "x", "size": "64x64"}, headers=auth(tenant_key)
    )
    assert response.status_code == 422
    assert response.json["error"]["message"] == "A value in the request cannot be stored."


def test_locate_names_the_top_level_field_and_skips_strings():
    deep = "[" * (MAX_DEPTH + 1)
    field, problem = locate('{"a": 1, "b": "' + deep + '", "c": ' + deep)
    assert field == "c" and f"{MAX_DEPTH} levels" in problem
    assert locate("[" * (MAX_DEPTH + 1))[0] is None  # not an object: no field
    assert locate('{"a": [1, 2], "b": {"c": "]]]]"}}') is None


def test_every_api_blueprint_reads_bodies_with_the_body_parser(flask_app):
    api_blueprints = [
        bp for name, bp in flask_app.blueprints.items() if hasattr(bp, "ARGUMENTS_PARSER")
    ]
    assert len(api_blueprints) >= 9
    for blueprint in api_blueprints:
        assert isinstance(blueprint, Blueprint), blueprint.name
        assert isinstance(blueprint.ARGUMENTS_PARSER, RequestParser), blueprint.name


def test_a_body_over_the_size_limit_is_a_413_in_each_endpoints_envelope(client, tenant_key, db):
    from app.config import load_settings

    before = _job_count(db)
    pad = "u" * (load_settings().max_body_bytes + 1)
    body = '{"prompt": "x", "user": "' + pad + '"}'
    headers = {**auth(tenant_key), **JSON}
    ours = client.post("/v1/jobs", data=body, headers=headers)
    assert ours.status_code == 413 and ours.json["code"] == 413
    assert "user" in ours.json["errors"]["json"]
    openai = client.post("/v1/images/generations", data=body, headers=headers)
    assert openai.status_code == 413
    assert openai.json["error"]["param"] == "user"
    assert "DIFFQ_MAX_BODY_BYTES" in openai.json["error"]["message"]
    assert _job_count(db) == before
