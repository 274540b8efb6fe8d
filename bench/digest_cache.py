"""A model folder's digest on a worker's start: read whole (every start before, the first
start now) against kept under DIFFQ_HOME/digests (every later start).

    .venv/bin/python -m bench.digest_cache [--gib 1] [--runs 3]

One folder with a weights file of `--gib` GiB of random bytes (read from the page cache
after the first run: the disk's speed is left out, which favours reading).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.report import print_table
from workers.manifest import files_digest


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        (folder / "unet").mkdir(parents=True)
        (folder / "model_index.json").write_text("{}")
        with (folder / "unet" / "diffusion_pytorch_model.safetensors").open("wb") as fh:
            for _ in range(round(args.gib * 1024)):
                fh.write(os.urandom(1 << 20))
        files_digest(folder)  # into the page cache
        read = [_timed(lambda: files_digest(folder)) for _ in range(args.runs)]
        cache = Path(tmp) / "digests"
        first = _timed(lambda: files_digest(folder, cache))
        kept = [_timed(lambda: files_digest(folder, cache)) for _ in range(args.runs)]
    base = statistics.median(read)
    rows = [
        {"start": "every start, before (read whole)", "seconds": f"{base:.4f}", "ratio": "1.00"},
        {
            "start": "first start (read, kept)",
            "seconds": f"{first:.4f}",
            "ratio": f"{first / base:.2f}",
        },
        {
            "start": "later start (kept)",
            "seconds": f"{statistics.median(kept):.4f}",
            "ratio": f"{statistics.median(kept) / base:.4f}",
        },
    ]
    print_table(
        f"Digest of a {args.gib:g} GiB model folder (median of {args.runs})", rows, list(rows[0])
    )


if __name__ == "__main__":
    main()
