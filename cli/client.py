"""The client side of `diffq`: `generate` and `jobs submit|get|list|watch|cancel`.

Reads the API URL and key from --url/--key or DIFFQ_URL/DIFFQ_API_KEY.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
import requests

TERMINAL = ("succeeded", "failed", "canceled")
BAR_WIDTH = 30


class ApiError(Exception):
    def __init__(self, response: requests.Response) -> None:
        try:
            body = response.json()
            detail = body.get("message") or json.dumps(body.get("errors", body))
        except ValueError:
            detail = response.text[:200]
        super().__init__(f"HTTP {response.status_code}: {detail}")


class Client:
    def __init__(self, url: str, key: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {key}"
        self.timeout = timeout

    def _call(self, method: str, path: str, **kwargs) -> requests.Response:
        response = self.session.request(method, f"{self.url}{path}", timeout=self.timeout, **kwargs)
        if response.status_code >= 400:
            raise ApiError(response)
        return response

    def submit(self, body: dict, idempotency_key: str | None = None) -> dict:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", "/v1/jobs", json=body, headers=headers).json()

    def get(self, job_id: str) -> dict:
        return self._call("GET", f"/v1/jobs/{job_id}").json()

    def list(self, status: str | None, limit: int) -> dict:
        params = {"limit": limit, **({"status": status} if status else {})}
        return self._call("GET", "/v1/jobs", params=params).json()

    def cancel(self, job_id: str) -> dict:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel").json()

    def events(self, job_id: str) -> Iterator[tuple[str, dict]]:
        """(event name, data) from the job's event stream, resuming if the connection drops."""
        last_id = None
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_id is not None:
                headers["Last-Event-ID"] = last_id
            try:
                with self.session.get(
                    f"{self.url}/v1/jobs/{job_id}/events",
                    headers=headers,
                    stream=True,
                    timeout=(self.timeout, 120),
                ) as response:
                    if response.status_code == 204:
                        return
                    if response.status_code >= 400:
                        raise ApiError(response)
                    name, data = "message", []
                    for line in response.iter_lines(decode_unicode=True):
                        if line == "":
                            if data:
                                yield name, json.loads("\n".join(data))
                            name, data = "message", []
                        elif line.startswith("id:"):
                            last_id = line[3:].strip()
                        elif line.startswith("event:"):
                            name = line[6:].strip()
                        elif line.startswith("data:"):
                            data.append(line[5:].strip())
                    return  # the server closed the stream after the terminal event
            except (requests.ConnectionError, requests.Timeout):
                time.sleep(1)  # reconnect with Last-Event-ID


def progress_line(job_status: str, progress: dict) -> str:
    stage = progress.get("stage", job_status)
    if job_status == "queued" or stage == "queued":
        position, eta = progress.get("queue_position"), progress.get("eta_seconds")
        where = f"position {position}" if position is not None else ""
        when = f", starts in ~{eta:.0f}s" if eta is not None else ""
        return f"queued {where}{when}"
    step, total = progress.get("step", 0), progress.get("total_steps", 0)
    filled = int(BAR_WIDTH * (progress.get("percent", 0) or 0) / 100)
    bar = "#" * filled + "." * (BAR_WIDTH - filled)
    return f"[{bar}] {stage} {step}/{total}"


def watch(client: Client, job_id: str, *, show: bool) -> dict:
    """Follow the job to a terminal state, drawing progress on stderr when `show`."""
    status = "queued"
    job: dict | None = None
    for name, data in client.events(job_id):
        if name == "status":
            job, status = data, data["status"]
            progress = data.get("progress") or {}
        else:
            progress = data
        if show:
            sys.stderr.write("\r\033[K" + progress_line(status, progress))
            sys.stderr.flush()
    if show:
        sys.stderr.write("\n")
    if job is None or job["status"] not in TERMINAL:
        job = client.get(job_id)
    return job


FIELDS = (
    "negative_prompt",
    "model",
    "width",
    "height",
    "steps",
    "guidance_scale",
    "seed",
    "num_images",
    "scheduler",
    "output_format",
    "priority",
    "cancel_after",
)


def _body(prompt: str, options: dict) -> dict:
    body = {"prompt": prompt}
    for field in FIELDS:
        if options.get(field) is not None:
            body[field] = options[field]
    return body


def _client(url: str | None, key: str | None) -> Client:
    url = url or os.environ.get("DIFFQ_URL") or "http://127.0.0.1:8000"
    key = key or os.environ.get("DIFFQ_API_KEY")
    if not key:
        raise ValueError("an API key is needed: --key or DIFFQ_API_KEY")
    return Client(url, key)


