"""diffq.client's pieces without a server: webhook verification against the service's own
signing, the event-stream parser, errors from problem documents, its imports, every error
path of Client and AsyncClient raising one of its own types (over a mock transport); and
a batch job's id from its line."""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx2
import pytest

from app.webhooks import signing
from diffq.client import (
    APIConnectionError,
    AsyncClient,
    BatchHandle,
    Client,
    DiffqError,
    GoneError,
    InputError,
    InternalServerError,
    InvalidResponseError,
    JobHandle,
    NotFoundError,
    RateLimitError,
    ServiceUnavailableError,
    UnprocessableEntityError,
    WebhookVerificationError,
    verify_webhook,
)
from diffq.client._async import BatchHandle as AsyncBatchHandle
from diffq.client._async import JobHandle as AsyncJobHandle
from diffq.client._core import SSEParser, headers_for, raise_for, retry_after_of

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _signed(body: bytes, secrets=(SECRET,), timestamp=1_800_000_000) -> dict[str, str]:
    return signing.headers(list(secrets), "msg_1", timestamp, body)


def test_a_webhook_signed_by_the_service_verifies():
    body = json.dumps({"type": "batch.completed", "data": {"id": "b"}}).encode()
    event = verify_webhook(body, _signed(body), SECRET, now=1_800_000_010)
    assert event["type"] == "batch.completed"
    rotated = _signed(body, ("whsec_" + "A" * 32, SECRET))  # one signature per secret
    assert verify_webhook(body, rotated, SECRET, now=1_800_000_000)["data"] == {"id": "b"}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda b, h: (b + b" ", h), "no signature"),
        (lambda b, h: (b, {**h, "webhook-id": "msg_2"}), "no signature"),
        (lambda b, h: (b, {k: v for k, v in h.items() if k != "webhook-signature"}), "missing"),
        (lambda b, h: (b, {**h, "webhook-timestamp": "1799999000"}), "timestamp"),
    ],
)
def test_a_changed_or_stale_webhook_does_not_verify(change, why):
    body = b'{"type": "job.succeeded"}'
    altered_body, headers = change(body, _signed(body))
    with pytest.raises(WebhookVerificationError, match=why):
        verify_webhook(altered_body, headers, SECRET, now=1_800_000_000)


def test_the_event_stream_parser_reads_events_and_the_id_to_resume_from():
    parser = SSEParser()
    lines = [
        "retry: 2000",
        "",
        ": keep-alive",
        "id: 3",
        "event: progress",
        'data: {"percent": 50.0}',
        "",
        "id: 4",
        "event: status",
        'data: {"status":',
        'data: "succeeded"}',
        "",
    ]
    events = [e for e in map(parser.feed, lines) if e is not None]
    assert [(e.name, e.data, e.id) for e in events] == [
        ("progress", {"percent": 50.0}, "3"),
        ("status", {"status": "succeeded"}, "4"),
    ]
    assert parser.last_id == "4"


def test_errors_are_typed_from_the_problem_document():
    body = json.dumps(
        {"code": 422, "status": "Unprocessable Entity", "errors": {"json": {"steps": ["big"]}}}
    ).encode()
    with pytest.raises(UnprocessableEntityError) as bad:
        raise_for(422, body, {})
    assert bad.value.errors["json"]["steps"] == ["big"] and "HTTP 422" in str(bad.value)
    with pytest.raises(RateLimitError) as limited:
        raise_for(429, b'{"message": "slow down"}', {"retry-after": "7"})
    assert limited.value.retry_after == 7.0 and limited.value.message == "slow down"
    with pytest.raises(NotFoundError):
        raise_for(404, b"not json", {})
    raise_for(202, b"{}", {})  # no error


def test_every_post_gets_an_idempotency_key_and_keeps_a_given_one():
    made = headers_for("POST", None)["Idempotency-Key"]
    assert uuid.UUID(made) and headers_for("POST", {"Idempotency-Key": "k"}) == {
        "Idempotency-Key": "k"
    }
    assert "Idempotency-Key" not in headers_for("GET", None)


