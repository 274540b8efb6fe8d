"""Batches through a real API and worker: diffq's client library (sync and asyncio), the
`openai` client's Batch API, and `diffq batch` on the command line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2
import openai
import pytest
import requests

from diffq.client import (
    AsyncClient,
    Client,
    JobFailed,
    NotFoundError,
    ServiceUnavailableError,
    UnprocessableEntityError,
)
from testbed.jobs import auth
from testbed.ports import free_port
from testbed.processes import ApiServer

pytestmark = pytest.mark.services

PNG = b"\x89PNG\r\n\x1a\n"
BATCH_ID = "01a2b3c4-0000-7000-8000-000000000000"  # no batch of anyone's


def _lines(n: int, prefix: str = "r", **extra) -> list[dict]:
    return [
        {"custom_id": f"{prefix}-{i}", "prompt": f"{prefix} {i}", "steps": 2, "seed": i, **extra}
        for i in range(n)
    ]


def test_a_batch_runs_to_completed_with_its_results_and_files(api_server, worker, tenant_key):
    with Client(api_server.url, tenant_key) as diffq:
        handle = diffq.batches.create(_lines(3), metadata={"run": "e2e"})
        assert handle.batch["status"] == "in_progress"
        seen: list[str] = []
        done = handle.wait(poll=0.3, on_update=lambda b: seen.append(b["status"]))
        assert done["status"] == "completed", done
        assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
        assert done["output_file_id"] and done["error_file_id"] is None
        rows = handle.results()
        assert [r["custom_id"] for r in rows] == ["r-0", "r-1", "r-2"]
        assert all(r["status"] == "succeeded" and r["error"] is None for r in rows)
        assert diffq.download(rows[0]["images"][0]["url"]).startswith(PNG)
        job = diffq.jobs.get(rows[1]["job_id"])
        assert job["input"]["seed"] == 1 and job["input"]["prompt"] == "r 1"
    output = requests.get(
        f"{api_server.url}/v1/files/{done['output_file_id']}/content",
        headers=auth(tenant_key),
        timeout=30,
    )
    lines = [json.loads(line) for line in output.text.splitlines()]
    assert [line["custom_id"] for line in lines] == ["r-0", "r-1", "r-2"]
    assert all(line["response"]["status_code"] == 200 for line in lines)
    assert lines[0]["response"]["body"]["status"] == "succeeded"  # the job object
    print(f"\nstatuses seen while waiting: {sorted(set(seen))}")


def test_run_waits_over_the_stream_and_errors_are_typed(api_server, worker, tenant_key):
    with Client(api_server.url, tenant_key) as diffq:
        events: list[str] = []
        handle = diffq.submit("a streamed kite", steps=6, seed=3)
        job = handle.wait(on_event=lambda e: events.append(e.name))
        assert job["status"] == "succeeded" and "status" in events
        assert handle.images()[0].startswith(PNG)
        assert diffq.run("run me", steps=2)["status"] == "succeeded"
        with pytest.raises(UnprocessableEntityError) as bad:
            diffq.submit("x", steps=9999)
        assert bad.value.status == 422 and "steps" in bad.value.errors["json"]
        with pytest.raises(NotFoundError):
            diffq.batches.get(BATCH_ID)
        queued = diffq.submit("never runs", model="tiny-b")
        queued.cancel()
        with pytest.raises(JobFailed):
            queued.images()


class DropFirstAnswer(httpx2.HTTPTransport):
    """Sends the first POST, then loses its answer, as a dropped connection would."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def handle_request(self, request):
        response = super().handle_request(request)
        if request.method == "POST" and not self.dropped:
            self.dropped += 1
            response.read()
            raise httpx2.ReadError("connection lost", request=request)
        return response


def test_a_retry_after_a_lost_answer_makes_no_second_job(api_server, tenant_key):
    transport = DropFirstAnswer()
    with Client(api_server.url, tenant_key, transport=transport) as diffq:
        handle = diffq.submit("once only", model="tiny-b")
        assert transport.dropped == 1
        listed = diffq.jobs.list(limit=100)["data"]
        assert [j["id"] for j in listed if j["input"]["prompt"] == "once only"] == [handle.id]
        handle.cancel()


