"""What a job that starts from an image costs beyond text to image, on the tiny model.

    .venv/bin/python -m bench.image_inputs [--jobs 15] [--size 128] [--steps 8]

A private stack (PostgreSQL, RabbitMQ, S3, the API under gunicorn, one CPU worker), jobs
one at a time, alternating kinds so that a machine busy with other work weighs on each
alike. Submit: the POST's latency until its 202, for text to image (the baseline), image
to image naming an upload, image to image with the image inline as a `data:` URI (checked
and stored in the request), inpainting with the image uploaded and the mask inline; and
the upload itself. End to end: from the POST until a GET says succeeded, at the same size
and steps (strength 1.0, so the same number of denoising steps run). Ratios are against
text to image in the same run.
"""

from __future__ import annotations

import argparse
import base64
import io
import tempfile
import time
from pathlib import Path

import requests

from bench.report import print_table, summarize
from bench.submit_latency import _make_key
from testbed.jobs import auth
from testbed.processes import ApiServer, start_worker
from testbed.stack import start_stack

POLL_SECONDS = 0.05


def _png(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=15, help="of each kind")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    side = args.size
    picture = _png(Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)))
    mask = Image.new("L", (side, side), 0)
    mask.paste(255, (side // 4, side // 4, 3 * side // 4, 3 * side // 4))
    mask_uri = "data:image/png;base64," + base64.b64encode(_png(mask)).decode()
    picture_uri = "data:image/png;base64," + base64.b64encode(picture).decode()
    # No cache: the same image and seed under two kinds of input would be one run.
    common = {"prompt": "a benchmark", "steps": args.steps, "width": side, "height": side}
    common["cache"] = False

    with tempfile.TemporaryDirectory() as tmp:
        stack = start_stack(Path(tmp), {"DIFFQ_PROGRESS_INTERVAL": "0.25"})
        api = worker = None
        try:
            api = ApiServer(stack.env, stack.logs, name="bench-api").start()
            worker = start_worker(stack.env, stack.logs, "bench-worker", models="tiny")
            key = _make_key(stack.database_url)
            http = requests.Session()

            def upload() -> tuple[str, float]:
                started = time.perf_counter()
                answer = http.post(
                    f"{api.url}/v1/uploads", files={"file": ("in.png", picture)}, headers=auth(key)
                )
                assert answer.status_code == 201, answer.text
                return answer.json()["id"], (time.perf_counter() - started) * 1000

            image_id, _ = upload()
            kinds = {
                "txt2img (baseline)": {},
                "img2img, uploaded image": {"kind": "img2img", "image": image_id, "strength": 1.0},
                "img2img, inline data: URI": {
                    "kind": "img2img",
                    "image": picture_uri,
                    "strength": 1.0,
                },
                "inpaint, uploaded image + inline mask": {
                    "kind": "inpaint",
                    "image": image_id,
                    "mask": mask_uri,
                },
            }
            submit: dict[str, list[float]] = {name: [] for name in kinds}
            end_to_end: dict[str, list[float]] = {name: [] for name in kinds}
            uploads: list[float] = []
            for i in range(args.jobs + 1):  # the first round warms pools and caches
                for name, fields in kinds.items():
                    body = {**common, **fields, "seed": i}
                    started = time.perf_counter()
                    job = http.post(f"{api.url}/v1/jobs", json=body, headers=auth(key)).json()
                    accepted = time.perf_counter()
                    while job["status"] not in ("succeeded", "failed", "canceled"):
                        time.sleep(POLL_SECONDS)
                        job = http.get(f"{api.url}/v1/jobs/{job['id']}", headers=auth(key)).json()
                    assert job["status"] == "succeeded", job
                    if i:
                        submit[name].append((accepted - started) * 1000)
                        end_to_end[name].append((time.perf_counter() - started) * 1000)
                if i:
                    uploads.append(upload()[1])
        finally:
            for process in (worker, api):
                if process is not None:
                    process.stop()
            stack.close()

    for title, measured in (("Submit: POST until 202", submit), ("End to end", end_to_end)):
        base = summarize(measured["txt2img (baseline)"])["p50"]
        rows = []
        for name, samples in measured.items():
            row = {"job": name, **summarize(samples)}
            row["p50 / txt2img"] = row["p50"] / base
            rows.append(row)
        if measured is submit:
            row = {"job": "the upload itself (POST /v1/uploads)", **summarize(uploads)}
            row["p50 / txt2img"] = row["p50"] / base
            rows.append(row)
        print_table(
            f"{title}, ms (tiny model, {side}x{side}, {args.steps} steps, {args.jobs} jobs each, "
            "CPU)",
            rows,
            ["job", "n", "p50", "p90", "max", "p50 / txt2img"],
        )


if __name__ == "__main__":
    main()
