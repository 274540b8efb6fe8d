"""A flake hunt: run tests N times, optionally with every core kept busy, and print how
often each passed and failed, with each failure's first message (`scripts/flakes`).

    scripts/flakes -n 20 tests/e2e/test_cancel.py          # 20 runs, one process
    scripts/flakes -n 10 --load tests/e2e/test_websocket.py  # with both cores busy
    scripts/flakes -n 3 --suite                            # the whole suite as CI runs it
    scripts/flakes -n 3 --suite --load                     # ... under load

Each run writes JUnit XML; reruns are off, so a flake shows as the failure it is. The
load is one busy process per core (`nproc`), at the tests' own priority, started before
the first run and stopped after the last. The table goes to standard output and, with
`--report FILE`, to a file; the exit code is 1 if any run failed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUSY = "while True: pass"


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    first_failure: str = ""


@dataclass
class Hunt:
    tallies: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    runs: list[tuple[int, float, int, int]] = field(default_factory=list)  # rc, s, pass, fail

    def read(self, junit: Path) -> tuple[int, int]:
        passed = failed = 0
        if not junit.exists():
            return 0, 0
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            tally = self.tallies[name]
            problem = case.find("failure")
            if problem is None:
                problem = case.find("error")
            if problem is not None:
                tally.failed += 1
                failed += 1
                if not tally.first_failure:
                    message = (problem.get("message") or problem.text or "").strip()
                    tally.first_failure = " ".join(message.split())[:300]
            elif case.find("skipped") is not None:
                tally.skipped += 1
            else:
                tally.passed += 1
                passed += 1
        return passed, failed

    def table(self) -> list[str]:
        lines = ["run  exit  minutes  passed  failed"]
        for index, (code, seconds, passed, failed) in enumerate(self.runs, 1):
            lines.append(f"{index:>3}  {code:>4}  {seconds / 60:>7.1f}  {passed:>6}  {failed:>6}")
        flaky = {n: t for n, t in self.tallies.items() if t.failed}
        lines.append("")
        lines.append(
            f"{len(self.tallies)} tests, {len(flaky)} failed at least once "
            f"over {len(self.runs)} run(s)"
        )
        if flaky:
            lines.append("passed  failed  test  (first failure)")
            for name, tally in sorted(flaky.items(), key=lambda item: -item[1].failed):
                lines.append(f"{tally.passed:>6}  {tally.failed:>6}  {name}")
                lines.append(f"                {tally.first_failure}")
        return lines


@contextlib.contextmanager
def load(enabled: bool):
    """One busy process per core while the runs go on."""
    busy: list[subprocess.Popen] = []
    if enabled:
        for _ in range(os.cpu_count() or 1):
            busy.append(subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True))
    try:
        yield len(busy)
    finally:
        for process in busy:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def command(suite: bool, junit: Path, args: list[str]) -> list[str]:
    if suite:  # exactly the README's test command, reruns off
        return ["scripts/test", f"--junitxml={junit}", *args]
    python = str(ROOT / ".venv" / "bin" / "python")
    return [python, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={junit}", *args]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/flakes", description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--runs", type=int, default=10, help="how many runs (10)")
    parser.add_argument("--load", action="store_true", help="keep every core busy meanwhile")
    parser.add_argument("--suite", action="store_true", help="run scripts/test (the suite)")
    parser.add_argument("--report", type=Path, help="also write the table to this file")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="tests and pytest options")
    options = parser.parse_args(argv)
    args = [a for a in options.pytest_args if a != "--"]
    if not options.suite and not args:
        parser.error("name the tests to run, or --suite")
    out = ROOT / ".test-runs" / "flakes"
    out.mkdir(parents=True, exist_ok=True)
    hunt = Hunt()
    env = {**os.environ, "DIFFQ_TEST_RERUNS": "0"}
    with load(options.load) as busy:
        if busy:
            print(f"flakes: {busy} busy process(es) keep the cores loaded", flush=True)
        for index in range(1, options.runs + 1):
            junit = out / f"run-{index}.xml"
            junit.unlink(missing_ok=True)
            started = time.monotonic()
            print(f"flakes: run {index}/{options.runs}", flush=True)
            code = subprocess.call(command(options.suite, junit, args), cwd=ROOT, env=env)
            seconds = time.monotonic() - started
            passed, failed = hunt.read(junit)
            hunt.runs.append((code, seconds, passed, failed))
            print(
                f"flakes: run {index}: exit {code}, {seconds / 60:.1f} min, "
                f"{passed} passed, {failed} failed",
                flush=True,
            )
    lines = hunt.table()
    print("\n".join(lines))
    if options.report:
        options.report.write_text("\n".join(lines) + "\n")
    return 1 if any(code != 0 for code, *_ in hunt.runs) else 0


if __name__ == "__main__":
    sys.exit(main())
