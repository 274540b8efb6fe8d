"""A private RabbitMQ node on its own ports, to stop, kill and restart in fault tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

from testbed.ports import free_port
from testbed.rabbit_boot import BootWatch

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
HOST = "127.0.0.1"


def _tool(name: str) -> str:
    path = RABBIT_BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} not found: install rabbitmq-server (scripts/services does)")
    return found


class PrivateRabbitMQ(BootWatch):
    """`consumer_timeout_ms`: rabbitmq.conf's `consumer_timeout` (a channel holding a
    delivery unacked that long is closed, PRECONDITION_FAILED, and the message requeued;
    None: the broker's 30 min). `channel_tick_ms`: how often each channel checks it (the
    rabbit app's `channel_tick_interval`, only settable in advanced.config; 60 s by
    default, so a timeout of a few seconds would otherwise fire up to a minute late)."""

    def __init__(
        self,
        workdir: Path,
        *,
        management: bool = False,
        consumer_timeout_ms: int | None = None,
        channel_tick_ms: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.node = f"diffqf{uuid.uuid4().hex[:6]}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.name = self.node
        self.pid_file = workdir / "rabbit.pid"
        workdir.mkdir(parents=True, exist_ok=True)
        config = f"listeners.tcp.default = 127.0.0.1:{self.port}\nloopback_users.guest = true\n"
        self.management_port = free_port() if management else None
        if management:
            (workdir / "enabled_plugins").write_text("[rabbitmq_management].\n")
            config += f"management.tcp.port = {self.management_port}\n"
            config += "management.tcp.ip = 127.0.0.1\n"
            self.management_url = f"http://guest:guest@127.0.0.1:{self.management_port}/api/"
        else:
            (workdir / "enabled_plugins").write_text("[].\n")
        if consumer_timeout_ms is not None:
            config += f"consumer_timeout = {int(consumer_timeout_ms)}\n"
        (workdir / "rabbitmq.conf").write_text(config)
        self.env = {
            **os.environ,
            "HOME": os.environ.get("HOME", "/root"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(workdir / "log"),
            "RABBITMQ_PID_FILE": str(self.pid_file),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq"),
        }
        if channel_tick_ms is not None:
            advanced = workdir / "advanced.config"
            advanced.write_text(
                f"[{{rabbit, [{{channel_tick_interval, {int(channel_tick_ms)}}}]}}].\n"
            )
            self.env["RABBITMQ_ADVANCED_CONFIG_FILE"] = str(advanced)

    def _ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [_tool("rabbitmqctl"), "-n", self.node, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, timeout: float = 60.0) -> float:
        """Start (or restart) the node; returns the seconds until it serves. `timeout`
        bounds a boot that has stopped moving, not a slow one (testbed/rabbit_boot.py)."""
        started = time.monotonic()
        self.pid_file.unlink(missing_ok=True)  # a killed VM's: the boot writes its own
        subprocess.run(
            [_tool("rabbitmq-server"), "-detached"],
            env=self.env,
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_serving(timeout)
        return time.monotonic() - started

    @property
    def ports(self) -> tuple[tuple[str, int], ...]:
        management = ((HOST, self.management_port),) if self.management_port else ()
        return ((HOST, self.port), *management)

    def serving(self) -> bool:
        """Whether the broker runs. A generous bound on the CLI itself: its VM alone may
        take seconds on loaded cores, and a slow answer is not a node that does not serve
        (it is asked again)."""
        try:
            return self._ctl("await_startup", "--timeout", "2", timeout=45).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def stop(self) -> None:
        """A clean stop (what a restart for maintenance does)."""
        self._ctl("stop")
        self._wait_gone()

    def kill(self) -> None:
        """SIGKILL the node: a crash."""
        pid = self.pid()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._wait_gone()

    def _wait_gone(self, timeout: float = 30.0) -> None:
        pid = self.pid()
        deadline = time.monotonic() + timeout
        while pid and Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def app_env(self, key: str) -> str:
        """The rabbit application's setting `key` as the running node has it (what
        rabbitmq.conf and advanced.config gave it): `{ok,2000}`, or `undefined`."""
        answer = self._ctl("eval", f"application:get_env(rabbit, {key}).")
        answer.check_returncode()
        return answer.stdout.strip()

    def create_vhost(self, name: str) -> str:
        self._ctl("add_vhost", name).check_returncode()
        self._ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*").check_returncode()
        return f"amqp://guest:guest@127.0.0.1:{self.port}/{name}"

    def close(self) -> None:
        self.stop()
        if self.pid() and Path(f"/proc/{self.pid()}").exists():
            self.kill()
