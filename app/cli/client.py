"""The client side of `diffq`: `generate` and `jobs submit|get|list|watch|cancel`.

Reads the API URL and key from --url/--key or DIFFQ_URL/DIFFQ_API_KEY.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

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


def _body(args: argparse.Namespace, prompt: str) -> dict:
    body = {"prompt": prompt}
    for field in (
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
    ):
        value = getattr(args, field, None)
        if value is not None:
            body[field] = value
    return body


def _client(args: argparse.Namespace) -> Client:
    url = args.url or os.environ.get("DIFFQ_URL") or "http://127.0.0.1:8000"
    key = args.key or os.environ.get("DIFFQ_API_KEY")
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


def cmd_generate(args: argparse.Namespace) -> int:
    client = _client(args)
    job = client.submit(_body(args, args.prompt))
    print(f"job {job['id']} queued", file=sys.stderr)
    try:
        job = watch(client, job["id"], show=not args.quiet)
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
    for path in _save_images(client, job, args.output):
        print(path)
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    client = _client(args)
    action = args.jobs_command
    if action == "submit":
        job = client.submit(_body(args, args.prompt), idempotency_key=args.idempotency_key)
        if args.wait:
            job = watch(client, job["id"], show=not args.json)
        _print(job, args.json)
    elif action == "get":
        _print(client.get(args.job_id), args.json)
    elif action == "list":
        page = client.list(args.status, args.limit)
        if args.json:
            print(json.dumps(page, indent=2))
        else:
            for job in page["data"]:
                _print(job, False)
    elif action == "watch":
        _print(watch(client, args.job_id, show=not args.json), args.json)
    elif action == "cancel":
        _print(client.cancel(args.job_id), args.json)
    return 0


def _connection_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="API URL (default DIFFQ_URL or http://127.0.0.1:8000)")
    parser.add_argument("--key", help="API key (default DIFFQ_API_KEY)")


def _request_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt")
    parser.add_argument("--negative-prompt", dest="negative_prompt")
    parser.add_argument("--model")
    parser.add_argument("--width", type=int)
    parser.add_argument("--height", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--guidance-scale", dest="guidance_scale", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--num-images", dest="num_images", type=int)
    parser.add_argument("--scheduler")
    parser.add_argument("--format", dest="output_format", choices=["png", "jpeg", "webp"])
    parser.add_argument("--priority", choices=["low", "normal", "high"])
    parser.add_argument("--cancel-after", dest="cancel_after", type=int, help="seconds")


def register(commands) -> None:
    generate = commands.add_parser(
        "generate", help="submit a prompt, show live progress, save the images"
    )
    _request_flags(generate)
    _connection_flags(generate)
    generate.add_argument("-o", "--output", default="out.png", help="file (several: out-N.png)")
    generate.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    generate.set_defaults(handler=cmd_generate)

    jobs = commands.add_parser("jobs", help="jobs, for scripts (--json)")
    actions = jobs.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    submit = actions.add_parser("submit", help="submit a job")
    _request_flags(submit)
    submit.add_argument("--idempotency-key", dest="idempotency_key")
    submit.add_argument("--wait", action="store_true", help="follow it to the end")
    for name, text in (
        ("get", "show a job"),
        ("watch", "follow a job"),
        ("cancel", "cancel a job"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("job_id")
    listing = actions.add_parser("list", help="your jobs, newest first")
    listing.add_argument("--status", choices=["queued", "running", *TERMINAL])
    listing.add_argument("--limit", type=int, default=20)
    for action in actions.choices.values():
        _connection_flags(action)
        action.add_argument("--json", action="store_true", help="print JSON")
    jobs.set_defaults(handler=cmd_jobs)
