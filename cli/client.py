"""The client side of `diffq`: `generate` and `jobs submit|get|list|watch|cancel`.

Reads the API URL and key from --url/--key or DIFFQ_URL/DIFFQ_API_KEY.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from cli.api import ApiError, Client, Unreachable

__all__ = ["ApiError", "Client", "Unreachable"]

TERMINAL = ("succeeded", "failed", "canceled")
BAR_WIDTH = 30


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


class ProgressDisplay:
    """Progress on stderr: a bar redrawn in place on a terminal; elsewhere (a log, a
    pipe) one plain line each time the stage changes, without escape codes."""

    def __init__(self, stream=None, tty: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.drawn = False
        self.last: tuple | None = None

    def update(self, status: str, progress: dict) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + progress_line(status, progress))
            self.drawn = True
        else:
            stage = progress.get("stage", status)
            key = (status, stage)
            if key == self.last:
                return
            self.last = key
            self.stream.write(plain_line(status, progress) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def plain_line(job_status: str, progress: dict) -> str:
    stage = progress.get("stage", job_status)
    if job_status == "queued" or stage == "queued":
        return progress_line(job_status, progress)
    if stage == "denoising":
        return f"{job_status}: denoising, {progress.get('total_steps', 0)} steps"
    return f"{job_status}: {stage}"


def watch(client: Client, job_id: str, *, show: bool) -> dict:
    """Follow the job to a terminal state, showing progress on stderr when `show`."""
    status = "queued"
    job: dict | None = None
    display = ProgressDisplay() if show else None
    try:
        for name, data in client.events(job_id):
            if name == "status":
                job, status = data, data["status"]
                progress = data.get("progress") or {}
            else:
                progress = data
            if display is not None and status not in TERMINAL:
                display.update(status, progress)
    finally:
        if display is not None:
            display.close()
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
    "quality",
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


def _loras(values) -> list[dict]:
    """`--lora ID[:SCALE]`: an adapter's id (POST /v1/adapters) or a shared adapter's
    name, with its scale (default 1)."""
    import uuid

    loras = []
    for value in values or ():
        ref, _, scale = value.rpartition(":") if ":" in value else (value, "", "")
        try:
            lora: dict = {"id": str(uuid.UUID(ref))}
        except ValueError:
            lora = {"name": ref}
        if scale:
            try:
                lora["scale"] = float(scale)
            except ValueError:
                raise ValueError(f"--lora {value}: the scale after ':' must be a number") from None
        loras.append(lora)
    return loras


def _controls(client: Client, values) -> list[dict]:
    """`--control NAME=FILE[,scale=S][,start=A][,end=B][,preprocess=canny]`: a ControlNet of
    the catalog and a control image, uploaded here."""
    controls = []
    for value in values or ():
        name, _, rest = value.partition("=")
        path, *settings = rest.split(",")
        if not name or not path:
            raise ValueError(f"--control {value}: give NAME=FILE (a ControlNet and an image)")
        control: dict = {"controlnet": name}
        for setting in settings:
            key, _, given = setting.partition("=")
            if key not in ("scale", "start", "end", "preprocess") or not given:
                raise ValueError(
                    f"--control {value}: {setting!r} is not scale=, start=, end= or preprocess="
                )
            try:
                control[key] = given if key == "preprocess" else float(given)
            except ValueError:
                raise ValueError(f"--control {value}: {key} must be a number") from None
        if not Path(path).is_file():
            raise ValueError(f"--control {value}: no file {path}")
        control["image"] = client.upload(path)["id"]
        controls.append(control)
    return controls


def _with_inputs(client: Client, body: dict, options: dict) -> dict:
    """An image (and a mask) uploaded, the job made image to image (or inpainting); the
    adapters of `--lora`; the controls of `--control`, their images uploaded."""
    if options.get("lora"):
        body["loras"] = _loras(options["lora"])
    if options.get("control"):
        body["controls"] = _controls(client, options["control"])
    image, mask = options.get("image"), options.get("mask")
    if image is None:
        if mask is not None or options.get("strength") is not None:
            raise ValueError("--mask and --strength go with --image")
        return body
    body["kind"] = "inpaint" if mask is not None else "img2img"
    body["image"] = client.upload(image)["id"]
    if mask is not None:
        body["mask"] = client.upload(mask)["id"]
    if options.get("strength") is not None:
        body["strength"] = options["strength"]
    return body


def _client(url: str | None, key: str | None) -> Client:
    url = url or os.environ.get("DIFFQ_URL") or "http://127.0.0.1:8000"
    key = key or os.environ.get("DIFFQ_API_KEY")
    if not key:
        raise ValueError("an API key is needed: --key or DIFFQ_API_KEY")
    return Client(url, key)


def _print(job: dict, as_json: bool, *, detail: bool = False) -> None:
    """One line per job; with `detail` (a single job), what a reader needs next too: its
    image URLs once succeeded, its progress while running, its place while queued."""
    if as_json:
        print(json.dumps(job, indent=2))
        return
    line = (
        f"{job['id']}  {job['status']:<9}  {job['model']}  {job['input'].get('prompt', '')[:50]!r}"
    )
    if job.get("error"):
        line += f"  {job['error']['code']}: {job['error']['message']}"
    print(line)
    if not detail:
        return
    if job["status"] == "queued" and job.get("queue_position") is not None:
        print("  " + progress_line("queued", job))
    elif job["status"] == "running":
        print("  " + progress_line("running", job.get("progress") or {}))
    images = (job.get("result") or {}).get("images") or []
    for index, image in enumerate(images):
        size = f"{image['width']}x{image['height']}"
        print(f"  image {index}: {size} seed {image['seed']}  {image['url']}")
    if job.get("data_removed"):
        print("  images removed after the retention period")


def _target(output: str | None, index: int, count: int, job: dict) -> Path:
    """Where image `index` of `count` goes: `-o FILE` (FILE-N.ext for several), else
    `diffq-<job id>.<format>` in the current folder."""
    if output is None:
        extension = {"jpeg": ".jpg"}.get(
            job["input"]["output_format"], "." + job["input"]["output_format"]
        )
        out = Path(f"diffq-{job['id']}{extension}")
    else:
        out = Path(output)
    return out if count == 1 else out.with_name(f"{out.stem}-{index}{out.suffix}")


def _planned(output: str, count: int) -> list[Path]:
    return [_target(output, i, count, {}) for i in range(count)]


def _save_images(client: Client, job: dict, output: str | None, overwrite: bool) -> list[Path]:
    images = job["result"]["images"]
    saved = []
    for index, image in enumerate(images):
        path = _target(output, index, len(images), job)
        content = client.download(image["url"])
        with path.open("wb" if overwrite else "xb") as fh:  # never over a file by surprise
            fh.write(content)
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
    click.option("--negative-prompt", "negative_prompt", help="what to steer away from"),
    click.option("--model", help="a model of GET /v1/models (default: the default model)"),
    click.option("--width", type=int, help="pixels, a multiple of 8 (default: the model's)"),
    click.option("--height", type=int, help="pixels, a multiple of 8 (default: the model's)"),
    click.option("--steps", type=int, help="denoising steps (default: the model's)"),
    click.option(
        "--guidance-scale",
        "guidance_scale",
        type=float,
        help="classifier-free guidance (default: the model's, 7.5)",
    ),
    click.option("--seed", type=int, help="0..4294967295 (default: random); image N uses seed+N"),
    click.option("--num-images", "num_images", type=int, help="images in the job (default 1)"),
    click.option(
        "--scheduler",
        help="default, ddim, euler, euler_a, dpm++, pndm, lms or lcm, as the model offers",
    ),
    click.option(
        "--quality",
        type=click.Choice(["exact", "balanced", "fast"]),
        help="quality tier, as the model offers (default: the model's, exact)",
    ),
    click.option(
        "--format",
        "output_format",
        type=click.Choice(["png", "jpeg", "webp"]),
        help="image format (default png)",
    ),
    click.option(
        "--priority",
        type=click.Choice(["low", "normal", "high"]),
        help="queue priority (default normal)",
    ),
    click.option(
        "--cancel-after",
        "cancel_after",
        type=int,
        help="seconds: cancel the job if it has not finished by then",
    ),
    click.option(
        "--image",
        type=click.Path(exists=True, dir_okay=False),
        help="an input image (PNG, JPEG, WebP): image to image, or inpainting with --mask",
    ),
    click.option(
        "--mask",
        type=click.Path(exists=True, dir_okay=False),
        help="with --image: what to redraw, white on black, the image's size (inpainting)",
    ),
    click.option(
        "--strength",
        type=click.FloatRange(0.0, 1.0),
        help="with --image: how much is redrawn, 0..1 (default 0.75; 1.0 with --mask)",
    ),
    click.option(
        "--lora",
        multiple=True,
        metavar="ID[:SCALE]",
        help="a LoRA adapter: its id (POST /v1/adapters) or a shared adapter's name, "
        "with its scale (default 1); repeat for several",
    ),
    click.option(
        "--control",
        multiple=True,
        metavar="NAME=FILE[,scale=S][,start=A][,end=B][,preprocess=canny]",
        help="a ControlNet of the catalog (GET /v1/models lists them) and a control image, "
        "uploaded; repeat for several",
    ),
)
_json = click.option("--json", "as_json", is_flag=True, help="print JSON")


@click.command("generate")
@_request
@_connection
@click.option(
    "-o",
    "--output",
    help="file to write (several images: FILE-0.png, FILE-1.png …); default "
    "diffq-<job id>.<format> in the current folder",
)
@click.option("--overwrite", is_flag=True, help="replace an existing file (else refused)")
@click.option(
    "-q", "--quiet", is_flag=True, help="no progress or status lines: only the saved paths"
)
def generate(prompt, url, key, output, overwrite, quiet, **options) -> int:
    """Submit a prompt, show live progress, save the images (their paths go to stdout).

    Exit status: 0 saved, 1 the job failed or was canceled, 2 the API refused the
    request, 3 the API could not be reached or could not serve it (a 5xx), 130
    interrupted (the job is canceled).
    """
    if output is not None and not overwrite:
        taken = [p for p in _planned(output, options.get("num_images") or 1) if p.exists()]
        if taken:
            raise FileExistsError(
                f"{taken[0]} exists; choose another name with -o, or pass --overwrite"
            )
    client = _client(url, key)
    job = client.submit(_with_inputs(client, _body(prompt, options), options))
    if not quiet:
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
    if not quiet:
        took = (job.get("metrics") or {}).get("run_seconds")
        print(
            f"job {job['id']} succeeded" + (f" in {took:.1f} s" if took is not None else ""),
            file=sys.stderr,
        )
    for path in _save_images(client, job, output, overwrite):
        print(path)
    return 0


@click.group("jobs", short_help="Your jobs through the API: submit, get, list, watch, cancel.")
def jobs() -> None:
    """Jobs, for scripts (--json): submit, get, list, watch, cancel (through the API)."""


@jobs.command("submit")
@_request
@click.option(
    "--idempotency-key",
    "idempotency_key",
    help="any unique string: repeating the command returns the same job",
)
@click.option("--wait", is_flag=True, help="follow it to the end")
@_connection
@_json
def jobs_submit(prompt, idempotency_key, wait, url, key, as_json, **options) -> int:
    """Submit a job."""
    client = _client(url, key)
    body = _with_inputs(client, _body(prompt, options), options)
    job = client.submit(body, idempotency_key=idempotency_key)
    if wait:
        job = watch(client, job["id"], show=not as_json)
    _print(job, as_json, detail=wait)
    return 0


@jobs.command("get")
@click.argument("job_id")
@_connection
@_json
def jobs_get(job_id, url, key, as_json) -> int:
    """Show a job: its state, and its image URLs once it succeeded."""
    _print(_client(url, key).get(job_id), as_json, detail=True)
    return 0


@jobs.command("watch")
@click.argument("job_id")
@_connection
@_json
def jobs_watch(job_id, url, key, as_json) -> int:
    """Follow a job."""
    _print(watch(_client(url, key), job_id, show=not as_json), as_json, detail=True)
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
@click.option(
    "--status", type=click.Choice(["queued", "running", *TERMINAL]), help="only jobs in this state"
)
@click.option("--limit", type=int, default=20, show_default=True, help="jobs to show, 1..100")
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
