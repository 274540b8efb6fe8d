"""The asyncio client: `_sync.py`'s, awaited (kept beside it line for line)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx2

from diffq.client import _core
from diffq.client._core import BATCH_ENDED, TERMINAL, UNANSWERED, Event
from diffq.client.errors import APIError, JobFailed


class AsyncClient:
    """`AsyncClient(url, api_key)` (or DIFFQ_URL, DIFFQ_API_KEY). Failed attempts (no
    connection, 429, 502-504 unless the answer says `x-should-retry: false`) are retried
    `max_retries` times with backoff, every POST with one Idempotency-Key, so a retry
    never makes a second job or batch. Everything it raises is a DiffqError."""

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
        self.videos = Videos(self)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def request(
        self, method: str, path: str, *, http: httpx2.AsyncClient | None = None, **kwargs
    ) -> httpx2.Response:
        """A successful answer, after the retries; a DiffqError otherwise. `http`: another
        httpx2 client to send it with (a presigned link's, without the key)."""
        http = http or self.http
        headers = _core.headers_for(method, kwargs.pop("headers", None))
        kwargs = _core.encoded(kwargs, headers)
        for attempt in range(self.max_retries + 1):
            try:
                response = await http.request(method, path, headers=headers, **kwargs)
            except httpx2.TransportError as exc:
                if attempt == self.max_retries:
                    raise _core.connection_error(method, path, exc) from exc
                await asyncio.sleep(_core.backoff(attempt, None))
                continue
            except UNANSWERED as exc:
                raise _core.connection_error(method, path, exc) from exc
            if attempt < self.max_retries and _core.should_retry(
                response.status_code, response.headers
            ):
                await asyncio.sleep(_core.backoff(attempt, _core.retry_after_of(response.headers)))
                continue
            _core.raise_for(response.status_code, response.content, response.headers)
            return response
        raise AssertionError("unreachable")

    async def read(self, method: str, path: str, *keys: str, **kwargs) -> dict[str, Any]:
        """`request`'s answer as its JSON object, with `keys` in it."""
        response = await self.request(method, path, **kwargs)
        return _core.answer(response.status_code, response.content, *keys)

    async def submit(self, prompt: str | None = None, **fields: Any) -> JobHandle:
        """Submit a job (any POST /v1/jobs field); its handle at once."""
        return await self.jobs.create(prompt, **fields)

    async def run(self, prompt: str | None = None, **fields: Any) -> dict[str, Any]:
        """Submit a job and wait for it over its event stream; the succeeded job, or
        JobFailed."""
        job = await (await self.submit(prompt, **fields)).wait()
        if job.get("status") != "succeeded":
            raise JobFailed(job)
        return job

    async def download(self, url: str) -> bytes:
        """An image link's bytes (a presigned URL, or the API's own)."""
        if url.startswith(self.url):  # the API's own link (a local store's)
            return (await self.request("GET", url, follow_redirects=True)).content
        # A presigned link carries its own authorization: never send the key there.
        async with httpx2.AsyncClient(timeout=self.timeout) as plain:
            return (await self.request("GET", url, http=plain, follow_redirects=True)).content


class JobHandle:
    def __init__(self, client: AsyncClient, job: dict[str, Any]) -> None:
        self.client, self.job, self.id = client, job, job["id"]

    async def refresh(self) -> dict[str, Any]:
        self.job = await self.client.jobs.get(self.id)
        return self.job

    async def status(self) -> str:
        return (await self.refresh())["status"]

    async def stream(self) -> AsyncIterator[Event]:
        """The job's events until it ends, resuming after a dropped connection;
        APIConnectionError after STREAM_RECONNECTS reconnections in a row fail."""
        parser = _core.SSEParser()
        path = f"/v1/jobs/{self.id}/events"
        failures = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if parser.last_id is not None:
                headers["Last-Event-ID"] = parser.last_id
            try:
                async with self.client.http.stream(
                    "GET",
                    path,
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
                        failures = 0
                        if event.name == "status":
                            self.job = event.data
                        yield event
                    return
            except httpx2.TransportError as exc:
                failures += 1
                if failures > _core.STREAM_RECONNECTS:
                    raise _core.connection_error("GET", path, exc) from exc
                await asyncio.sleep(_core.backoff(failures - 1, None))
            except UNANSWERED as exc:
                raise _core.connection_error("GET", path, exc) from exc

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

    async def videos(self) -> list[bytes]:
        """A video job's clips as MP4 bytes (the job must have succeeded); its poster
        frame is `images()`."""
        job = self.job if self.job.get("result") else await self.refresh()
        if job.get("status") != "succeeded":
            raise JobFailed(job)
        return [await self.client.download(url) for url in _core.result_urls(job, "videos")]

    async def images(self) -> list[bytes]:
        """The images' bytes (the job must have succeeded)."""
        job = self.job if self.job.get("result") else await self.refresh()
        if job.get("status") != "succeeded":
            raise JobFailed(job)
        return [await self.client.download(url) for url in _core.image_urls(job)]


class Jobs:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def create(
        self, prompt: str | None = None, *, idempotency_key: str | None = None, **fields: Any
    ) -> JobHandle:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = _core.job_body(prompt, fields)
        job = await self.client.read("POST", "/v1/jobs", "id", json=body, headers=headers)
        return JobHandle(self.client, job)

    async def get(self, job_id: str) -> dict[str, Any]:
        return await self.client.read("GET", f"/v1/jobs/{job_id}", "id", "status")

    async def list(
        self, *, status: str | None = None, limit: int = 20, cursor: str | None = None
    ) -> dict[str, Any]:
        params = {"limit": limit, "status": status, "cursor": cursor}
        params = {k: v for k, v in params.items() if v is not None}
        return await self.client.read("GET", "/v1/jobs", "data", params=params)

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return await self.client.read("POST", f"/v1/jobs/{job_id}/cancel", "id", "status")

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
        batch = await self.client.read(
            "POST",
            "/v1/batches",
            "id",
            "status",
            json=body,
            headers=headers,
            timeout=max(self.client.timeout, 300),
        )
        return BatchHandle(self.client, batch)

    async def create_from_jsonl(
        self,
        source: str | Path | bytes,
        *,
        completion_window: str | int | None = None,
        webhook: str | None = None,
        idempotency_key: str | None = None,
    ) -> BatchHandle:
        """A JSON Lines file (or its bytes), one request a line, sent as it is; an
        InputError naming the file and line if one is not a JSON object."""
        data = _core.jsonl_file(source)
        params = {"completion_window": completion_window, "webhook": webhook}
        params = {k: v for k, v in params.items() if v is not None}
        headers = {"Content-Type": "application/jsonl"}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        batch = await self.client.read(
            "POST",
            "/v1/batches",
            "id",
            "status",
            content=data,
            params=params,
            headers=headers,
            timeout=max(self.client.timeout, 300),
        )
        return BatchHandle(self.client, batch)

    async def get(self, batch_id: str) -> dict[str, Any]:
        return await self.client.read("GET", f"/v1/batches/{batch_id}", "id", "status")

    async def list(self, *, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        return await self.client.read("GET", "/v1/batches", "data", params=params)

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        return await self.client.read("POST", f"/v1/batches/{batch_id}/cancel", "id", "status")

    async def results(self, batch_id: str) -> list[dict[str, Any]]:
        response = await self.client.request("GET", f"/v1/batches/{batch_id}/results")
        return _core.jsonl(response.status_code, response.content)

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
            filename, image = Path(image).name, _core.read_file(image)
        files = {"file": (filename, image)}
        return await self.client.read("POST", "/v1/uploads", "id", files=files)

    async def get(self, upload_id: str) -> dict[str, Any]:
        return await self.client.read("GET", f"/v1/uploads/{upload_id}", "id")


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
            filename, adapter = Path(adapter).name, _core.read_file(adapter)
        form = {k: v for k, v in (("model", model), ("name", name)) if v is not None}
        files = {"file": (filename, adapter)}
        return await self.client.read("POST", "/v1/adapters", "id", files=files, data=form)

    async def list(self) -> list[dict[str, Any]]:
        return (await self.client.read("GET", "/v1/adapters", "data"))["data"]

    async def get(self, adapter_id: str) -> dict[str, Any]:
        return await self.client.read("GET", f"/v1/adapters/{adapter_id}", "id")

    async def delete(self, adapter_id: str) -> None:
        await self.client.request("DELETE", f"/v1/adapters/{adapter_id}")


class Videos:
    """Video jobs (a video model's `txt2vid` and `img2vid`): `create` returns the job's
    handle at once, `run` waits for the clip over its events."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def create(
        self,
        prompt: str | None = None,
        *,
        image: str | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> JobHandle:
        """Submit a clip: any POST /v1/jobs field (`model`, `num_frames`, `fps`, `width`,
        `height`, `steps`, `seed`, ...); `image` (an upload's id or a `data:` URI) makes it
        `img2vid`, starting from that frame."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = _core.video_body(prompt, image, fields)
        job = await self.client.read("POST", "/v1/jobs", "id", json=body, headers=headers)
        return JobHandle(self.client, job)

    async def run(
        self, prompt: str | None = None, *, image: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Submit a clip and wait for it; the succeeded job (its MP4 in
        `result.videos`), or JobFailed."""
        handle = await self.create(prompt, image=image, **fields)
        job = await handle.wait()
        if job.get("status") != "succeeded":
            raise JobFailed(job)
        return job
