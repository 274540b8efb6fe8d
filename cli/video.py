"""`diffq video PROMPT`: a clip through the API, with live progress; the MP4 saved.

Like `diffq generate` (same connection options, exit statuses and progress bar), for a
video model's kinds: `txt2vid`, or `img2vid` with `--image` (the first frame).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cli.client import _client, _connection, watch


@click.command("video")
@click.argument("prompt")
@click.option("--model", help="a video model of GET /v1/models (default: the first video model)")
@click.option(
    "--image",
    type=click.Path(exists=True, dir_okay=False),
    help="the first frame (PNG, JPEG, WebP): image to video",
)
@click.option("--frames", "num_frames", type=int, help="k x the model's step + 1 (its default)")
@click.option("--fps", type=int, help="frames per second it plays at (the model's)")
@click.option("--width", type=int, help="pixels, the model's multiple (default: the model's)")
@click.option("--height", type=int, help="pixels, the model's multiple (default: the model's)")
@click.option("--steps", type=int, help="denoising steps (default: the model's)")
@click.option("--seed", type=int, help="0..4294967295 (default: random)")
@click.option("--negative-prompt", "negative_prompt", help="what to steer away from")
@click.option("--guidance-scale", "guidance_scale", type=float, help="the model's by default")
@click.option("--poster", type=click.Path(dir_okay=False), help="also save the poster frame here")
@click.option(
    "-o", "--output", help="the MP4 to write (default diffq-<job id>.mp4 in the current folder)"
)
@click.option("--overwrite", is_flag=True, help="replace an existing file (else refused)")
@click.option("-q", "--quiet", is_flag=True, help="no progress or status lines: only the path")
@_connection
def video(prompt, model, image, output, overwrite, quiet, poster, url, key, **options) -> int:
    """Make a clip, show live progress, save the MP4 (its path goes to stdout).

    Exit status: 0 saved, 1 the job failed or was canceled, 2 the API refused the
    request, 3 the API could not be reached or could not serve it, 130 interrupted (the
    job is canceled).
    """
    for target in (output, poster):
        if target is not None and not overwrite and Path(target).exists():
            raise FileExistsError(f"{target} exists; choose another name, or pass --overwrite")
    client = _client(url, key)
    body = {"prompt": prompt, "kind": "txt2vid" if image is None else "img2vid"}
    body["model"] = model or _video_model(client)
    body.update({k: v for k, v in options.items() if v is not None})
    if image is not None:
        body["image"] = client.upload(image)["id"]
    job = client.submit(body)
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
    (clip,) = job["result"]["videos"]
    path = Path(output or f"diffq-{job['id']}.mp4")
    with path.open("wb" if overwrite else "xb") as fh:
        fh.write(client.download(clip["url"]))
    if poster is not None:
        with Path(poster).open("wb" if overwrite else "xb") as fh:
            fh.write(client.download(job["result"]["images"][0]["url"]))
    if not quiet:
        print(
            f"job {job['id']} succeeded: {clip['frames']} frames at {clip['fps']} fps, "
            f"{clip['width']}x{clip['height']}, {clip['seconds']:.2f} s",
            file=sys.stderr,
        )
    print(path)
    return 0


def _video_model(client) -> str:
    """The default model if it makes video, else the first video model."""
    listing = client.models()
    models = {m["name"]: m for m in listing["data"]}
    default = models.get(listing.get("default_model"))
    if default is not None and default.get("video"):
        return default["name"]
    for name, model in models.items():
        if model.get("video"):
            return name
    raise ValueError("the API serves no video model (GET /v1/models): name one with --model")
