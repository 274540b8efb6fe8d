"""Generated requests from the OpenAPI document (schemathesis, stateless, with a valid
key and a bounded number of examples per operation and mode), for every operation:
requests the document allows (positive) and requests it forbids (negative), then bodies
that are not JSON at all. No 5xx but the documented 504 of the OpenAI endpoint's wait,
and every answer matches what the document says of its status, headers, content type and
body."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from jsonschema import validate
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from testbed.jobs import auth

pytestmark = pytest.mark.services

EXAMPLES = 12  # per operation and mode: the suite's time budget, not the fuzzer's reach
# Values a JSON Schema cannot pin down, so a "schema-valid" request may rightly get a 422:
# the list's `cursor` is an opaque token from an earlier page; a job's `webhook` must name a
# public address and its `metadata` fit in 2 KiB of JSON; usage's `from` must not come after
# its `to`, nor span over 366 days; an OpenAI request's `size` and `n` (a video's `size`
# and `seconds`) must fit the model;
# an upload's (or an edit's) bytes must be a real PNG, JPEG or WebP image, which a schema's
# `format: binary` cannot say. (The bounds a schema can state are checked by
# tests/integration/test_api_surface.py.)
# A batch's requests are job requests checked line by line (and an OpenAI input file's
# lines when a batch names it), which the body's schema can only call objects. An
# adapter's bytes must be a safetensors LoRA that fits the model's family.
OPAQUE_INPUT = {
    "GET /v1/jobs",
    "POST /v1/jobs",
    "GET /v1/usage",
    "POST /v1/images/generations",
    "POST /v1/images/edits",
    "POST /v1/videos",
    "POST /v1/uploads",
    "POST /v1/batches",
    "POST /v1/files",
    "POST /v1/adapters",
}
# The document bounds a job's fields by what every configured model accepts
# (app/web/model_bounds.py): a request past them may fit the model it names (the stack's
# `tiny` takes a guidance of up to 30, `tiny-b` 12, so the document says 12) and is rightly
# accepted. There, a request the document forbids may be accepted only if it fits the
# document with its own model's bounds (`_fits_its_model`).
PER_MODEL_BOUNDS = {"POST /v1/jobs"}
# Waits for a worker's images: here, with no wait allowed (DIFFQ_MAX_WAIT=0), a request it
# accepts is answered with its documented 504 at once, the job left queued.
WAITS_FOR_A_WORKER = {"POST /v1/images/generations", "POST /v1/images/edits"}


@pytest.fixture(scope="module")
def fuzz_key(db) -> str:
    from app.keys import create_key, get_or_create_tenant

    with db.session() as session:
        return create_key(session, get_or_create_tenant(session, "fuzz"), "fuzz")


@pytest.fixture(scope="module")
def fuzz_app(flask_app):
    """The session's app, with waits off while fuzzing (restored afterwards)."""
    svc = flask_app.extensions["diffq"]
    kept = svc.settings
    svc.settings = dataclasses.replace(kept, max_wait=0)
    yield flask_app
    svc.settings = kept


@pytest.fixture(scope="module")
def api_schema(fuzz_app, fuzz_key, db):
    yield schemathesis.openapi.from_wsgi("/openapi.json", fuzz_app)
    _cancel_what_was_queued(db)


def _cancel_what_was_queued(db) -> None:
    """The generated jobs must not keep the suite's shared worker busy afterwards."""
    from sqlalchemy import select

    from app.db.models.jobs import Job
    from app.db.models.tenants import Tenant
    from app.jobs.states import ErrorCode
    from app.jobs.transitions import cancel_job

    with db.session() as session:
        tenant = session.scalar(select(Tenant).where(Tenant.name == "fuzz"))
        for job in session.scalars(select(Job).where(Job.tenant_id == tenant.id)):
            cancel_job(session, job, code=ErrorCode.CANCELED, message="fuzzed request")


def _only_a_documented_timeout(ctx, response, case) -> None:
    """The OpenAI endpoint's 504 is its documented answer to a wait that ran out."""
    assert response.status_code < 500 or response.status_code == 504, response.text[:300]
    if response.status_code == 504:
        assert json.loads(response.text)["error"]["code"] == "timeout"