def _print(job: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(job, indent=2))
        return
    line = (
        f"{job['id']}  {job['status']:<9}  {job['model']}  {job['input'].get('prompt', '')[:50]!r}"
    )
    if job.get("error"):
        line += f"  {job['error']['code']}: {job['error']['message']}"
    print(line)


def _save_images(client: Client, job: dict, output: str) -> list[Path]:
    images = job["result"]["images"]
    out = Path(output)
    saved = []
    for index, image in enumerate(images):
        path = out if len(images) == 1 else out.with_name(f"{out.stem}-{index}{out.suffix}")
        response = requests.get(image["url"], timeout=client.timeout)
        response.raise_for_status()
        path.write_bytes(response.content)
        saved.append(path)
    return saved


def _options(*options):
    def apply(command):
        for option in reversed(options):
            command = option(command)
        return command

    return apply


_connection = _options(
    click.option("--url", help="API URL (default DIFFQ_URL or http://127.0.0.1:8000)"),
    click.option("--key", help="API key (default DIFFQ_API_KEY)"),
)
_request = _options(
    click.argument("prompt"),
    click.option("--negative-prompt", "negative_prompt"),
    click.option("--model"),
    click.option("--width", type=int),
    click.option("--height", type=int),
    click.option("--steps", type=int),
    click.option("--guidance-scale", "guidance_scale", type=float),
    click.option("--seed", type=int),
    click.option("--num-images", "num_images", type=int),
    click.option("--scheduler"),
    click.option("--format", "output_format", type=click.Choice(["png", "jpeg", "webp"])),
    click.option("--priority", type=click.Choice(["low", "normal", "high"])),
    click.option("--cancel-after", "cancel_after", type=int, help="seconds"),
)
_json = click.option("--json", "as_json", is_flag=True, help="print JSON")


@click.command("generate")
@_request
@_connection
@click.option("-o", "--output", default="out.png", help="file (several: out-N.png)")
@click.option("-q", "--quiet", is_flag=True, help="no progress bar")
def generate(prompt, url, key, output, quiet, **options) -> int:
    """Submit a prompt, show live progress, save the images."""
    client = _client(url, key)
    job = client.submit(_body(prompt, options))
    print(f"job {job['id']} queued", file=sys.stderr)
    try:
        job = watch(client, job["id"], show=not quiet)
    except KeyboardInterrupt:
        client.cancel(job["id"])
        print(f"job {job['id']} canceled", file=sys.stderr)
        return 130
    if job["status"] != "succeeded":
        error = job.get("error") or {}
        print(
            f"job {job['id']} {job['status']}: {error.get('code')}: {error.get('message')}",
            file=sys.stderr,
        )
        return 1
    for path in _save_images(client, job, output):
        print(path)
    return 0


@click.group("jobs", short_help="Your jobs through the API: submit, get, list, watch, cancel.")
def jobs() -> None:
    """Jobs, for scripts (--json): submit, get, list, watch, cancel (through the API)."""


@jobs.command("submit")
@_request
@click.option("--idempotency-key", "idempotency_key")
@click.option("--wait", is_flag=True, help="follow it to the end")
@_connection
@_json
def jobs_submit(prompt, idempotency_key, wait, url, key, as_json, **options) -> int:
    """Submit a job."""
    client = _client(url, key)
    job = client.submit(_body(prompt, options), idempotency_key=idempotency_key)
    if wait:
        job = watch(client, job["id"], show=not as_json)
    _print(job, as_json)
    return 0


@jobs.command("get")
@click.argument("job_id")
@_connection
@_json
def jobs_get(job_id, url, key, as_json) -> int:
    """Show a job."""
    _print(_client(url, key).get(job_id), as_json)
    return 0


@jobs.command("watch")
@click.argument("job_id")
@_connection
@_json
def jobs_watch(job_id, url, key, as_json) -> int:
    """Follow a job."""
    _print(watch(_client(url, key), job_id, show=not as_json), as_json)
    return 0


@jobs.command("cancel")
@click.argument("job_id")
@_connection
@_json
def jobs_cancel(job_id, url, key, as_json) -> int:
    """Cancel a job."""
    _print(_client(url, key).cancel(job_id), as_json)
    return 0


@jobs.command("list")
@click.option("--status", type=click.Choice(["queued", "running", *TERMINAL]))
@click.option("--limit", type=int, default=20, show_default=True)
@_connection
@_json
def jobs_list(status, limit, url, key, as_json) -> int:
    """Your jobs, newest first."""
    page = _client(url, key).list(status, limit)
    if as_json:
        print(json.dumps(page, indent=2))
    else:
        for job in page["data"]:
            _print(job, False)
    return 0
