"""POST /v1/batches and the rest through the API on the real services, no worker: how a
batch is stored and published, every refusal of bad input, tenancy, idempotency, an
interrupted ingest resumed, cancel, the completion window, and OpenAI's file form."""

from __future__ import annotations

import io
import json
import uuid
from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from app.kinds import job_request
from testbed.jobs import auth
from testbed.waiting import wait_until

pytestmark = pytest.mark.services

# No worker serves tiny-b in this module: jobs stay queued until a test ends them.
LINE = {"model": "tiny-b", "steps": 2}


def _requests(n: int, **extra) -> list[dict]:
    return [{"custom_id": f"c-{i}", "prompt": f"p {i}", **LINE, **extra} for i in range(n)]


def _post(client, key, body=None, *, data=None, content_type=None, headers=None, query=""):
    if data is None:
        data, content_type = json.dumps(body), "application/json"
    return client.post(
        f"/v1/batches{query}",
        data=data,
        content_type=content_type,
        headers={**auth(key), **(headers or {})},
    )


def _jobs(db, batch_id: str):
    from app.db.models.jobs import Job

    with db.session() as session:
        return list(
            session.scalars(select(Job).where(Job.batch_id == uuid.UUID(batch_id)).order_by(Job.id))
        )


def _batches_of(db, key: str) -> int:
    from app.db.models.batches import Batch
    from app.db.models.tenants import ApiKey
    from app.keys import key_id_of

    with db.session() as session:
        tenant = session.scalar(select(ApiKey.tenant_id).where(ApiKey.key_id == key_id_of(key)))
        return session.scalar(
            select(func.count()).select_from(Batch).where(Batch.tenant_id == tenant)
        )


def test_a_batch_is_stored_and_published_in_line_order(client, tenant_key, db):
    answer = _post(client, tenant_key, {"requests": _requests(5), "metadata": {"a": 1}})
    assert answer.status_code == 202, answer.get_json()
    batch = answer.get_json()
    assert batch["object"] == "batch" and batch["status"] == "in_progress"
    assert batch["endpoint"] == "/v1/jobs" and batch["metadata"] == {"a": 1}
    assert batch["counts"]["queued"] == 5 and batch["counts"]["total"] == 5
    assert batch["request_counts"] == {"total": 5, "completed": 0, "failed": 0}
    assert answer.headers["Location"].endswith(f"/v1/batches/{batch['id']}")
    jobs = _jobs(db, batch["id"])
    assert [j.custom_id for j in jobs] == [f"c-{i}" for i in range(5)]  # ids in line order
    assert all(j.status.value == "queued" and j.model == "tiny-b" for j in jobs)
    # Each publish was confirmed and recorded (in the background batch of marks).
    wait_until(lambda: all(j.published_at for j in _jobs(db, batch["id"])), timeout=10)
    again = client.get(f"/v1/batches/{batch['id']}", headers=auth(tenant_key)).get_json()
    assert again["status"] == "in_progress" and again["counts"]["queued"] == 5
    listed = client.get("/v1/batches?limit=1", headers=auth(tenant_key)).get_json()
    assert listed["object"] == "list" and listed["data"][0]["id"] == batch["id"]
    client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth(tenant_key))


def test_a_jsonl_body_takes_its_options_from_the_query(client, tenant_key, db):
    lines = "\n".join(json.dumps(r) for r in _requests(3)) + "\n\n"
    answer = _post(
        client,
        tenant_key,
        data=lines,
        content_type="application/jsonl",
        query="?completion_window=90m&metadata=%7B%22k%22%3A%22v%22%7D",
    )
    assert answer.status_code == 202, answer.get_json()
    batch = answer.get_json()
    assert batch["counts"]["queued"] == 3 and batch["completion_window"] == "90m"
    assert batch["expires_at"] - batch["created_at"] == pytest.approx(5400, abs=2)
    assert batch["metadata"] == {"k": "v"}
    client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth(tenant_key))


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"custom_id": "x", "prompt": "p", "steps": 9999}, "steps"),
        ({"custom_id": "x", "prompt": "p", "model": "no-such"}, "model"),
        ({"prompt": "p"}, "custom_id"),
        ({"custom_id": "", "prompt": "p"}, "custom_id"),
        ({"custom_id": "x", "prompt": "p", "webhook": "https://example.com/"}, "webhook"),
        ({"custom_id": "x"}, "prompt"),
        ("not an object", "_line"),
    ],
)
def test_a_bad_line_refuses_the_whole_batch_naming_line_and_field(
    client, tenant_key, db, bad, field
):
    requests = [*_requests(2), bad, *_requests(1, seed=1)]
    requests[-1]["custom_id"] = "last"
    answer = _post(client, tenant_key, {"requests": requests})
    assert answer.status_code == 422, answer.get_json()
    body = answer.get_json()
    assert body["errors"]["lines"] == {"3": body["errors"]["lines"]["3"]}
    assert field in body["errors"]["lines"]["3"]
    assert "line 3" in body["message"] and "nothing was stored" in body["message"]
    assert body["error"]["type"] == "invalid_request_error"  # OpenAI's clients read this
    assert _batches_of(db, tenant_key) == 0


