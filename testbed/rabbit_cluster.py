"""A private 3-node RabbitMQ cluster, each node a machine of its own on a simulated LAN
(testbed/lan.py), for quorum-queue scenarios: a node killed, a node cut off, the majority
losing a node.

Each node runs in its network namespace with its own address, epmd and Erlang
distribution, named `rabbit@<address>` (long names: no host names to resolve). Partition
handling is `pause_minority`, what RabbitMQ recommends for a cluster that must not split:
a node that sees only a minority stops serving (closing its clients' connections, so they
fail over) and comes back by itself when the partition heals. `net_ticktime` is short
here (10 s; production keeps Erlang's 60 s) so that nodes notice a silent peer within
the suite's time.

The host's /etc/rabbitmq/rabbitmq-env.conf pins epmd and the distribution to loopback;
the nodes read an empty one of their own instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from testbed.lan import Lan, Machine
from testbed.private_rabbit import _tool
from testbed.rabbit_boot import STALL_FACTOR, BootWatch

PORT = 5672
NET_TICKTIME = 10


class Node(BootWatch):
    def __init__(self, cluster: RabbitCluster, machine: Machine, workdir: Path) -> None:
        self.machine = machine
        self.name = f"rabbit@{machine.address}"
        self.workdir = workdir
        self.pid_file = workdir / "rabbit.pid"
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "enabled_plugins").write_text("[].\n")
        (workdir / "rabbitmq-env.conf").write_text("")
        (workdir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {PORT}\n"
            "loopback_users = none\n"  # clients connect over the LAN
            "cluster_partition_handling = pause_minority\n"
        )
        (workdir / "advanced.config").write_text(
            f"[{{kernel, [{{net_ticktime, {cluster.net_ticktime}}}]}}].\n"
        )
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        self.env = {
            **base,
            "HOME": str(cluster.home),  # the cluster's own Erlang cookie
            "RABBITMQ_CONF_ENV_FILE": str(workdir / "rabbitmq-env.conf"),
            "ERL_EPMD_ADDRESS": machine.address,
            "RABBITMQ_USE_LONGNAME": "true",
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_PORT": str(PORT),
            "RABBITMQ_MNESIA_BASE": str(workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(workdir / "log"),
            "RABBITMQ_PID_FILE": str(self.pid_file),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(workdir / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(workdir / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(workdir / "advanced.config"),
        }
        self.url = f"amqp://guest:guest@{machine.address}:{PORT}//"
        self.ports = ((machine.address, PORT),)

    def ctl(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """rabbitmqctl against this node, from inside its machine (reachable when cut off)."""
        command = self.machine.command([_tool("rabbitmqctl"), "-l", "-n", self.name, *args])
        try:
            return subprocess.run(
                command, env=self.env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(command, 124, "", "timed out")

    def start(self, timeout: float = 90) -> float:
        """Start (or restart) the node; returns the seconds until it serves. `timeout`
        bounds a boot that has stopped moving, not a slow one (`wait_serving`)."""
        started = time.monotonic()
        self.pid_file.unlink(missing_ok=True)  # a killed VM's: the boot writes its own
        subprocess.run(
            self.machine.command([_tool("rabbitmq-server"), "-detached"]),
            env=self.env,
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_serving(timeout)
        return time.monotonic() - started

    def serving(self) -> bool:
        """Whether the node's broker runs (a paused minority node's does not)."""
        # The CLI's own bound is generous: on loaded cores its VM alone may take many
        # seconds to start, and a slow answer is not a node that does not serve.
        return self.ctl("await_startup", "--timeout", "2", timeout=45).returncode == 0

    def kill(self) -> None:
        """SIGKILL the node's VM: a crash, its disk as it was."""
        pid = self.pid()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)


def _leader_in(listing: str, queue: str) -> str | None:
    """The leader `rabbitmqctl list_queues name leader --quiet` names for `queue`."""
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == queue and parts[1].startswith("rabbit@"):
            return parts[1]
    return None


