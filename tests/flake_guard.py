"""Reruns, named and bounded: a pytest plugin over pytest-rerunfailures (`--reruns 1`).

A test that fails and then passes on its rerun is a flake: the run still passes, but its
last lines before pytest's summary name each such test with its first failure's message
(and the wait it was in, for a timeout). More than `--max-flakes` of them (2 by default)
fail the run; a test that fails on its rerun too fails it as any failure does. The list is
also written to `.test-runs/reruns.txt` for `scripts/flakes` and docs/testing.md.

With pytest-xdist the reports reach the controller, which keeps the list; a worker
process keeps nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

EXIT_FLAKY = 1  # pytest's own "tests failed"


@dataclass
class Outcomes:
    first_failure: str = ""
    reruns: int = 0
    passed: bool = False
    failed: bool = False


@dataclass
class FlakeGuard:
    limit: int
    tests: dict[str, Outcomes] = field(default_factory=dict)

    def record(self, report) -> None:
        outcomes = self.tests.setdefault(report.nodeid, Outcomes())
        if report.outcome == "rerun":
            outcomes.reruns += 1
            if not outcomes.first_failure:
                outcomes.first_failure = failure_message(report)
        elif report.when == "call" and report.passed:
            outcomes.passed = True
        elif report.failed:
            outcomes.failed = True

    def flaky(self) -> list[tuple[str, Outcomes]]:
        """Tests that needed a rerun and then passed, in the order they ran."""
        return [
            (nodeid, o)
            for nodeid, o in self.tests.items()
            if o.reruns and o.passed and not o.failed
        ]

    def lines(self) -> list[str]:
        flaky = self.flaky()
        if not flaky:
            return ["no test needed a rerun"]
        out = [f"{len(flaky)} test(s) passed only on their rerun (at most {self.limit}):"]
        for nodeid, outcomes in flaky:
            out.append(f"  {nodeid}")
            out.append(f"      first failure: {outcomes.first_failure}")
        if len(flaky) > self.limit:
            out.append(f"more than {self.limit} flaky tests: the run fails")
        return out


def failure_message(report) -> str:
    """One line: the failure's own message, and for a timeout the test's frame it was
    waiting in (pytest-timeout fails the test where it waits)."""
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    message = (crash.message if crash is not None else str(report.longrepr)).strip()
    message = " ".join(message.split())[:400]
    if "Timeout" in message:
        waiting = waiting_frame(report.longreprtext)
        if waiting:
            message += f" (waiting at {waiting})"
    return message


_FRAME = re.compile(r"^((?:tests|testbed)/[\w/]+\.py):(\d+): ", re.M)


def waiting_frame(text: str) -> str:
    """The last frame of the suite's own code in a traceback: what the test waited on."""
    frames = _FRAME.findall(text or "")
    if not frames:
        return ""
    path, line = frames[-1]
    return f"{path}:{line}"


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--max-flakes",
        type=int,
        default=2,
        help="fail the run when more tests than this pass only on their rerun (default 2)",
    )


_GUARDS: list[FlakeGuard] = []  # the controller's (or the single process's) guard


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller keeps the list
        return
    if config.getoption("reruns", 0):
        _GUARDS[:] = [FlakeGuard(limit=config.getoption("--max-flakes"))]


def pytest_runtest_logreport(report) -> None:
    if _GUARDS:
        _GUARDS[0].record(report)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _GUARDS:
        return
    lines = _GUARDS[0].lines()
    path = Path(config.rootpath) / ".test-runs" / "reruns.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    terminalreporter.section("reruns")
    for line in lines:
        terminalreporter.write_line(line)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    if _GUARDS and len(_GUARDS[0].flaky()) > _GUARDS[0].limit and session.exitstatus == 0:
        session.exitstatus = EXIT_FLAKY