def test_a_batch_of_image_jobs_stores_its_inputs_only_once_accepted(client, other_key, db):
    """Lines of image-to-image jobs carrying a data: URI: a batch refused for one bad line
    stores none of the images; accepted, each distinct image is stored once (content
    addressed) and the jobs name it."""
    import base64

    import numpy as np
    from PIL import Image

    from app.db.models.inputs import Upload
    from app.db.models.tenants import ApiKey
    from app.keys import key_id_of

    buffer = io.BytesIO()
    pixels = np.random.default_rng(7).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    line = {"kind": "img2img", "model": "tiny", "image": uri, "strength": 0.5, "steps": 2}

    def uploads() -> int:
        with db.session() as session:
            tenant = session.scalar(
                select(ApiKey.tenant_id).where(ApiKey.key_id == key_id_of(other_key))
            )
            return session.scalar(
                select(func.count()).select_from(Upload).where(Upload.tenant_id == tenant)
            )

    before = uploads()
    lines = [{"custom_id": f"i-{i}", "prompt": f"p {i}", **line} for i in range(2)]
    bad = {**lines[1], "custom_id": "bad", "strength": 1.5}
    refused = _post(client, other_key, {"requests": [*lines, bad]})
    assert refused.status_code == 422, refused.get_json()
    assert "strength" in refused.get_json()["errors"]["lines"]["3"]
    assert uploads() == before  # nothing stored for a refused batch
    accepted = _post(client, other_key, {"requests": lines})
    assert accepted.status_code == 202, accepted.get_json()
    assert uploads() == before + 1  # the same image twice: one upload
    jobs = _jobs(db, accepted.get_json()["id"])
    assert [job_request(job).kind for job in jobs] == ["img2img", "img2img"]
    assert len({job_request(job).image for job in jobs}) == 1
    client.post(f"/v1/batches/{accepted.get_json()['id']}/cancel", headers=auth(other_key))


def test_a_jsonl_line_that_is_not_json_is_named(client, tenant_key, db):
    data = json.dumps(_requests(1)[0]) + "\n{oops\n" + json.dumps(_requests(2)[1]) + "\n"
    answer = _post(client, tenant_key, data=data, content_type="application/x-ndjson")
    assert answer.status_code == 422
    assert answer.get_json()["errors"]["lines"] == {"2": {"_line": ["Not valid JSON."]}}
    assert _batches_of(db, tenant_key) == 0


def test_duplicate_custom_ids_are_refused(client, tenant_key, db):
    requests = _requests(3)
    requests[2]["custom_id"] = "c-0"
    answer = _post(client, tenant_key, {"requests": requests})
    assert answer.status_code == 422
    problem = answer.get_json()["errors"]["lines"]["3"]["custom_id"][0]
    assert "Duplicate" in problem and "c-0" in problem
    assert _batches_of(db, tenant_key) == 0


def test_empty_batches_and_bad_bodies(client, tenant_key):
    empty = _post(client, tenant_key, {"requests": []})
    assert empty.status_code == 422 and "no requests" in empty.get_json()["message"]
    blank = _post(client, tenant_key, data="\n\n", content_type="application/jsonl")
    assert blank.status_code == 422
    missing = _post(client, tenant_key, {"prompt": "not a batch"})
    assert missing.status_code == 422 and "prompt" in missing.get_json()["message"]
    window = _post(client, tenant_key, {"requests": _requests(1), "completion_window": "5s"})
    assert window.status_code == 422 and "completion_window" in window.get_json()["message"]
    text = _post(client, tenant_key, data="x", content_type="text/plain")
    assert text.status_code == 415


