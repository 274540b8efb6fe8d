"""The asyncio client: `_sync.py`'s, awaited (kept beside it line for line)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx2

from diffq.client import _core
from diffq.client._core import BATCH_ENDED, RETRIED, TERMINAL, Event
from diffq.client.errors import APIConnectionError, APIError, JobFailed


class AsyncClient:
    """`AsyncClient(url, api_key)` (or DIFFQ_URL, DIFFQ_API_KEY). Failed attempts (no
    connection, 429, 502-504) are retried `max_retries` times with backoff, every POST
    with one Idempotency-Key, so a retry never makes a second job or batch."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 2,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        self.url, key = _core.settings(url, api_key)
        self.timeout = timeout
        self.max_retries = max_retries
        self.http = httpx2.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=timeout,
            transport=transport,
        )
        self.jobs = Jobs(self)
        self.batches = Batches(self)
        self.uploads = Uploads(self)
        self.adapters = Adapters(self)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, **kwargs) -> httpx2.Response:
        headers = _core.headers_for(method, kwargs.pop("headers", None))
        for attempt in range(self.max_retries + 1):
            try:
                response = await self.http.request(method, path, headers=headers, **kwargs)
            except httpx2.TransportError as exc:
                if attempt == self.max_retries:
                    raise APIConnectionError(f"{method} {path}: {exc}") from exc
                await asyncio.sleep(_core.backoff(attempt, None))
                continue
            if response.status_code in RETRIED and attempt < self.max_retries:
                await asyncio.sleep(_core.backoff(attempt, _core.retry_after_of(response.headers)))
                continue
            _core.raise_for(response.status_code, response.content, response.headers)
            return response
        raise AssertionError("unreachable")

    async def submit(self, prompt: str | None = None, **fields: Any) -> JobHandle:
        """Submit a job (any POST /v1/jobs field); its handle at once."""
        return await self.jobs.create(prompt, **fields)

    async def run(self, prompt: str | None = None, **fields: Any) -> dict[str, Any]:
        """Submit a job and wait for it over its event stream; the succeeded job, or
        JobFailed."""
        job = await (await self.submit(prompt, **fields)).wait()
        if job["status"] != "succeeded":
            raise JobFailed(job)
        return job

    async def download(self, url: str) -> bytes:
        """An image link's bytes (a presigned URL, or the API's own)."""
        if url.startswith(self.url):  # the API's own link (a local store's)
            response = await self.http.get(url, follow_redirects=True)
        else:  # a presigned link carries its own authorization: never send the key there
            async with httpx2.AsyncClient(timeout=self.timeout) as plain:
                response = await plain.get(url, follow_redirects=True)
        _core.raise_for(response.status_code, response.content, response.headers)
        return response.content


class JobHandle:
    def __init__(self, client: AsyncClient, job: dict[str, Any]) -> None:
        self.client, self.job, self.id = client, job, job["id"]

    async def refresh(self) -> dict[str, Any]:
        self.job = await self.client.jobs.get(self.id)
        return self.job

    async def status(self) -> str:
        return (await self.refresh())["status"]

    async def stream(self) -> AsyncIterator[Event]:
        """The job's events until it ends, resuming after a dropped connection."""
        parser = _core.SSEParser()
        while True:
            headers = {"Accept": "text/event-stream"}
            if parser.last_id is not None:
                headers["Last-Event-ID"] = parser.last_id
            try:
                async with self.client.http.stream(
                    "GET",
                    f"/v1/jobs/{self.id}/events",
                    headers=headers,
                    timeout=httpx2.Timeout(self.client.timeout, read=120),
                ) as response:
                    if response.status_code == 204:
                        return
                    if response.status_code >= 400:
                        await response.aread()
                        _core.raise_for(response.status_code, response.content, response.headers)
                    async for line in response.aiter_lines():
                        event = parser.feed(line)
                        if event is None:
                            continue
                        if event.name == "status":
                            self.job = event.data
                        yield event
                    return
            except httpx2.TransportError:
                await asyncio.sleep(1.0)

    async def wait(self, on_event: Callable[[Event], None] | None = None) -> dict[str, Any]:
        async for event in self.stream():
            if on_event is not None:
                on_event(event)
        if self.job.get("status") not in TERMINAL:
            await self.refresh()
        return self.job

    async def cancel(self) -> dict[str, Any]:
        self.job = await self.client.jobs.cancel(self.id)
        return self.job

    async def images(self) -> list[bytes]:
        """The images' bytes (the job must have succeeded)."""
        job = self.job if self.job.get("result") else await self.refresh()
        if job["status"] != "succeeded":
            raise JobFailed(job)
        return [await self.client.download(image["url"]) for image in job["result"]["images"]]


