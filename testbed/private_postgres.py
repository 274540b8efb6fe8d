"""A private PostgreSQL cluster on its own port, to restart in fault tests."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg2

from testbed.ports import free_port


def _bin(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise RuntimeError(f"{name} not found: install postgresql (scripts/services does)")
    return found


class PrivatePostgres:
    """initdb + pg_ctl in a folder of its own; trust auth on 127.0.0.1 only."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        """`settings`: server settings (`-c name=value`) beyond the defaults below."""
        self.settings = {"max_connections": "200", **(settings or {})}
        # Not under pytest's 0700 temp root: when we are root the server runs as postgres.
        self.root = Path(tempfile.mkdtemp(prefix="diffq-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        command = list(args)
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True)

    def init(self) -> PrivatePostgres:
        self._run(
            _bin("initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        return self

    def start(self) -> float:
        started = time.monotonic()
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root}"
            + "".join(f" -c {name}={value}" for name, value in self.settings.items())
        )
        self._run(
            _bin("pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        return time.monotonic() - started

    def stop(self, mode: str = "fast") -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> float:
        self.stop(mode)
        return self.start()

    def create_database(self, name: str) -> str:
        conn = psycopg2.connect(self.admin_url)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