def test_the_asyncio_client_runs_a_job_and_a_batch(api_server, worker, tenant_key):
    async def main():
        async with AsyncClient(api_server.url, tenant_key) as diffq:
            job = await diffq.run("async lighthouse", steps=2)
            batch = await diffq.batches.create(_lines(2, "a"))
            ended = await batch.wait(poll=0.3)
            return job, ended, await batch.results()

    # A thread of its own: a session's earlier tests (the browser's, driven by
    # Playwright's sync API) may leave an event loop running in this one.
    with ThreadPoolExecutor(1) as thread:
        job, ended, rows = thread.submit(asyncio.run, main()).result()
    assert job["status"] == "succeeded"
    assert ended["status"] == "completed"
    assert [r["status"] for r in rows] == ["succeeded", "succeeded"]


def _openai(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def test_the_openai_clients_batch_api_end_to_end(api_server, worker, tenant_key, tmp_path):
    client = _openai(api_server.url, tenant_key)
    path = tmp_path / "requests.jsonl"
    lines = [
        {
            "custom_id": f"img-{i}",
            "method": "POST",
            "url": "/v1/images/generations",
            "body": {"prompt": f"openai {i}", "model": "tiny", "size": "64x64", "steps": 2},
        }
        for i in range(2)
    ]
    lines.append({**lines[0], "custom_id": "too-many", "body": {"prompt": "x", "n": 9}})
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    uploaded = client.files.create(file=path.open("rb"), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == path.stat().st_size
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/images/generations",
        completion_window="24h",
        metadata={"source": "openai"},
    )
    assert batch.status == "in_progress" and batch.request_counts.total == 3
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.3)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    output = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in output) == ["img-0", "img-1"]
    url = output[0]["response"]["body"]["data"][0]["url"]
    assert requests.get(url, timeout=10).content.startswith(PNG)
    errors = [json.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()]
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("too-many", 422)]
    assert client.batches.list(limit=5).data[0].id == batch.id

    waiting = [{**lines[0], "custom_id": "w", "body": {"prompt": "w", "model": "tiny-b"}}]
    path.write_text(json.dumps(waiting[0]) + "\n")
    second = client.batches.create(
        input_file_id=client.files.create(file=path.open("rb"), purpose="batch").id,
        endpoint="/v1/images/generations",
        completion_window="24h",
    )
    cancelled = client.batches.cancel(second.id)
    assert cancelled.status in ("cancelling", "cancelled")
    assert client.batches.retrieve(second.id).status == "cancelled"
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve(BATCH_ID)


@pytest.fixture(scope="module")
def storeless_api(stack):
    """The API as it runs, with its database away: every batch route is a 503."""
    env = {
        **stack.env,
        "DIFFQ_DATABASE_URL": f"postgresql+psycopg2://nobody:x@127.0.0.1:{free_port()}/none",
    }
    server = ApiServer(env, stack.logs, name="api-storeless").start()
    yield server
    server.stop()


