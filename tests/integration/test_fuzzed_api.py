"""Generated requests from the OpenAPI document (schemathesis, stateless, with a valid
key and a bounded number of examples per operation): no 5xx, and every answer matches
what the document says of its status, headers, content type and body."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from testbed.jobs import auth

pytestmark = pytest.mark.services

EXAMPLES = 12  # per operation: the suite's time budget, not the fuzzer's reach
# Values a JSON Schema cannot pin down, so a "schema-valid" request may rightly get a 422:
# the list's `cursor` is an opaque token from an earlier page; a job's `webhook` must name a
# public address and its `metadata` fit in 2 KiB of JSON; usage's `from` must not come after
# its `to`, nor span over 366 days. (The bounds a schema can state
# are checked by tests/integration/test_api_surface.py.)
OPAQUE_INPUT = {"GET /v1/jobs", "POST /v1/jobs", "GET /v1/usage"}
# Answers only once a worker has made the images (504 past its wait): fuzzing it here, with
# no worker, would test the timeout. tests/e2e/test_openai_client.py drives it with the
# real `openai` client, its bad input included.
NEEDS_A_WORKER = {"POST /v1/images/generations"}


@pytest.fixture(scope="module")
def fuzz_key(db) -> str:
    from app.keys import create_key, get_or_create_tenant

    with db.session() as session:
        return create_key(session, get_or_create_tenant(session, "fuzz"), "fuzz")


@pytest.fixture(scope="module")
def api_schema(flask_app, fuzz_key, db):
    yield schemathesis.openapi.from_wsgi("/openapi.json", flask_app)
    _cancel_what_was_queued(db)


def _cancel_what_was_queued(db) -> None:
    """The generated jobs must not keep the suite's shared worker busy afterwards."""
    from sqlalchemy import select

    from app.db.models import Job, Tenant
    from app.jobs.states import ErrorCode
    from app.jobs.transitions import cancel_job

    with db.session() as session:
        tenant = session.scalar(select(Tenant).where(Tenant.name == "fuzz"))
        for job in session.scalars(select(Job).where(Job.tenant_id == tenant.id)):
            cancel_job(session, job, code=ErrorCode.CANCELED, message="fuzzed request")


def _fuzz(operation, label: str, key: str) -> int:
    """Call one operation with generated requests; returns how many were made."""
    calls = 0

    @given(case=operation.as_strategy())
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
        excluded = [positive_data_acceptance] if label in OPAQUE_INPUT else []
        case.call_and_validate(headers=auth(key), excluded_checks=excluded)

    call()
    return calls


def test_generated_requests_get_documented_answers(api_schema, fuzz_key):
    tried: dict[str, int] = {}
    for result in api_schema.get_all_operations():
        operation = result.ok()
        label = f"{operation.method.upper()} {operation.path}"
        if label in NEEDS_A_WORKER:
            continue
        tried[label] = _fuzz(operation, label, fuzz_key)
    print(f"\n{sum(tried.values())} generated requests over {len(tried)} operations: {tried}")
    print(f"not fuzzed here (need a worker): {sorted(NEEDS_A_WORKER)}")
    assert len(tried) >= 8
