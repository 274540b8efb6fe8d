"""`diffq up` as a newcomer runs it: the embedded defaults (SQLite, the filesystem broker,
local files) in a home of its own, with no server reachable, for tests that run a feature
end to end on the embedded stores as they do on PostgreSQL, RabbitMQ and S3."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from testbed.ports import free_port


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a fresh shell: no DIFFQ_ or AWS_ setting of the suite's stack,
    and PostgreSQL pointed at a closed port, so anything that reached for a server would
    fail here rather than find the suite's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DIFFQ_", "AWS_")) and k not in ("PYTHONPATH",)
    }
    env["HOME"] = str(home)
    env["OMP_NUM_THREADS"] = "1"  # the suite's processes share two cores (testbed/stack.py)
    env["PGHOST"] = "127.0.0.1"
    env["PGPORT"] = "1"
    env.update(extra)
    return env


class EmbeddedService:
    """`python -m cli up --bind 127.0.0.1:PORT` under HOME=`home`; `url` and the banner's
    `key` once it is up."""

    def __init__(self, home: Path, **settings: str) -> None:
        self.home = home
        self.settings = settings
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = home / "up.log"
        self.process: subprocess.Popen | None = None
        self.key = ""

    @property
    def data(self) -> Path:
        return self.home / ".diffq"

    def start(self, timeout: float = 300) -> EmbeddedService:
        self.home.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cli", "up", "--bind", f"127.0.0.1:{self.port}"],
                env=clean_env(self.home, **self.settings),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        banner = self.wait_banner(timeout)
        self.key = re.search(r"API key\s+(dq_\S+)", banner).group(1)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_banner(self, timeout: float) -> str:
        """The banner is the last thing `diffq up` prints on its way up; its log file is
        read until it is there (or the process ended)."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log()
            if "diffq is up" in text:
                return text
            if self.process.poll() is not None:
                raise AssertionError(f"diffq up exited {self.process.returncode}:\n{text[-3000:]}")
            time.sleep(0.2)
        raise AssertionError(f"diffq up: no banner after {timeout}s:\n{self.log()[-3000:]}")

    def new_key(self, prefix: str = "e", *, operator: bool = False) -> str:
        """A key of a new tenant, written in the service's own SQLite database (an
        operator's with `operator`)."""
        from app.db.session import Database
        from app.keys import create_key, get_or_create_tenant

        database = Database(f"sqlite:///{self.data / 'diffq.sqlite3'}")
        try:
            with database.session() as session:
                tenant = get_or_create_tenant(session, f"{prefix}-{uuid.uuid4().hex[:12]}")
                return create_key(session, tenant, "test", operator=operator)
        finally:
            database.dispose()

    def stop(self, timeout: float = 60) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                return self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
                raise
        return self.process.returncode