def test_the_client_imports_nothing_of_the_service():
    out = subprocess.run(
        [sys.executable, "-c", "import diffq.client, sys; print(' '.join(sorted(sys.modules)))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    roots = {name.split(".")[0] for name in out}
    assert not roots & {"app", "cli", "tasks", "workers", "flask", "sqlalchemy", "celery"}
    assert "httpx2" in roots


def test_a_batch_jobs_id_sorts_in_line_order_and_reads_back():
    from app.batches.ingest import line_job_id, line_of
    from app.ids import uuid7

    batch = uuid7()
    ids = [line_job_id(batch, n) for n in (1, 2, 16, 17, 4096, 50_000, 65_535)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [line_of(i) for i in ids] == [1, 2, 16, 17, 4096, 50_000, 65_535]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert line_job_id(uuid7(), 1) != ids[0]  # another batch, other ids


URL = "http://diffq.test"
BATCH = {"id": "b1", "status": "in_progress"}
JOB = {"id": "j1", "status": "succeeded"}


def _answer(status: int = 200, body=None, content: bytes | None = None, **headers):
    def handler(request):
        data = content if content is not None else json.dumps(body).encode()
        return httpx2.Response(status, content=data, headers=headers)

    return handler


def _refused(request):
    raise httpx2.ConnectError("[Errno 111] Connection refused", request=request)


def _each_client(handler, steps, **options) -> list[Exception]:
    """The same calls on Client and on AsyncClient over `handler`: what each raised (every
    step gets the previous one's result; the first gets the client)."""
    raised: list[Exception] = []
    options = {"max_retries": 0, **options}
    with Client(URL, "dq_k", transport=httpx2.MockTransport(handler), **options) as client:
        with pytest.raises(Exception) as caught:
            value = client
            for step in steps:
                value = step(value)
        raised.append(caught.value)

    async def asyncio_client():
        transport = httpx2.MockTransport(handler)
        async with AsyncClient(URL, "dq_k", transport=transport, **options) as client:
            try:
                value = client
                for step in steps:
                    value = step(value)
                    while inspect.isawaitable(value):
                        value = await value
                    if inspect.isasyncgen(value):
                        value = [item async for item in value]
            except Exception as exc:  # noqa: BLE001 - what it raised is the point
                return exc
        raise AssertionError("nothing raised")

    with ThreadPoolExecutor(1) as thread:
        raised.append(thread.submit(asyncio.run, asyncio_client()).result())
    return raised


GARBAGE = b"<html>502 from a proxy</html>"
ERROR_PATHS = {
    "an answer that is not JSON": (
        _answer(content=GARBAGE),
        [lambda c: c.batches.get("b1")],
        InvalidResponseError,
        "the answer is not JSON",
    ),
    "a list where an object goes": (
        _answer(body=[1, 2]),
        [lambda c: c.batches.list()],
        InvalidResponseError,
        "not a JSON object",
    ),
    "a batch without its id": (
        _answer(body={"status": "in_progress"}),
        [lambda c: c.batches.create([{"custom_id": "a", "prompt": "p"}])],
        InvalidResponseError,
        "the answer has no id",
    ),
    "a batch polled without its status": (
        _answer(body={"id": "b1"}),
        [lambda c: BATCH_HANDLES[type(c)](c, BATCH).wait(poll=0)],
        InvalidResponseError,
        "the answer has no status",
    ),
    "a cancel answered without its status": (
        _answer(body={"id": "b1"}),
        [lambda c: c.batches.cancel("b1")],
        InvalidResponseError,
        "the answer has no status",
    ),
    "results with a line that is not JSON": (
        _answer(content=b'{"custom_id": "a"}\n{"custom_id": \n'),
        [lambda c: c.batches.results("b1")],
        InvalidResponseError,
        "line 2 of the answer",
    ),
    "a body that says gzip and is not": (
        _answer(content=b"not gzip at all", **{"Content-Encoding": "gzip"}),
        [lambda c: c.batches.get("b1")],
        APIConnectionError,
        "GET /v1/batches/b1",
    ),
    "no connection": (
        _refused,
        [lambda c: c.batches.cancel("b1")],
        APIConnectionError,
        "POST /v1/batches/b1/cancel: [Errno 111] Connection refused",
    ),
    "a 503 of a batch route": (
        _answer(503, {"message": "The job store is unavailable."}, **{"x-should-retry": "false"}),
        [lambda c: c.batches.handle("b1")],
        ServiceUnavailableError,
        "HTTP 503: The job store is unavailable.",
    ),
    "a 500 with a page for a body": (
        _answer(500, content=GARBAGE),
        [lambda c: c.jobs.get("j1")],
        InternalServerError,
        "502 from a proxy",
    ),
    "a value JSON cannot hold": (
        _answer(body=BATCH),
        [lambda c: c.batches.create([{"custom_id": "a", "seed": object()}])],
        InputError,
        "cannot be sent as JSON",
    ),
    "a number JSON has not": (
        _answer(body=BATCH),
        [lambda c: c.batches.create([{"custom_id": "a", "guidance_scale": float("nan")}])],
        InputError,
        "cannot be sent as JSON",
    ),
    "a request that is not a mapping": (
        _answer(body=BATCH),
        [lambda c: c.batches.create([{"custom_id": "a"}, "b"])],
        InputError,
        "request 2 is not a mapping",
    ),
    "a bad line of bytes": (
        _answer(body=BATCH),
        [lambda c: c.batches.create_from_jsonl(b'{"custom_id": "a"}\n\n[1]\n')],
        InputError,
        "line 3: not a JSON object",
    ),
    "an event that is not JSON": (
        _answer(content=b"event: status\ndata: {oops\n\n", **{"Content-Type": "text/event-stream"}),
        [lambda c: JOB_HANDLES[type(c)](c, JOB).wait()],
        InvalidResponseError,
        "a status event's data is not a JSON object",
    ),
    "a succeeded job whose images are gone": (
        _answer(body={**JOB, "result": None, "data_removed": True}),
        [lambda c: JOB_HANDLES[type(c)](c, {"id": "j1"}).images()],
        GoneError,
        "removed after retention",
    ),
}
JOB_HANDLES = {Client: JobHandle, AsyncClient: AsyncJobHandle}
BATCH_HANDLES = {Client: BatchHandle, AsyncClient: AsyncBatchHandle}


@pytest.mark.parametrize("case", list(ERROR_PATHS), ids=list(ERROR_PATHS))
def test_every_error_path_raises_one_of_the_clients_own_types(case):
    handler, steps, expected, said = ERROR_PATHS[case]
    for raised in _each_client(handler, steps):
        assert type(raised) is expected, repr(raised)
        assert isinstance(raised, DiffqError) and said in str(raised), str(raised)


def test_a_file_that_cannot_be_sent_is_an_input_error_naming_it(tmp_path):
    """create_from_jsonl reads and checks the file before sending: nothing is sent, and
    the error names the file and its first bad line."""
    good = json.dumps({"custom_id": "a", "prompt": "p"}).encode()
    sent = []

    def handler(request):
        sent.append(request)
        return httpx2.Response(202, json=BATCH)

    cases = [
        (tmp_path / "missing.jsonl", None, None, "cannot read {path}: No such file or directory"),
        (tmp_path, None, None, "cannot read {path}: Is a directory"),
        (
            tmp_path / "a.jsonl",
            good + b"\n{not json}\n",
            2,
            "{path}, line 2: not JSON (Expecting property name enclosed in double quotes)",
        ),
        (tmp_path / "b.jsonl", good + b'\n\n"a string"\n', 3, "{path}, line 3: not a JSON object"),
        (tmp_path / "c.jsonl", b'{"prompt": "\xff"}\n', 1, "{path}, line 1: not JSON (not UTF-8)"),
    ]
    for path, content, line, said in cases:
        if content is not None:
            path.write_bytes(content)
        for raised in _each_client(handler, [lambda c, p=path: c.batches.create_from_jsonl(p)]):
            assert type(raised) is InputError, repr(raised)
            assert str(raised).startswith(said.format(path=path)), str(raised)
            assert (raised.path, raised.line) == (str(path), line)
    for raised in _each_client(handler, [lambda c: c.uploads.create(tmp_path / "missing.png")]):
        assert type(raised) is InputError and "cannot read" in str(raised)
    assert sent == []


def test_without_a_key_or_a_url_it_can_use_nothing_is_sent(monkeypatch):
    monkeypatch.delenv("DIFFQ_API_KEY", raising=False)
    for make in (Client, AsyncClient):
        with pytest.raises(InputError, match="an API key is needed"):
            make(URL)
        with pytest.raises(ValueError, match="http:// or https://"):
            make("ftp://diffq.test", "dq_k")


def test_a_presigned_link_that_cannot_be_reached_is_a_connection_error():
    from testbed.ports import free_port

    link = f"http://127.0.0.1:{free_port()}/bucket/image.png?X-Amz-Signature=s"
    raised = _each_client(_answer(body=JOB), [lambda c: c.download(link)])
    for error in raised:
        assert type(error) is APIConnectionError, repr(error)
        assert str(error).startswith(f"GET {link.partition('?')[0]}: "), str(error)


def test_an_event_stream_that_cannot_reconnect_gives_up(monkeypatch):
    from diffq.client import _core

    monkeypatch.setattr(_core, "STREAM_RECONNECTS", 2)
    monkeypatch.setattr(_core, "backoff", lambda attempt, retry_after: 0.0)
    calls = []

    def handler(request):
        calls.append(request.url.path)
        return _refused(request)

    steps = [lambda c: JOB_HANDLES[type(c)](c, {"id": "j1"}).stream()]
    steps.append(lambda events: list(events) if not inspect.isasyncgen(events) else events)
    for raised in _each_client(handler, steps):
        assert type(raised) is APIConnectionError, repr(raised)
        assert "GET /v1/jobs/j1/events" in str(raised)
    assert calls == ["/v1/jobs/j1/events"] * 6  # three tries each, then given up


def test_a_5xx_that_says_not_to_retry_is_not_retried():
    sent = []

    def handler(request):
        sent.append(request.headers["Idempotency-Key"])
        headers = {"Retry-After": "0"}
        if len(sent) <= 2:  # the first create's answers: retried
            return httpx2.Response(503, json={"message": "busy"}, headers=headers)
        if len(sent) == 3:
            return httpx2.Response(201, json=BATCH)
        return httpx2.Response(
            503, json={"message": "no"}, headers={**headers, "x-should-retry": "false"}
        )

    with Client(URL, "dq_k", transport=httpx2.MockTransport(handler), max_retries=2) as client:
        assert client.batches.create([{"custom_id": "a"}]).id == "b1"
        assert len(set(sent)) == 1  # one Idempotency-Key across its retries
        with pytest.raises(ServiceUnavailableError):
            client.batches.create([{"custom_id": "a"}])
    assert len(sent) == 4


def test_a_retry_after_that_is_no_number_of_seconds_is_ignored():
    assert retry_after_of({"retry-after": "nan"}) is None
    assert retry_after_of({"retry-after": "inf"}) is None
    assert retry_after_of({"retry-after": "-3"}) is None
    assert retry_after_of({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert retry_after_of({"retry-after": "2.5"}) == 2.5


def test_a_webhook_that_cannot_be_checked_is_a_typed_error():
    body = b"not json"
    with pytest.raises(WebhookVerificationError, match="not JSON"):
        verify_webhook(body, _signed(body), SECRET, now=1_800_000_000)
    with pytest.raises(WebhookVerificationError):
        verify_webhook(
            b"{}", {**_signed(b"{}"), "webhook-signature": "v1,é"}, SECRET, now=1_800_000_000
        )
    with pytest.raises(InputError, match="secret"):
        verify_webhook(b"{}", _signed(b"{}"), "whsec_not base64!", now=1_800_000_000)