def _as_json_schema(node):
    """OpenAPI 3.0's `nullable` written as JSON Schema's null type."""
    if isinstance(node, list):
        return [_as_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _as_json_schema(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable"):
        out = {"anyOf": [out, {"type": "null"}]}
    return out


def _fits_its_model(document: dict, catalog):
    """A check: an accepted job fits the document with its own model's bounds in place of
    those every model accepts."""
    from app.catalog import Catalog
    from app.web.model_bounds import bounds

    def check(ctx, response, case) -> None:
        if response.status_code != 202:
            return
        spec = catalog.get(case.body.get("model"))
        assert spec is not None, case.body
        components = copy.deepcopy(document["components"])
        properties = components["schemas"]["JobCreate"]["properties"]
        own = bounds(Catalog(models={spec.name: spec}, default_model=spec.name))
        for field, keywords in own.items():
            if field in properties:
                properties[field].update(
                    {k: v for k, v in keywords.items() if not k.startswith("x-")}
                )
        schema = {"$ref": "#/components/schemas/JobCreate", "components": components}
        validate(case.body, _as_json_schema(schema))

    return check


def _fuzz(operation, label: str, key: str, mode: GenerationMode, catalog=None) -> int:
    """Call one operation with generated requests; returns how many were made."""
    calls = 0
    excluded = []
    additional = []
    if label in OPAQUE_INPUT:
        excluded.append(positive_data_acceptance)
    if label in PER_MODEL_BOUNDS and mode is GenerationMode.NEGATIVE:
        excluded.append(negative_data_rejection)
        additional.append(_fits_its_model(operation.schema.raw_schema, catalog))
    if label in WAITS_FOR_A_WORKER:
        excluded.append(not_a_server_error)
        additional.append(_only_a_documented_timeout)

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def call(case) -> None:
        nonlocal calls
        calls += 1
        case.call_and_validate(
            headers=auth(key), excluded_checks=excluded, additional_checks=additional
        )

    try:
        call()
    except Unsatisfiable:
        # Nothing of the operation can be made invalid (no parameter, no body): checked
        # by the caller, which says so.
        return 0
    return calls


def _can_be_violated(api_schema, label: str) -> bool:
    """Whether a request to the operation can break its document: a body, or a parameter
    more constrained than "any string"."""
    method, path = label.split(" ", 1)
    item = api_schema.raw_schema["paths"][path]
    operation = item[method.lower()]
    if operation.get("requestBody"):
        return True
    parameters = [*item.get("parameters", []), *operation.get("parameters", [])]
    return any(p.get("schema", {}) != {"type": "string"} for p in parameters)


def _operations(api_schema) -> dict[str, object]:
    found = {}
    for result in api_schema.get_all_operations():
        operation = result.ok()
        found[f"{operation.method.upper()} {operation.path}"] = operation
    return found


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_generated_requests_get_documented_answers(api_schema, fuzz_app, fuzz_key, mode):
    operations = _operations(api_schema)
    catalog = fuzz_app.extensions["diffq"].catalog
    tried = {label: _fuzz(op, label, fuzz_key, mode, catalog) for label, op in operations.items()}
    print(f"\n{mode.value}: {sum(tried.values())} requests over {len(tried)} operations: {tried}")
    assert set(tried) == set(operations)  # every operation, the OpenAI endpoint included
    assert tried["POST /v1/images/generations"] > 0 and tried["POST /v1/jobs"] > 0
    untried = {label for label, calls in tried.items() if calls == 0}
    if untried:
        print(f"nothing to violate (no body, no constrained parameter): {sorted(untried)}")
    assert not any(_can_be_violated(api_schema, label) for label in untried), untried
    if mode is GenerationMode.POSITIVE:
        assert not untried


# Bodies that are no JSON object: arbitrary bytes, text, JSON cut short, nested deep.
MALFORMED = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64).map(str.encode),
    st.builds(
        lambda body, cut: body[:cut].encode(),
        st.just('{"prompt": "a cut body", "metadata": {"k": [1, 2.5, "x"]}}'),
        st.integers(min_value=0, max_value=60),
    ),
    st.integers(min_value=1, max_value=2_000).map(lambda n: ("[" * n + "]" * n).encode()),
    st.integers(min_value=1, max_value=2_000).map(
        lambda n: ('{"prompt": "x", "metadata": {"a": ' + "[" * n + "]" * n + "}}").encode()
    ),
)
# Mostly JSON, so that most bodies reach the parser; the rest meet the Content-Type check.
CONTENT_TYPES = st.sampled_from(
    ["application/json"] * 4 + [None, "text/plain", "application/x-www-form-urlencoded"]
)


def test_malformed_bodies_are_4xx_problems_for_every_operation_with_a_body(
    api_schema, fuzz_app, fuzz_key, db
):
    from sqlalchemy import func, select

    from app.db.models.jobs import Job

    client = fuzz_app.test_client()
    with_bodies = [
        (op.method.upper(), op.path)
        for op in _operations(api_schema).values()
        if op.definition.raw.get("requestBody")
    ]
    assert ("POST", "/v1/jobs") in with_bodies and ("POST", "/v1/images/generations") in with_bodies
    seen: dict[int, int] = {}

    @given(body=MALFORMED, content_type=CONTENT_TYPES, which=st.sampled_from(with_bodies))
    @settings(max_examples=100, deadline=None, derandomize=True, database=None)
    def call(body, content_type, which) -> None:
        method, path = which
        with db.session() as session:
            before = session.scalar(select(func.count()).select_from(Job))
        headers = {**auth(fuzz_key), **({"Content-Type": content_type} if content_type else {})}
        response = client.open(path, method=method, data=body, headers=headers)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        if response.status_code in (202, 504):  # a body that happened to be a valid job
            return
        assert 400 <= response.status_code < 500, (body[:80], response.get_data(as_text=True))
        problem = response.get_json()
        if path.startswith(("/v1/images/", "/v1/videos")):  # OpenAI's envelope
            assert problem["error"]["message"], problem
        else:
            assert problem["code"] == response.status_code and problem.get("errors"), problem
        with db.session() as session:
            assert session.scalar(select(func.count()).select_from(Job)) == before

    call()
    print(f"\nmalformed bodies over {with_bodies}: answers {sorted(seen.items())}")
    assert {400, 415, 422} <= set(seen)