@pytest.fixture(scope="module")
def small_app(stack):
    """An API whose batches take at most 4 requests and 4 KiB."""
    from app.config import load_settings
    from app.web.factory import create_app

    settings = replace(load_settings(), batch_max_lines=4, batch_max_bytes=4096)
    return create_app(settings).test_client()


def test_past_the_line_and_byte_limits_is_a_413_naming_the_limit(small_app, tenant_key, db):
    lines = _post(small_app, tenant_key, {"requests": _requests(5)})
    assert lines.status_code == 413
    assert "5 requests" in lines.get_json()["message"]
    assert "DIFFQ_BATCH_MAX_LINES" in lines.get_json()["message"]
    jsonl = "\n".join(json.dumps(r) for r in _requests(5))
    by_line = _post(small_app, tenant_key, data=jsonl, content_type="application/jsonl")
    assert by_line.status_code == 413
    big = _post(small_app, tenant_key, {"requests": _requests(2, negative_prompt="n" * 5000)})
    assert big.status_code == 413 and "DIFFQ_BATCH_MAX_BYTES" in big.get_json()["message"]
    assert "4096 bytes" in big.get_json()["message"]
    assert _batches_of(db, tenant_key) == 0


def test_a_batch_of_another_tenant_is_a_404(client, tenant_key, other_key):
    batch = _post(client, tenant_key, {"requests": _requests(1)}).get_json()
    for method, path in (
        ("get", f"/v1/batches/{batch['id']}"),
        ("post", f"/v1/batches/{batch['id']}/cancel"),
        ("get", f"/v1/batches/{batch['id']}/results"),
    ):
        answer = getattr(client, method)(path, headers=auth(other_key))
        assert answer.status_code == 404, (path, answer.get_json())
        assert answer.get_json()["error"]["type"] == "not_found_error"
    assert client.get("/v1/batches", headers=auth(other_key)).get_json()["data"] == []
    client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth(tenant_key))


def test_the_same_idempotency_key_answers_with_the_same_batch(client, tenant_key, db):
    body = {"requests": _requests(3)}
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    first = _post(client, tenant_key, body, headers=key)
    again = _post(client, tenant_key, body, headers=key)
    assert first.status_code == 202 and again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.get_json()["id"] == first.get_json()["id"]
    assert len(_jobs(db, first.get_json()["id"])) == 3  # no second set of jobs
    other = _post(client, tenant_key, {"requests": _requests(2)}, headers=key)
    assert other.status_code == 409
    client.post(f"/v1/batches/{first.get_json()['id']}/cancel", headers=auth(tenant_key))


def test_an_interrupted_ingest_is_finished_by_the_retry(flask_app, tenant_key, db):
    """The process storing a batch dies after its first chunk: the batch stays
    validating; the client's retry with the same key stores the rest, each job once."""
    from app.batches import ingest
    from app.jobs.submit import Caps, Submission
    from app.keys import key_id_of
    from app.web.inputs import without_inputs
    from app.web.resources.jobs.schemas import JobCreateSchema

    class Died(Exception):
        pass

    def die(stored: int) -> None:
        raise Died(stored)

    from app.db.models.tenants import ApiKey

    with db.session() as session:
        tenant = session.scalar(
            select(ApiKey.tenant_id).where(ApiKey.key_id == key_id_of(tenant_key))
        )
    with flask_app.app_context():
        schema = JobCreateSchema()
        lines = [
            ingest.BatchLine(
                n,
                f"r-{n}",
                Submission(**without_inputs(schema.load({"prompt": f"r{n}", **LINE}))[0]),
            )
            for n in range(1, 8)
        ]
        request = ingest.BatchRequest("/v1/jobs", lines, idempotency_key="resume-1", body_hash="h")
        svc = flask_app.extensions["diffq"]
        caps = Caps(1000, 0, None)
        with db.session() as session, pytest.raises(Died):
            ingest.create_batch(
                session, svc.publisher, tenant, request, caps, chunk=3, on_chunk=die
            )
        with db.session() as session:
            again = ingest.create_batch(session, svc.publisher, tenant, request, caps, chunk=3)
            assert again.replayed and again.stored == 4
            batch_id = str(again.batch.id)
            assert again.batch.status == "in_progress"
    jobs = _jobs(db, batch_id)
    assert [j.custom_id for j in jobs] == [f"r-{n}" for n in range(1, 8)]
    # The first chunk was published before the ingest died, the rest by the retry.
    wait_until(lambda: all(j.published_at for j in _jobs(db, batch_id)), timeout=10)