class Jobs:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def create(
        self, prompt: str | None = None, *, idempotency_key: str | None = None, **fields: Any
    ) -> JobHandle:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = _core.job_body(prompt, fields)
        job = (await self.client.request("POST", "/v1/jobs", json=body, headers=headers)).json()
        return JobHandle(self.client, job)

    async def get(self, job_id: str) -> dict[str, Any]:
        return (await self.client.request("GET", f"/v1/jobs/{job_id}")).json()

    async def list(
        self, *, status: str | None = None, limit: int = 20, cursor: str | None = None
    ) -> dict[str, Any]:
        params = {"limit": limit, "status": status, "cursor": cursor}
        params = {k: v for k, v in params.items() if v is not None}
        return (await self.client.request("GET", "/v1/jobs", params=params)).json()

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return (await self.client.request("POST", f"/v1/jobs/{job_id}/cancel")).json()

    async def handle(self, job_id: str) -> JobHandle:
        return JobHandle(self.client, await self.get(job_id))


class BatchHandle:
    def __init__(self, client: AsyncClient, batch: dict[str, Any]) -> None:
        self.client, self.batch, self.id = client, batch, batch["id"]

    async def refresh(self) -> dict[str, Any]:
        self.batch = await self.client.batches.get(self.id)
        return self.batch

    async def status(self) -> str:
        return (await self.refresh())["status"]

    @property
    def ended(self) -> bool:
        return self.batch["status"] in BATCH_ENDED

    async def wait(
        self, *, poll: float = 1.0, on_update: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any]:
        """Poll until the batch ends (completed, expired, cancelled, failed)."""
        while True:
            batch = await self.refresh()
            if on_update is not None:
                on_update(batch)
            if batch["status"] in BATCH_ENDED:
                return batch
            await asyncio.sleep(poll)

    async def cancel(self) -> dict[str, Any]:
        self.batch = await self.client.batches.cancel(self.id)
        return self.batch

    async def results(self) -> list[dict[str, Any]]:
        """Every request's outcome in input order (once ended): custom_id, status,
        images or error."""
        return await self.client.batches.results(self.id)


class Batches:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def create(
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
        answer = await self.client.request(
            "POST", "/v1/batches", json=body, headers=headers, timeout=max(self.client.timeout, 300)
        )
        batch = answer.json()
        return BatchHandle(self.client, batch)

    async def create_from_jsonl(
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
        answer = await self.client.request(
            "POST",
            "/v1/batches",
            content=data,
            params=params,
            headers=headers,
            timeout=max(self.client.timeout, 300),
        )
        return BatchHandle(self.client, answer.json())

    async def get(self, batch_id: str) -> dict[str, Any]:
        return (await self.client.request("GET", f"/v1/batches/{batch_id}")).json()

    async def list(self, *, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        return (await self.client.request("GET", "/v1/batches", params=params)).json()

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        return (await self.client.request("POST", f"/v1/batches/{batch_id}/cancel")).json()

    async def results(self, batch_id: str) -> list[dict[str, Any]]:
        response = await self.client.request("GET", f"/v1/batches/{batch_id}/results")
        return _core.jsonl(response.text)

    async def handle(self, batch_id: str) -> BatchHandle:
        return BatchHandle(self.client, await self.get(batch_id))


__all__ = ["APIError", "AsyncClient", "BatchHandle", "JobHandle"]


class Uploads:
    """Input images for image-to-image and inpainting jobs (POST /v1/uploads)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def create(self, image: str | Path | bytes, *, filename: str = "image") -> dict[str, Any]:
        """Store an image (a path, or its bytes); its upload (`id`: what a job's `image`
        or `mask` names)."""
        if not isinstance(image, bytes):
            filename, image = Path(image).name, Path(image).read_bytes()
        files = {"file": (filename, image)}
        return (await self.client.request("POST", "/v1/uploads", files=files)).json()

    async def get(self, upload_id: str) -> dict[str, Any]:
        return (await self.client.request("GET", f"/v1/uploads/{upload_id}")).json()


class Adapters:
    """LoRA adapters (.safetensors) that jobs name in `loras` (POST /v1/adapters)."""

    def __init__(self, client) -> None:
        self.client = client

    async def create(
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
        response = await self.client.request("POST", "/v1/adapters", files=files, data=form)
        return response.json()

    async def list(self) -> list[dict[str, Any]]:
        return (await self.client.request("GET", "/v1/adapters")).json()["data"]

    async def get(self, adapter_id: str) -> dict[str, Any]:
        return (await self.client.request("GET", f"/v1/adapters/{adapter_id}")).json()

    async def delete(self, adapter_id: str) -> None:
        await self.client.request("DELETE", f"/v1/adapters/{adapter_id}")
