"""A clip through diffq against the bare diffusers call, and what encoding costs.

    .venv/bin/python -m bench.video [--family ltx|wan] [--rounds 5] [--steps 8]
                                    [--frames 25] [--size 256x256]

Baseline: the loaded pipeline called directly (`pipe(prompt, num_frames=..., output_type=
"np")`, one seeded generator), as a script that uses diffusers alone would. Then the
worker's own call (workers/call.py: the kind's pipeline, a fresh scheduler, seeded
generators, the step callback that carries progress and cancel) on the same model. The
two are interleaved round by round so machine noise hits them alike; the ratio is
baseline / diffq (1.00: no overhead). Then the MP4 encoding of the clip (workers/video.py,
H.264 frame by frame), in seconds per frame beside the denoising's seconds per frame.
The tiny random-weight models (workers/tiny_video.py) on the CPU; on a GPU machine,
bench/gpu.py runs the published layouts.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.report import print_table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", choices=("ltx", "wan"), default="ltx")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--frames", type=int, default=25)
    parser.add_argument("--size", default="256x256")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))

    import torch

    from app.catalog import _spec_from_table
    from app.kinds import get_kind
    from workers.call import generate
    from workers.pipelines import load_model, warm_up
    from workers.tiny import build_tiny_model
    from workers.video import encode_video

    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / args.family, family=args.family)
        table = {
            "path": str(path),
            "family": args.family,
            "dtype": "float32",
            "min_size": 32,
            "max_width": max(width, 64),
            "max_height": max(height, 64),
            "max_pixels": max(width * height, 4096),
            "default_width": 64,
            "default_height": 64,
            "default_steps": 2,
            "default_frames": 9,
            "max_frames": max(args.frames, 9),
        }
        model = load_model(_spec_from_table("bench-video", table, Path(tmp)), "cpu")
    warm_up(model)
    request = get_kind("txt2vid").normalize(
        model.spec,
        {
            "prompt": "a paper boat in the rain",
            "width": width,
            "height": height,
            "num_frames": args.frames,
            "steps": args.steps,
            "seed": 7,
        },
    )
    pipe = model.pipeline

    def bare() -> object:
        generator = torch.Generator("cpu").manual_seed(request.seed)
        with torch.inference_mode():
            return pipe(
                prompt=request.prompt,
                width=width,
                height=height,
                num_frames=args.frames,
                num_inference_steps=args.steps,
                guidance_scale=request.guidance_scale,
                generator=generator,
                output_type="np",
            ).frames[0]

    def through_diffq() -> object:
        (output,) = generate(model, [request], on_step=[lambda *_: True])
        return output.images[0]

    times: dict[str, list[float]] = {"bare diffusers (baseline)": [], "through diffq": []}
    encode: list[float] = []
    clip = None
    for _ in range(args.rounds):
        for name, run in (("bare diffusers (baseline)", bare), ("through diffq", through_diffq)):
            started = time.perf_counter()
            clip = run()
            times[name].append(time.perf_counter() - started)
        started = time.perf_counter()
        encoded = encode_video(clip, request.fps)
        encode.append(time.perf_counter() - started)
    baseline = statistics.median(times["bare diffusers (baseline)"])
    rows = [
        {
            "variant": name,
            "median s": statistics.median(samples),
            "s/frame": statistics.median(samples) / args.frames,
            "vs baseline": baseline / statistics.median(samples),
        }
        for name, samples in times.items()
    ]
    rows.append(
        {
            "variant": f"MP4 encode ({encoded.codec}, {len(encoded.data)} bytes)",
            "median s": statistics.median(encode),
            "s/frame": statistics.median(encode) / args.frames,
            "vs baseline": None,
        }
    )
    print_table(
        f"{args.family} {width}x{height}, {args.frames} frames, {args.steps} steps, "
        f"{args.rounds} rounds, torch threads {torch.get_num_threads()}",
        rows,
        ["variant", "median s", "s/frame", "vs baseline"],
    )
    denoise = statistics.median(times["through diffq"])
    print(
        f"\nencode / generate: {statistics.median(encode) / denoise:.3f} "
        f"(the encode runs on the post-processing thread, off the GPU's path)"
    )


if __name__ == "__main__":
    main()
