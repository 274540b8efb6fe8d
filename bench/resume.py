"""What checkpoints cost and what a resume saves, on one clip.

    .venv/bin/python -m bench.resume [--family ltx|wan] [--rounds 3] [--steps 40]
                                     [--frames 25] [--size 128x128] [--at 0.8]

Baseline: the worker's call with no checkpoints (workers/call.py). Then the same call
saving its state at every step (the most a `checkpoint_seconds` shorter than a step can
cost: capture on the call's thread plus the bytes written, here to memory), and a call
resumed from the state at `--at` of its steps (what a run killed there costs on its next
worker, without the model's load). The variants are interleaved round by round; the
ratio is baseline / variant. Each resumed clip is checked to be the baseline's bytes.
The tiny random-weight models on the CPU; the state's size in bytes is printed (it grows
with the latents: a 480p 81-frame Wan clip's latents are 8.4 MB in float32, about 34 MB
with UniPC's saved outputs).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.report import print_table


class _Saving:
    """Checkpoints kept in memory: every step due, or a resume from one state."""

    def __init__(self, *, every: bool = False, resume=None) -> None:
        from workers import denoise_state

        self._dumps = denoise_state.dumps
        self.every = every
        self.resume = resume
        self.states: dict[int, bytes] = {}

    def due(self, step: int, total: int) -> bool:
        return self.every

    def save(self, state, *, leaving: bool) -> None:
        self.states[state.step] = self._dumps(state)

    def refused(self, reason: str) -> None:
        raise AssertionError(f"resume refused: {reason}")

    def resumed(self, step: int) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", choices=("ltx", "wan"), default="ltx")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--frames", type=int, default=25)
    parser.add_argument("--size", default="128x128")
    parser.add_argument("--at", type=float, default=0.8)
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))

    import numpy as np
    import torch

    from app.catalog import _spec_from_table
    from app.kinds import get_kind
    from workers import denoise_state
    from workers.call import generate
    from workers.pipelines import load_model, warm_up
    from workers.tiny import build_tiny_model

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
        model = load_model(_spec_from_table("bench-resume", table, Path(tmp)), "cpu")
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
    at = max(1, min(args.steps - 1, round(args.steps * args.at)))

    def call(checkpoints=None):
        (output,) = generate(model, [request], on_step=[lambda *_: True], checkpoints=checkpoints)
        return output.images[0]

    every = _Saving(every=True)
    reference = call(every)
    state = denoise_state.loads(every.states[at])
    size = len(every.states[at])

    variants = {
        "no checkpoints (baseline)": lambda: call(),
        "a checkpoint every step": lambda: call(_Saving(every=True)),
        f"resumed at step {at} of {args.steps}": lambda: call(_Saving(resume=state)),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, run in variants.items():
            started = time.perf_counter()
            clip = run()
            times[name].append(time.perf_counter() - started)
            assert np.array_equal(clip, reference), f"{name}: not the uninterrupted bytes"
    baseline = statistics.median(times["no checkpoints (baseline)"])
    rows = [
        {
            "variant": name,
            "median s": statistics.median(samples),
            "vs baseline": baseline / statistics.median(samples),
        }
        for name, samples in times.items()
    ]
    print_table(
        f"{args.family} {width}x{height}, {args.frames} frames, {args.steps} steps, "
        f"{args.rounds} rounds, torch threads {torch.get_num_threads()}; "
        f"state {size / 1e6:.2f} MB",
        rows,
        ["variant", "median s", "vs baseline"],
    )
    saved = 1 - statistics.median(times[f"resumed at step {at} of {args.steps}"]) / baseline
    print(
        f"\na resume at {at}/{args.steps} saves {saved:.0%} of the run (every clip bit-identical)"
    )


if __name__ == "__main__":
    main()
