"""The conditioning cache's saving: a call whose prompt was encoded before against one
whose prompt is new, through the worker's one call (workers/call.py).

    .venv/bin/python -m bench.conditioning [--models sd sd3 flux] [--calls 8] [--steps 4]

For each model, `--calls` calls with a new prompt each (misses: the baseline, measured in
the same run) and as many with one prompt and new seeds (hits after the first); the table
gives each side's median seconds a call, the ratio, the encode seconds a hit saved (the
miss's own encode time, as the worker's `diffq_conditioning_cache_saved_seconds_total`
counts it) and whether a hit's image is the same bytes as without the cache. The tiny
models' text encoders are small; a large one (T5-XXL) saves 0.4-0.6 s a hit on a GPU.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

from bench.report import print_table


def _png(out) -> bytes:
    buffer = io.BytesIO()
    out.images[0].save(buffer, format="PNG")
    return buffer.getvalue()


def measure(name: str, device: str, calls: int, steps: int) -> dict:
    from app.kinds import KINDS
    from bench.quality import _model
    from workers import conditioning
    from workers.call import generate

    model, size = _model(name, device)

    def call(prompt: str, seed: int):
        job = KINDS["txt2img"].normalize(
            model.spec,
            {"prompt": prompt, "seed": seed, "steps": steps, "width": size, "height": size},
        )
        started = time.perf_counter()
        [out] = generate(model, [job], on_step=[lambda *_: True])
        return time.perf_counter() - started, out

    conditioning.CACHE = cache = conditioning.ConditioningCache(256 * 1024**2)
    call("warm", 0)
    new = [call(f"a new prompt, number {i}", i)[0] for i in range(calls)]
    call("one prompt", 0)  # its miss
    hits = [call("one prompt", i)[0] for i in range(1, calls + 1)]
    entry = next(e for k, e in cache._entries.items() if dict(k[3]).get("prompt") == "one prompt")
    _, with_cache = call("one prompt", 99)
    conditioning.CACHE = conditioning.ConditioningCache(0)
    _, without = call("one prompt", 99)
    return {
        "model": name,
        "new prompt s/call": statistics.median(new),
        "cached prompt s/call": statistics.median(hits),
        "ratio": f"{statistics.median(new) / statistics.median(hits):.2f}x",
        "encode s saved/hit": entry[2],
        "same bytes": _png(with_cache) == _png(without),
    }


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["sd", "sd3", "flux"])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)
    rows = [measure(name, device, args.calls, args.steps) for name in args.models]
    print_table(
        f"Conditioning cache on {device}, {args.steps} steps, median of {args.calls} calls "
        "(baseline: new prompts, same run)",
        rows,
        list(rows[0]),
    )


if __name__ == "__main__":
    main()