class Counted(httpx2.HTTPTransport):
    """Counts the requests that reach the wire (each retry is one more)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    def handle_request(self, request):
        self.sent += 1
        return super().handle_request(request)


class AsyncCounted(httpx2.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    async def handle_async_request(self, request):
        self.sent += 1
        return await super().handle_async_request(request)


def _once(call, transport, expected):
    """`call` raises `expected` after exactly one request: not retried (a retry would
    wait the answer's Retry-After, 5 s, and send again)."""
    sent, started = transport.sent, time.monotonic()
    with pytest.raises(expected) as caught:
        call()
    took = time.monotonic() - started
    print(f"{type(caught.value).__name__} after {took:.3f} s")
    # One request a call: no retry (the count is the proof; the time is printed only).
    assert transport.sent - sent == 1, f"{transport.sent - sent} requests in {took:.1f} s"
    return caught.value


def test_a_503_from_a_batch_route_is_not_retried_by_either_client(storeless_api, tmp_path):
    """docs/batches.md: 5xx answers of /v1/batches and /v1/files say `x-should-retry:
    false`. The `openai` client (retries on by default) and diffq's (sync and asyncio)
    obey it: one request, the 503 raised as each client's own type."""
    path = tmp_path / "requests.jsonl"
    path.write_text(json.dumps({"custom_id": "a", "prompt": "p"}) + "\n")
    counted = Counted()
    client = openai.OpenAI(
        base_url=f"{storeless_api.url}/v1",
        api_key="dq_any_key",
        http_client=httpx2.Client(transport=counted, timeout=30),
    )
    assert client.max_retries == 2
    for call in (
        lambda: client.batches.retrieve(BATCH_ID),
        lambda: client.batches.create(
            input_file_id=BATCH_ID,
            endpoint="/v1/images/generations",
            completion_window="24h",
        ),
        lambda: client.batches.list(),
        lambda: client.files.create(file=path.open("rb"), purpose="batch"),
    ):
        error = _once(call, counted, openai.InternalServerError)
        assert error.status_code == 503 and error.type == "server_error"
        assert error.message.endswith("The job store is unavailable; retry shortly.")
        assert error.response.headers["x-should-retry"] == "false"

    transport = Counted()
    with Client(storeless_api.url, "dq_any_key", transport=transport) as diffq:
        assert diffq.max_retries == 2
        for call in (
            lambda: diffq.batches.get(BATCH_ID),
            lambda: diffq.batches.create([{"custom_id": "a", "prompt": "p"}]),
            lambda: diffq.batches.create_from_jsonl(path),
            lambda: diffq.batches.cancel(BATCH_ID),
            lambda: diffq.batches.results(BATCH_ID),
        ):
            error = _once(call, transport, ServiceUnavailableError)
            assert error.status == 503 and error.retry_after == 5
            assert error.message == "The job store is unavailable; retry shortly."

    async def asyncio_client():
        sent = AsyncCounted()
        async with AsyncClient(storeless_api.url, "dq_any_key", transport=sent) as diffq:
            found = []
            for call in (
                diffq.batches.list,
                lambda: diffq.batches.get(BATCH_ID),
                diffq.batches.list,
            ):
                started = time.monotonic()
                with pytest.raises(ServiceUnavailableError):
                    await call()
                found.append(time.monotonic() - started)
            return sent.sent, found

    with ThreadPoolExecutor(1) as thread:
        sent, took = thread.submit(asyncio.run, asyncio_client()).result()
    print(f"asyncio: {sent} requests in {[round(t, 3) for t in took]} s")
    assert sent == 3, (sent, took)  # one request a call: no retry


def _diffq(api_server, key, *args, **kwargs) -> subprocess.Popen:
    env = {"DIFFQ_URL": api_server.url, "DIFFQ_API_KEY": key, "PATH": "/usr/bin:/bin"}
    return subprocess.Popen(
        [sys.executable, "-m", "cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_diffq_batch_submit_wait_draws_progress_and_writes_results(
    api_server, worker, tenant_key, tmp_path
):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in _lines(3, "cli")))
    out = tmp_path / "results.jsonl"
    run = _diffq(api_server, tenant_key, "batch", "submit", str(prompts), "--wait", "-o", str(out))
    stdout, stderr = run.communicate(timeout=180)
    assert run.returncode == 0, stderr
    assert "completed" in stdout and "[#" in stderr and "/3" in stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["custom_id"], r["status"]) for r in rows] == [
        ("cli-0", "succeeded"),
        ("cli-1", "succeeded"),
        ("cli-2", "succeeded"),
    ]


def test_ctrl_c_cancels_the_batch_after_asking(api_server, tenant_key, tmp_path):
    prompts = tmp_path / "waiting.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in _lines(4, "w", model="tiny-b")))
    # Ctrl-C's default disposition, as a terminal gives it: a shell that started this run in
    # the background (`cmd &`) passes SIGINT on ignored, and Python then installs no handler.
    run = _diffq(
        api_server,
        tenant_key,
        "batch",
        "submit",
        str(prompts),
        "--wait",
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    with Client(api_server.url, tenant_key) as diffq:
        while not diffq.batches.list(limit=1)["data"]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        batch_id = diffq.batches.list(limit=1)["data"][0]["id"]
        time.sleep(1.0)  # the command is polling now
        os.kill(run.pid, signal.SIGINT)
        _, stderr = run.communicate("y\n", timeout=60)
        assert run.returncode == 130, stderr
        assert "Cancel batch" in stderr and "cancelled" in stderr
        found = diffq.batches.get(batch_id)
    assert found["status"] == "cancelled" and found["counts"]["canceled"] == 4
