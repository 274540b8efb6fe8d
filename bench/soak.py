"""Soak: the fault suite's cheap mix (pool-child kills mid-generation and storms of
`pg_terminate_backend` on every service connection) under a steady submit rate, until
the given number of faults; prints the figures, and every 10 s samples each service
process tree's resident memory and open file descriptors, PostgreSQL's client connections
and RabbitMQ's connections and channels: a table of their medians after warm-up, and a
failure if memory or descriptors moved over 10 %.

    .venv/bin/python -m bench.soak --faults 2000 [--submit-period 0.5]

Needs what the fault suite needs (PostgreSQL and RabbitMQ binaries; `scripts/services`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=2000)
    parser.add_argument("--submit-period", type=float, default=0.5, help="seconds per submit")
    args = parser.parse_args()
    env = {
        **os.environ,
        "DIFFQ_SOAK_FAULTS": str(args.faults),
        "DIFFQ_SOAK_SUBMIT_PERIOD": str(args.submit_period),
    }
    command = [sys.executable, "-m", "pytest", "tests/faults/test_soak.py", "-q", "-s"]
    return subprocess.call(command, env=env)


if __name__ == "__main__":
    raise SystemExit(main())
