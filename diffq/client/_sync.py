"""The blocking client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx2

from diffq.client import _core
from diffq.client._core import BATCH_ENDED, RETRIED, TERMINAL, Event
from diffq.client.errors import APIConnectionError, APIError, JobFailed


class Client:
    """`Client(url, api_key)` (or DIFFQ_URL, DIFFQ_API_KEY). Failed attempts (no
    connection, 429, 502-504) are retried `max_retries` times with backoff, every POST
    with one Idempotency-Key, so a retry never makes a second job or batch."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 2,
        transport: httpx2.BaseTransport | None = None,
    ) -> None:
        self.url, key = _core.settings(url, api_key)
        self.timeout = timeout
        self.max_retries = max_retries
        self.http = httpx2.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=timeout,
            transport=transport,
        )
        self.jobs = Jobs(self)
        self.batches = Batches(self)
        self.uploads = Uploads(self)
        self.adapters = Adapters(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs) -> httpx2.Response:
        headers = _core.headers_for(method, kwargs.pop("headers", None))
        for attempt in range(self.max_retries + 1):
            try:
                response = self.http.request(method, path, headers=headers, **kwargs)
            except httpx2.TransportError as exc:
                if attempt == self.max_retries:
                    raise APIConnectionError(f"{method} {path}: {exc}") from exc
                time.sleep(_core.backoff(attempt, None))
                continue
            if response.status_code in RETRIED and attempt < self.max_retries:
                time.sleep(_core.backoff(attempt, _core.retry_after_of(response.headers)))
                continue
            _core.raise_for(response.status_code, response.content, response.headers)
            return response
        raise AssertionError("unreachable")

    def submit(self, prompt: str | None = None, **fields: Any) -> JobHandle:
        """Submit a job (any POST /v1/jobs field); its handle at once."""
        return self.jobs.create(prompt, **fields)

    def run(self, prompt: str | None = None, **fields: Any) -> dict[str, Any]:
        """Submit a job and wait for it over its event stream; the succeeded job, or
        JobFailed."""
        job = self.submit(prompt, **fields).wait()
        if job["status"] != "succeeded":
            raise JobFailed(job)
        return job

    def download(self, url: str) -> bytes:
        """An image link's bytes (a presigned URL, or the API's own)."""
        if url.startswith(self.url):  # the API's own link (a local store's)
            response = self.http.get(url, follow_redirects=True)
        else:  # a presigned link carries its own authorization: never send the key there
            response = httpx2.get(url, follow_redirects=True, timeout=self.timeout)
        _core.raise_for(response.status_code, response.content, response.headers)
        return response.content


class JobHandle:
    def __init__(self, client: Client, job: dict[str, Any]) -> None:
        self.client, self.job, self.id = client, job, job["id"]

    def refresh(self) -> dict[str, Any]:
        self.job = self.client.jobs.get(self.id)
        return self.job

    @property
    def status(self) -> str:
        return self.refresh()["status"]

    def stream(self) -> Iterator[Event]:
        """The job's events until it ends, resuming after a dropped connection."""
        parser = _core.SSEParser()
        while True:
            headers = {"Accept": "text/event-stream"}
            if parser.last_id is not None:
                headers["Last-Event-ID"] = parser.last_id
            try:
                with self.client.http.stream(
                    "GET",
                    f"/v1/jobs/{self.id}/events",
                    headers=headers,
                    timeout=httpx2.Timeout(self.client.timeout, read=120),
                ) as response:
                    if response.status_code == 204:
                        return
                    if response.status_code >= 400:
                        response.read()
                        _core.raise_for(response.status_code, response.content, response.headers)
                    for line in response.iter_lines():
                        event = parser.feed(line)
                        if event is None:
                            continue
                        if event.name == "status":
                            self.job = event.data
                        yield event
                    return
            except httpx2.TransportError:
                time.sleep(1.0)

    def wait(self, on_event: Callable[[Event], None] | None = None) -> dict[str, Any]:
        for event in self.stream():
            if on_event is not None:
                on_event(event)
        if self.job.get("status") not in TERMINAL:
            self.refresh()
        return self.job

    def cancel(self) -> dict[str, Any]:
        self.job = self.client.jobs.cancel(self.id)
        return self.job

    def images(self) -> list[bytes]:
        """The images' bytes (the job must have succeeded)."""
        job = self.job if self.job.get("result") else self.refresh()
        if job["status"] != "succeeded":
            raise JobFailed(job)
        return [self.client.download(image["url"]) for image in job["result"]["images"]]


class Jobs:
    def __init__(self, client: Client) -> None:
        self.client = client

    def create(
        self, prompt: str | None = None, *, idempotency_key: str | None = None, **fields: Any
    ) -> JobHandle:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = _core.job_body(prompt, fields)
        job = self.client.request("POST", "/v1/jobs", json=body, headers=headers).json()
        return JobHandle(self.client, job)

    def get(self, job_id: str) -> dict[str, Any]:
        return self.client.request("GET", f"/v1/jobs/{job_id}").json()

    def list(
        self, *, status: str | None = None, limit: int = 20, cursor: str | None = None
    ) -> dict[str, Any]:
        params = {"limit": limit, "status": status, "cursor": cursor}
        params = {k: v for k, v in params.items() if v is not None}
        return self.client.request("GET", "/v1/jobs", params=params).json()

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self.client.request("POST", f"/v1/jobs/{job_id}/cancel").json()

    def handle(self, job_id: str) -> JobHandle:
        return JobHandle(self.client, self.get(job_id))