class RabbitCluster:
    """`with RabbitCluster(workdir) as cluster:` three clustered nodes on their own LAN;
    `cluster.url` lists them all for kombu, which fails over between them."""

    def __init__(self, workdir: Path, size: int = 3, net_ticktime: int = NET_TICKTIME) -> None:
        self.workdir = workdir
        self.size = size
        self.net_ticktime = net_ticktime
        self.home = workdir / "home"
        self.lan = Lan()
        self.nodes: list[Node] = []

    def create(self, timeout: float = 240) -> RabbitCluster:
        self.home.mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(os.urandom(16).hex().upper())
        cookie.chmod(0o400)
        try:
            self.lan.create()
            for i in range(self.size):
                machine = self.lan.add(f"r{i + 1}")
                self.nodes.append(Node(self, machine, self.workdir / f"r{i + 1}"))
            errors: list[BaseException] = []

            def boot(node: Node) -> None:
                try:
                    node.start(timeout)
                except BaseException as exc:  # noqa: BLE001 - re-raised below
                    errors.append(exc)

            threads = [threading.Thread(target=boot, args=(n,)) for n in self.nodes]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]
            first = self.nodes[0]
            for node in self.nodes[1:]:
                for step in (("stop_app",), ("join_cluster", first.name), ("start_app",)):
                    done = node.ctl(*step, timeout=60)
                    if done.returncode != 0:
                        raise RuntimeError(f"{node.name} {step[0]}: {done.stderr.strip()}")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for node in self.nodes:
            node.kill()
        self.nodes.clear()
        self.lan.close()  # ends what is left in the namespaces (each node's epmd)

    def __enter__(self) -> RabbitCluster:
        return self.create()

    def __exit__(self, *_exc) -> None:
        self.close()

    @property
    def url(self) -> str:
        return ";".join(node.url for node in self.nodes)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def serving_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.serving()]

    def leader(self, queue: str, other_than: Node | None = None, timeout: float = 60) -> Node:
        """The node leading `queue`'s quorum (`other_than` a node just killed or cut off:
        until its followers have elected another).

        Asked of the first node that answers: any serving node lists the whole cluster's
        queues, so one answer is enough, and each rabbitmqctl call starts an Erlang VM.
        Fails when answers name no leader for `timeout` seconds, not when the CLI is slow
        to answer: on two loaded cores one call took longer than its 15 s bound, three
        unanswered asks were not a "no leader", and a healthy cluster once failed a
        scenario that way. At most `STALL_FACTOR` x `timeout` in all."""
        begun = time.monotonic()
        leaderless_since: float | None = None
        answers: dict[str, str] = {}
        while True:
            for asked in self.nodes:
                listing = asked.ctl("list_queues", "name", "leader", "--quiet", timeout=60)
                answers[asked.name] = (
                    f"rc {listing.returncode}: {(listing.stdout + listing.stderr).strip()[-300:]}"
                )
                if listing.returncode != 0:
                    continue  # down, paused or slow: ask another
                found = _leader_in(listing.stdout, queue)
                if found is not None and (other_than is None or found != other_than.name):
                    return self.node(found)
                if leaderless_since is None:
                    leaderless_since = time.monotonic()
                break
            now = time.monotonic()
            stalled = leaderless_since is not None and now - leaderless_since > timeout
            if stalled or now - begun > STALL_FACTOR * timeout:
                shown = "\n".join(f"  {name}: {answer}" for name, answer in answers.items())
                besides = f" besides {other_than.name}" if other_than else ""
                raise TimeoutError(
                    f"no node{besides} leads {queue} after {now - begun:.0f} s; "
                    f"the last answers:\n{shown}"
                )
            time.sleep(1)

    def isolate(self, node: Node) -> None:
        self.lan.isolate(node.machine)

    def rejoin(self, node: Node) -> None:
        self.lan.rejoin(node.machine)

    def wait_whole(self, timeout: float = 120) -> float:
        """Until every node serves and sees every other running; returns the seconds."""
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            if self.whole():
                return time.monotonic() - started
            time.sleep(1)
        raise TimeoutError(f"the cluster did not come back whole:\n{self.state()}")

    def whole(self) -> bool:
        if not all(n.serving() for n in self.nodes):
            return False
        status = self.nodes[0].ctl("cluster_status", "--formatter", "json", timeout=45)
        with contextlib.suppress(ValueError):
            shown = json.loads(status.stdout) if status.returncode == 0 else {}
            return len(shown.get("running_nodes", [])) == self.size and not shown.get("partitions")
        return False

    def recover(self, timeout: float = 60) -> tuple[float, list[str]]:
        """Until the cluster is whole, as an operator gets it there: wait `timeout`, then
        restart (kill -9 and start) each node that still does not serve. RabbitMQ 3.10 on
        Erlang 25 sometimes leaves a node that pause_minority paused hanging in its
        recovery boot after the partition heals (its log stops after "Faking
        nodedown/nodeup"); a restart is the documented way out. Returns the seconds and
        the nodes restarted."""
        started = time.monotonic()
        with contextlib.suppress(TimeoutError):
            self.wait_whole(timeout)
            return time.monotonic() - started, []
        stuck = [n for n in self.nodes if not n.serving()]
        for node in stuck:
            node.kill()
            node.start()
        self.wait_whole(120)
        return time.monotonic() - started, [n.name for n in stuck]

    def state(self) -> str:
        """Each node's view of the cluster, for a failure's message."""
        views = []
        for node in self.nodes:
            shown = node.ctl("cluster_status", "--formatter", "json", timeout=45)
            views.append(f"{node.name} serving={node.serving()}: {shown.stdout.strip()[:600]}")
        return "\n".join(views)
