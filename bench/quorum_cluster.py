"""Quorum queues on a 3-node cluster, longer: the quorum scenarios of the fault suite
(tests/faults/test_quorum_cluster.py: each node, the API and the two workers a machine of
their own on a simulated LAN) with more faults per scenario and longer cuts; prints the
table of figures.

    .venv/bin/python -m bench.quorum_cluster [--rounds 3] [--hold 30] [--submit-period 0.5]

Needs root and `ip netns` (testbed/lan.py), the rabbitmq-server binaries and what the
fault suite needs (`eval "$(scripts/services)"`).
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
    parser.add_argument("--rounds", type=int, default=3, help="leader kills and cuts")
    parser.add_argument("--hold", type=float, default=30.0, help="seconds each cut lasts")
    parser.add_argument("--submit-period", type=float, default=0.5, help="seconds per submit")
    args = parser.parse_args()
    env = {
        **os.environ,
        "DIFFQ_QUORUM_ROUNDS": str(args.rounds),
        "DIFFQ_QUORUM_HOLD": str(args.hold),
        "DIFFQ_QUORUM_SUBMIT_PERIOD": str(args.submit_period),
    }
    command = [sys.executable, "-m", "pytest", "tests/faults/test_quorum_cluster.py", "-q", "-s"]
    started = time.monotonic()
    code = subprocess.call(command, env=env, cwd=ROOT)
    table = ROOT / ".test-runs" / "faults.txt"
    print(
        f"\nquorum cluster: rounds={args.rounds} hold={args.hold:g}s "
        f"submit every {args.submit_period:g}s; {time.monotonic() - started:.0f} s in all"
    )
    if table.exists():
        print(table.read_text().rstrip())
    return code


if __name__ == "__main__":
    raise SystemExit(main())
