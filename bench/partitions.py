"""Partitions, longer: the partition scenarios of the fault suite
(tests/faults/test_partitions.py, same helpers, same stack) with more cuts per scenario,
longer cuts and a longer slow, lossy window; prints the table of figures.

    .venv/bin/python -m bench.partitions [--rounds 3] [--hold 25] [--window 120]

Needs root and `ip netns` (testbed/netns.py), and what the fault suite needs (PostgreSQL
and RabbitMQ binaries; `scripts/services`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="cuts per scenario")
    parser.add_argument("--hold", type=float, default=25.0, help="seconds each cut lasts")
    parser.add_argument(
        "--window", type=float, default=120.0, help="seconds of 300 ± 100 ms and 5 %% loss"
    )
    parser.add_argument("--submit-period", type=float, default=1.0, help="seconds per submit")
    args = parser.parse_args()
    env = {
        **os.environ,
        "DIFFQ_PARTITION_ROUNDS": str(args.rounds),
        "DIFFQ_PARTITION_HOLD": str(args.hold),
        "DIFFQ_PARTITION_WINDOW": str(args.window),
        "DIFFQ_PARTITION_SUBMIT_PERIOD": str(args.submit_period),
    }
    command = [sys.executable, "-m", "pytest", "tests/faults/test_partitions.py", "-q", "-s"]
    started = time.monotonic()
    code = subprocess.call(command, env=env, cwd=ROOT)
    table = ROOT / ".test-runs" / "faults.txt"
    print(
        f"\npartitions: rounds={args.rounds} hold={args.hold:g}s window={args.window:g}s "
        f"submit every {args.submit_period:g}s; {time.monotonic() - started:.0f} s in all"
    )
    if table.exists():
        print(table.read_text().rstrip())
    return code


if __name__ == "__main__":
    raise SystemExit(main())