def test_cancel_ends_queued_jobs_at_once_and_keeps_the_results_file(client, tenant_key, db):
    batch = _post(client, tenant_key, {"requests": _requests(4)}).get_json()
    canceled = client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth(tenant_key))
    assert canceled.status_code == 200
    body = canceled.get_json()
    assert body["status"] == "cancelled" and body["counts"]["canceled"] == 4
    assert body["cancelling_at"] and body["cancelled_at"] and body["error_file_id"]
    assert body["output_file_id"] is None
    jobs = _jobs(db, batch["id"])
    assert {j.status.value for j in jobs} == {"canceled"}
    results = client.get(f"/v1/batches/{batch['id']}/results", headers=auth(tenant_key))
    lines = [json.loads(line) for line in results.get_data(as_text=True).splitlines()]
    assert [(r["custom_id"], r["status"]) for r in lines] == [
        (f"c-{i}", "canceled") for i in range(4)
    ]
    errors = client.get(f"/v1/files/{body['error_file_id']}/content", headers=auth(tenant_key))
    rows = [json.loads(line) for line in errors.get_data(as_text=True).splitlines()]
    assert [r["error"]["code"] for r in rows] == ["batch_cancelled"] * 4
    assert (
        client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth(tenant_key)).status_code
        == 409
    )


def test_results_wait_for_the_end(client, tenant_key):
    batch = _post(client, tenant_key, {"requests": _requests(1)}).get_json()
    early = client.get(f"/v1/batches/{batch['id']}/results", headers=auth(tenant_key))
    assert early.status_code == 409 and "not ended" in early.get_json()["message"]
    client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth(tenant_key))