class BatchHandle:
    def __init__(self, client: Client, batch: dict[str, Any]) -> None:
        self.client, self.batch, self.id = client, batch, batch["id"]

    def refresh(self) -> dict[str, Any]:
        self.batch = self.client.batches.get(self.id)
        return self.batch

    @property
    def status(self) -> str:
        return self.refresh()["status"]

    @property
    def ended(self) -> bool:
        return self.batch["status"] in BATCH_ENDED

    def wait(
        self, *, poll: float = 1.0, on_update: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        """Poll until the batch ends (completed, expired, cancelled, failed)."""
        while True:
            batch = self.refresh()
            if on_update is not None:
                on_update(batch)
            if batch["status"] in BATCH_ENDED:
                return batch
            time.sleep(poll)

    def cancel(self) -> dict[str, Any]:
        self.batch = self.client.batches.cancel(self.id)
        return self.batch

    def results(self) -> list[dict[str, Any]]:
        """Every request's outcome in input order (once ended): custom_id, status,
        images or error."""
        return self.client.batches.results(self.id)


class Batches:
    def __init__(self, client: Client) -> None:
        self.client = client

    def create(
        self,
        requests: Iterable[Mapping[str, Any]],
        *,
        completion_window: str | int | None = None,
        webhook: str | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> BatchHandle:
        """`requests`: POST /v1/jobs bodies, each with its `custom_id`."""
        body = _core.batch_body(requests, completion_window, webhook, metadata)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        batch = self.client.request(
            "POST", "/v1/batches", json=body, headers=headers, timeout=max(self.client.timeout, 300)
        ).json()
        return BatchHandle(self.client, batch)

    def create_from_jsonl(
        self,
        source: str | Path | bytes,
        *,
        completion_window: str | int | None = None,
        webhook: str | None = None,
        idempotency_key: str | None = None,
    ) -> BatchHandle:
        """A JSON Lines file (or its bytes), one request a line, sent as it is."""
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        params = {"completion_window": completion_window, "webhook": webhook}
        params = {k: v for k, v in params.items() if v is not None}
        headers = {"Content-Type": "application/jsonl"}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        batch = self.client.request(
            "POST",
            "/v1/batches",
            content=data,
            params=params,
            headers=headers,
            timeout=max(self.client.timeout, 300),
        ).json()
        return BatchHandle(self.client, batch)

    def get(self, batch_id: str) -> dict[str, Any]:
        return self.client.request("GET", f"/v1/batches/{batch_id}").json()

    def list(self, *, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        return self.client.request("GET", "/v1/batches", params=params).json()

    def cancel(self, batch_id: str) -> dict[str, Any]:
        return self.client.request("POST", f"/v1/batches/{batch_id}/cancel").json()

    def results(self, batch_id: str) -> list[dict[str, Any]]:
        response = self.client.request("GET", f"/v1/batches/{batch_id}/results")
        return _core.jsonl(response.text)

    def handle(self, batch_id: str) -> BatchHandle:
        return BatchHandle(self.client, self.get(batch_id))


__all__ = ["APIError", "BatchHandle", "Client", "JobHandle"]


class Uploads:
    """Input images for image-to-image and inpainting jobs (POST /v1/uploads)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def create(self, image: str | Path | bytes, *, filename: str = "image") -> dict[str, Any]:
        """Store an image (a path, or its bytes); its upload (`id`: what a job's `image`
        or `mask` names)."""
        if not isinstance(image, bytes):
            filename, image = Path(image).name, Path(image).read_bytes()
        files = {"file": (filename, image)}
        return self.client.request("POST", "/v1/uploads", files=files).json()

    def get(self, upload_id: str) -> dict[str, Any]:
        return self.client.request("GET", f"/v1/uploads/{upload_id}").json()


class Adapters:
    """LoRA adapters (.safetensors) that jobs name in `loras` (POST /v1/adapters)."""

    def __init__(self, client) -> None:
        self.client = client

    def create(
        self,
        adapter: str | Path | bytes,
        *,
        model: str | None = None,
        name: str | None = None,
        filename: str = "adapter.safetensors",
    ) -> dict[str, Any]:
        """Store a LoRA (a path, or its bytes), checked for `model`'s family; the
        adapter (`id`: what a job's `loras[].id` names)."""
        if not isinstance(adapter, bytes):
            filename, adapter = Path(adapter).name, Path(adapter).read_bytes()
        form = {k: v for k, v in (("model", model), ("name", name)) if v is not None}
        files = {"file": (filename, adapter)}
        response = self.client.request("POST", "/v1/adapters", files=files, data=form)
        return response.json()

    def list(self) -> list[dict[str, Any]]:
        return (self.client.request("GET", "/v1/adapters")).json()["data"]

    def get(self, adapter_id: str) -> dict[str, Any]:
        return (self.client.request("GET", f"/v1/adapters/{adapter_id}")).json()

    def delete(self, adapter_id: str) -> None:
        self.client.request("DELETE", f"/v1/adapters/{adapter_id}")
