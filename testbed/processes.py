"""Real diffq processes (API, workers) started for tests, with their logs kept for asserts."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests

from testbed.ports import free_port


class ManagedProcess:
    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen | None = None
        self._log_offset = 0

    def start(self) -> ManagedProcess:
        # A restarted process appends to the same file; this process's log starts here.
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.args,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log(self) -> str:
        """What this process (not an earlier one under the same name) has logged."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as fh:
            fh.seek(self._log_offset)
            return fh.read().decode(errors="replace")

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.log()))

    def wait_for_log(self, pattern: str, timeout: float = 60.0, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.count(pattern) >= count:
                return
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode} before logging "
                    f"{pattern!r}:\n{self.log()[-3000:]}"
                )
            time.sleep(0.1)
        raise TimeoutError(
            f"{self.name} did not log {pattern!r} in {timeout}s:\n{self.log()[-3000:]}"
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        return self.process.returncode


def start_worker(
    env: dict[str, str],
    log_dir: Path,
    name: str,
    models: str | None = None,
    wait: bool = True,
    prefix: list[str] | None = None,
) -> ManagedProcess:
    """A `diffq worker` on the CPU; `prefix` runs it through a wrapper that execs it in
    place (`ip netns exec NS`, testbed/netns.py), so its pid is still the worker's."""
    args = [
        *(prefix or []),
        sys.executable,
        "-m",
        "cli",
        "worker",
        "--gpus",
        "none",
        "--loglevel",
        "info",
        "--name",
        name,
    ]
    if models:
        args += ["--models", models]
    # A fatal signal prints every thread's Python stack to the log (see below).
    worker = ManagedProcess(name, args, {**env, "PYTHONFAULTHANDLER": "1"}, log_dir).start()
    if wait:
        try:
            worker.wait_for_log(r"warmed up in", timeout=120)
            worker.wait_for_log(r"ready\.", timeout=60)
        except Exception as exc:
            stacks = dump_stacks(worker)
            worker.stop()
            raise RuntimeError(f"{exc}\n{stacks}") from exc
    return worker


def dump_stacks(worker: ManagedProcess) -> str:
    """Where a worker that did not start was stuck: SIGABRT to the supervisor's
    descendants (the Celery worker and its pool) makes each print its threads' Python
    stacks (PYTHONFAULTHANDLER)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    group, frontier = [], [worker.pid]
    while frontier:  # the supervisor's descendants: the Celery worker and its pool
        children = [pid for pid, parent in parents.items() if parent in frontier]
        group += children
        frontier = children
    for pid in group:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGABRT)
    deadline = time.monotonic() + 5  # each prints its stacks, then the signal ends it
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in group):
        time.sleep(0.05)
    text = worker.log()
    start = text.find("Fatal Python error")
    return f"stacks of pids {group}:\n" + (text[start : start + 6000] if start >= 0 else "none")


class ApiServer(ManagedProcess):
    def __init__(
        self,
        env: dict[str, str],
        log_dir: Path,
        name: str = "api",
        workers: int = 1,
        threads: int = 8,
        host: str = "127.0.0.1",
        prefix: list[str] | None = None,
    ) -> None:
        """`prefix`, `host`: run it through a wrapper (`ip netns exec NS`) and listen on the
        namespace's address, which the host reaches over the link."""
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        # /metrics is served on its own port, never on the public one (app/web/edge.py).
        self.metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        args = [
            *(prefix or []),
            sys.executable,
            "-m",
            "cli",
            "api",
            "--bind",
            f"{host}:{self.port}",
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            "--metrics-port",
            str(self.metrics_port),
        ]
        super().__init__(name, args, env, log_dir)

    def start(self, timeout: float = 120.0) -> ApiServer:
        """Until /healthz answers; at once when the process exits. `timeout` only bounds a
        boot that hangs alive: a fixed 30 s once measured the machine, when four test
        processes on two cores kept gunicorn's workers importing the app past it (run 53)."""
        super().start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"api exited:\n{self.log()[-3000:]}")
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"api not up after {timeout}s:\n{self.log()[-3000:]}")