def test_the_completion_window_expires_what_has_not_started(client, tenant_key, db):
    from app.batches import lifecycle
    from app.db.models.batches import Batch
    from app.db.models.jobs import Job
    from app.db.types import utcnow

    batch = _post(client, tenant_key, {"requests": _requests(3), "completion_window": "1h"})
    batch = batch.get_json()
    batch_id = uuid.UUID(batch["id"])
    with db.session() as session:  # one job already running when the window ends
        first = session.scalar(select(Job.id).where(Job.batch_id == batch_id).order_by(Job.id))
        session.execute(
            update(Job).where(Job.id == first).values(status="running", lease_owner="w")
        )
        session.execute(
            update(Batch)
            .where(Batch.id == batch_id)
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    lifecycle.housekeep(db.session)
    body = client.get(f"/v1/batches/{batch['id']}", headers=auth(tenant_key)).get_json()
    assert body["status"] == "in_progress" and body["counts"]["expired"] == 2
    assert body["counts"]["running"] == 1 and body["expired_at"]
    with db.session() as session:  # the running one finishes after the window
        session.execute(update(Job).where(Job.id == first).values(status="failed", error_code="x"))
    lifecycle.housekeep(db.session)
    body = client.get(f"/v1/batches/{batch['id']}", headers=auth(tenant_key)).get_json()
    assert body["status"] == "expired" and body["counts"]["failed"] == 1
    assert body["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    results = client.get(f"/v1/batches/{batch['id']}/results", headers=auth(tenant_key))
    statuses = [json.loads(line)["status"] for line in results.get_data(as_text=True).splitlines()]
    assert statuses == ["failed", "expired", "expired"]


@pytest.fixture
def capped_app(stack):
    from app.config import load_settings
    from app.web.factory import create_app

    return create_app(replace(load_settings(), max_queued=5)).test_client()


def test_every_job_counts_under_the_queued_cap(capped_app, tenant_key, db):
    refused = _post(capped_app, tenant_key, {"requests": _requests(6)})
    assert refused.status_code == 429 and refused.headers["Retry-After"]
    assert "room for 5" in refused.get_json()["message"]
    assert _batches_of(db, tenant_key) == 0
    fits = _post(capped_app, tenant_key, {"requests": _requests(4)})
    assert fits.status_code == 202
    single = capped_app.post("/v1/jobs", json={"prompt": "one", **LINE}, headers=auth(tenant_key))
    assert single.status_code == 202
    over = capped_app.post("/v1/jobs", json={"prompt": "two", **LINE}, headers=auth(tenant_key))
    assert over.status_code == 429  # the batch's 4 jobs and the single one fill the cap
    capped_app.post(f"/v1/batches/{fits.get_json()['id']}/cancel", headers=auth(tenant_key))
    capped_app.post(f"/v1/jobs/{single.get_json()['id']}/cancel", headers=auth(tenant_key))


def _upload(client, key, lines: list) -> dict:
    data = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    answer = client.post(
        "/v1/files",
        data={"purpose": "batch", "file": (io.BytesIO(data.encode()), "in.jsonl")},
        headers=auth(key),
        content_type="multipart/form-data",
    )
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()


def _openai_line(custom_id: str, **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/images/generations",
        "body": {"prompt": "p", "model": "tiny-b", "size": "64x64", **body},
    }


def test_openai_form_a_bad_request_goes_to_the_error_file_alone(client, tenant_key, db):
    uploaded = _upload(client, tenant_key, [_openai_line("a"), _openai_line("b", n=9)])
    assert uploaded["purpose"] == "batch" and uploaded["bytes"] > 0
    answer = _post(
        client,
        tenant_key,
        {
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/images/generations",
            "completion_window": "24h",
        },
    )
    assert answer.status_code == 202, answer.get_json()
    batch = answer.get_json()
    assert batch["counts"]["queued"] == 1 and batch["counts"]["invalid"] == 1
    assert batch["input_file_id"] == uploaded["id"]
    done = client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth(tenant_key)).get_json()
    errors = client.get(f"/v1/files/{done['error_file_id']}/content", headers=auth(tenant_key))
    rows = {r["custom_id"]: r for r in map(json.loads, errors.get_data(as_text=True).splitlines())}
    assert rows["b"]["response"]["status_code"] == 422
    assert rows["b"]["response"]["body"]["error"]["param"] == "n"
    assert rows["a"]["error"]["code"] == "batch_cancelled"


def test_openai_form_an_unreadable_file_makes_a_failed_batch(client, tenant_key, db):
    lines = [
        _openai_line("a"),
        "{not json",
        {**_openai_line("a")},
        {**_openai_line("c"), "url": "/v1/embeddings"},
    ]
    uploaded = _upload(client, tenant_key, lines)
    answer = _post(
        client,
        tenant_key,
        {
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/images/generations",
            "completion_window": "24h",
        },
    )
    assert answer.status_code == 202
    batch = answer.get_json()
    assert batch["status"] == "failed" and batch["failed_at"]
    found = {(e["line"], e["code"]) for e in batch["errors"]["data"]}
    assert found == {(2, "invalid_json_line"), (3, "duplicate_custom_id"), (4, "mismatched_url")}
    assert _jobs(db, batch["id"]) == []


def test_files_of_another_tenant_are_404s(client, tenant_key, other_key):
    uploaded = _upload(client, tenant_key, [_openai_line("a")])
    assert client.get(f"/v1/files/{uploaded['id']}", headers=auth(other_key)).status_code == 404
    assert (
        client.get(f"/v1/files/{uploaded['id']}/content", headers=auth(other_key)).status_code
        == 404
    )
    named = _post(
        client,
        other_key,
        {
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/images/generations",
            "completion_window": "24h",
        },
    )
    assert named.status_code == 404
    content = client.get(f"/v1/files/{uploaded['id']}/content", headers=auth(tenant_key))
    assert json.loads(content.get_data(as_text=True))["custom_id"] == "a"


BATCH_ID = "01a2b3c4-0000-7000-8000-000000000000"
EVERY_ROUTE = [
    ("post", "/v1/batches", {"json": {"requests": [{"custom_id": "a", "prompt": "p"}]}}),
    ("get", "/v1/batches", {}),
    ("get", f"/v1/batches/{BATCH_ID}", {}),
    ("post", f"/v1/batches/{BATCH_ID}/cancel", {}),
    ("get", f"/v1/batches/{BATCH_ID}/results", {}),
    ("post", "/v1/files", {"data": {"purpose": "batch", "file": (io.BytesIO(b"{}"), "in.jsonl")}}),
    ("get", "/v1/files", {}),
    ("get", f"/v1/files/{BATCH_ID}", {}),
    ("delete", f"/v1/files/{BATCH_ID}", {}),
    ("get", f"/v1/files/{BATCH_ID}/content", {}),
]


@pytest.fixture(scope="module")
def storeless_app(stack):
    """An API whose database does not answer: nothing can be read or stored."""
    import os

    from app.config import load_settings
    from app.web.factory import create_app
    from testbed.ports import free_port

    url = f"postgresql+psycopg2://nobody:x@127.0.0.1:{free_port()}/none"
    app = create_app(load_settings({**os.environ, "DIFFQ_DATABASE_URL": url}))
    yield app.test_client()
    app.extensions["diffq"].close()


@pytest.mark.parametrize(("method", "path", "send"), EVERY_ROUTE)
def test_a_store_outage_is_a_503_in_both_envelopes_not_to_be_retried(
    storeless_app, method, path, send
):
    """docs/batches.md: every error of /v1/batches and /v1/files carries diffq's envelope
    and OpenAI's `error` object, and a 5xx says `x-should-retry: false` (the `openai`
    client would otherwise retry a create without an idempotency key)."""
    kwargs = {k: (dict(v) if isinstance(v, dict) else v) for k, v in send.items()}
    answer = getattr(storeless_app, method)(path, headers=auth("dq_any_key"), **kwargs)
    body = answer.get_json()
    assert answer.status_code == 503, body
    assert answer.headers["x-should-retry"] == "false"
    assert answer.headers["Retry-After"] == "5"
    assert body["code"] == 503 and body["status"] == "Service Unavailable"
    assert body["message"] == "The job store is unavailable; retry shortly."
    assert body["error"] == {
        "message": body["message"],
        "type": "server_error",
        "param": None,
        "code": None,
    }


def test_an_unexpected_failure_is_a_500_in_both_envelopes(client, tenant_key, monkeypatch):
    from app.web.services import services

    with client.application.app_context():
        storage = services().storage

    def broken(*_args, **_kwargs):
        raise RuntimeError("the store fell over")

    monkeypatch.setattr(storage, "put", broken)
    answer = client.post(
        "/v1/files",
        data={"purpose": "batch", "file": (io.BytesIO(b'{"a": 1}'), "in.jsonl")},
        headers=auth(tenant_key),
        content_type="multipart/form-data",
    )
    body = answer.get_json()
    assert answer.status_code == 500, body
    assert answer.headers["x-should-retry"] == "false"
    assert body["message"] == "Internal server error." and "fell over" not in answer.text
    assert body["error"]["type"] == "server_error" and body["error"]["message"] == body["message"]


def test_a_reader_that_loses_the_end_to_the_relay_shows_the_relays_files(client, tenant_key, db):
    """The API and the relay may both see a batch's last line end: one records the end. The
    one that lost shows the winner's file ids, never ids of its own that no row has (a
    fault run read such an id and got a 404). The window is held open here: the loser's
    batch is loaded before the winner commits, and finishes after."""
    from app.batches import lifecycle
    from app.db.models.batches import Batch, BatchFile

    batch = _post(client, tenant_key, {"requests": _requests(2)}).get_json()
    client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth(tenant_key))
    with db.session() as session:  # open again, its end not yet recorded
        session.execute(
            update(Batch)
            .where(Batch.id == uuid.UUID(batch["id"]))
            .values(finished_at=None, status="cancelling", output_file_id=None, error_file_id=None)
        )
        session.query(BatchFile).filter(BatchFile.batch_id == uuid.UUID(batch["id"])).delete()
    with db.session() as loser:
        late = loser.get(Batch, uuid.UUID(batch["id"]))
        assert late.finished_at is None
        with db.session() as winner:
            assert lifecycle.finish(winner, winner.get(Batch, late.id))
            winner.commit()
        assert lifecycle.finish(loser, late) is False
        recorded = late.error_file_id
        assert recorded is not None
        assert loser.get(BatchFile, recorded) is not None, "an error file id no row has"
    answer = client.get(f"/v1/files/{recorded}/content", headers=auth(tenant_key))
    assert answer.status_code == 200, answer.get_json()
