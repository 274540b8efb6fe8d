"""A simulated second machine: a network namespace with its own address and a veth link to
this host, on which `tc` cuts traffic to one service (by port) or all of it, or adds
latency, jitter and loss.

The host end of the link gets `HOST/30`, the namespace end `PEER/30`, from 10.213.0.0/16.
Services on loopback are reached from the namespace through forwarders on the host end
(`forward`), as a NIC would carry them: each service has its own port on `host_address`,
which is what a partition matches.

Both ends of the link carry the same queueing: an `htb` qdisc whose default class 1:10
passes everything, and a class 1:30 whose FIFO holds nothing (it drops every packet), to
which u32 filters send what is cut: packets to a forwarder's port on the namespace's side
and packets from it on the host's side (a partition from one service), every packet (from
all), or a share of TCP segments (loss). Nothing here uses iptables, nft or `netem`
(kernels without the `netem` module are common in containers); latency and jitter are
added by the forwarders.

Needs root and `ip netns`; `available()` says whether this machine has both.
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import os
import random
import secrets
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from testbed.processes import ManagedProcess

SUBNET = ipaddress.ip_network("10.213.0.0/16")
PARTITION_PRIO = "1"
LOSS_PRIO = "2"
# The low byte of a TCP segment's TSval: 20 bytes of IP header, then TCP's 20 and its
# options as Linux writes them (NOP, NOP, kind 8, length 10, TSval, TSecr).
TSVAL_LOW_BYTE = 20 + 20 + 4 + 3


def available() -> str | None:
    """None where namespaces can be made here; otherwise why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` (iproute2) is not installed"
    probe = f"dqprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done


def _used_networks() -> set[ipaddress.IPv4Network]:
    listing = _run("ip", "-o", "-4", "addr", "show").stdout
    used = set()
    for line in listing.splitlines():
        parts = line.split()
        if "inet" in parts:
            used.add(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    return used


def _free_subnet() -> ipaddress.IPv4Network:
    used = _used_networks()
    for _ in range(200):
        candidate = ipaddress.ip_network(
            f"10.213.{random.randrange(256)}.{4 * random.randrange(64)}/30"
        )
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise RuntimeError("no free /30 in 10.213.0.0/16")


class NetNS:
    """`with NetNS() as ns:` a namespace linked to the host; everything removed on exit."""

    def __init__(self, prefix: str = "dq") -> None:
        tag = secrets.token_hex(3)
        self.name = f"{prefix}-{tag}"
        self.host_dev = f"{prefix}h{tag}"  # interface names: at most 15 characters
        self.peer_dev = f"{prefix}n{tag}"
        subnet = _free_subnet()
        hosts = list(subnet.hosts())
        self.host_address = str(hosts[0])
        self.address = str(hosts[1])
        self.prefixlen = subnet.prefixlen
        self.forwarders: list[Forwarder] = []
        self.partitioned: set[int | None] = set()  # ports cut; None: the whole link
        self.impairment = ""
        self._made = False

    # --- lifecycle -----------------------------------------------------------------
    def create(self) -> NetNS:
        try:
            self._made = True
            _run("ip", "netns", "add", self.name)
            _run("ip", "link", "add", self.host_dev, "type", "veth", "peer", "name", self.peer_dev)
            _run("ip", "link", "set", self.peer_dev, "netns", self.name)
            _run("ip", "addr", "add", f"{self.host_address}/{self.prefixlen}", "dev", self.host_dev)
            _run("ip", "link", "set", self.host_dev, "up")
            self.exec_ip("addr", "add", f"{self.address}/{self.prefixlen}", "dev", self.peer_dev)
            self.exec_ip("link", "set", self.peer_dev, "up")
            self.exec_ip("link", "set", "lo", "up")
            for side in ("host", "peer"):
                self._tc(side, "qdisc", "add", "root", "handle", "1:", "htb", "default", "10")
                for band in ("1:10", "1:30"):
                    self._tc(side, "class", "add", "parent", "1:", "classid", band, "htb",
                             "rate", "10gbit", "quantum", "60000")  # fmt: skip
                # The drop band: a FIFO that holds nothing.
                self._tc(side, "qdisc", "add", "parent", "1:30", "handle", "30:", "pfifo",
                         "limit", "0")  # fmt: skip
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for forwarder in self.forwarders:
            with contextlib.suppress(Exception):
                forwarder.stop()
        self.forwarders.clear()
        if not self._made:
            return
        # Deleting the namespace deletes its end of the veth, and with it the host's end.
        _run("ip", "netns", "del", self.name, check=False)
        if Path(f"/sys/class/net/{self.host_dev}").exists():
            _run("ip", "link", "del", self.host_dev, check=False)
        self._made = False

    def __enter__(self) -> NetNS:
        return self.create()

    def __exit__(self, *_exc) -> None:
        self.close()

    # --- reaching loopback services ------------------------------------------------
    def forward(self, port: int) -> int:
        """A forwarder on the host end of the link to 127.0.0.1:`port`; returns its port,
        the one the namespace connects to (and the one `partition` matches)."""
        forwarder = Forwarder(self.host_address, port).start()
        self.forwarders.append(forwarder)
        return forwarder.port

    # --- running things inside -----------------------------------------------------
    def command(self, args: list[str]) -> list[str]:
        """`args` run inside the namespace. `ip netns exec` execs in place: the pid is the
        command's own, so ManagedProcess signals (and kills the group of) the right one."""
        return ["ip", "netns", "exec", self.name, *args]

    def process(self, name: str, args: list[str], env: dict[str, str], log_dir: Path):
        return ManagedProcess(name, self.command(args), env, log_dir)

    def holds(self, pid: int) -> bool:
        """Whether process `pid` lives in this namespace."""
        try:
            mine = os.stat(f"/run/netns/{self.name}").st_ino
            return os.stat(f"/proc/{pid}/ns/net").st_ino == mine
        except OSError:
            return False

    def exec_ip(self, *args: str) -> subprocess.CompletedProcess:
        return _run("ip", "-n", self.name, *args)

    def _tc(self, side: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """`tc OBJECT VERB dev DEV REST…` on one end of the link ("host" or "peer")."""
        dev = self.host_dev if side == "host" else self.peer_dev
        where = [] if side == "host" else ["-n", self.name]
        return _run("tc", *where, args[0], args[1], "dev", dev, *args[2:], check=check)

    # --- faults ---------------------------------------------------------------------
    def partition(self, port: int | None = None) -> None:
        """Drop every packet to and from `port` on the host end (a forwarder's port), or
        every packet on the link when `port` is None. Connections are not reset: each side
        sees silence, as in a real partition, until its timeouts notice."""
        if port is None:
            peer_match = host_match = ["match", "u32", "0", "0"]
        else:
            peer_match = ["match", "ip", "dport", str(port), "0xffff"]
            host_match = ["match", "ip", "sport", str(port), "0xffff"]
        for side, match in (("peer", peer_match), ("host", host_match)):
            self._drop(side, PARTITION_PRIO, match)
        self.partitioned.add(port)

    def heal(self) -> None:
        """Remove every partition (latency and loss, if any, stay)."""
        for side in ("peer", "host"):
            self._tc(side, "filter", "del", "parent", "1:", "prio", PARTITION_PRIO, check=False)
        self.partitioned.clear()

    def impair(self, delay_ms: float = 0, jitter_ms: float = 0, loss_pct: float = 0) -> None:
        """Latency (± jitter, normal) on what the namespace sends, as `netem delay` on its
        interface would add (the round trip grows by `delay_ms`), and packet loss on the
        link, each way; all zero removes both.

        Loss is real: packets whose TCP timestamp (TSval, a millisecond clock) falls on
        chosen values of its low 6 bits are dropped in the kernel, so TCP retransmits them
        (a retransmission carries a later TSval). `loss_pct` is rounded to a multiple of
        1/64 (5 % -> 3/64, 4.7 %). Latency is added by the forwarders, in order, since this
        kernel has no `netem`."""
        for side in ("peer", "host"):
            self._tc(side, "filter", "del", "parent", "1:", "prio", LOSS_PRIO, check=False)
        values = round(64 * loss_pct / 100)
        for value in range(values):
            spread = value * 64 // max(values, 1)
            match = ["match", "u8", str(spread), "0x3f", "at", str(TSVAL_LOW_BYTE)]
            for side in ("peer", "host"):
                self._drop(side, LOSS_PRIO, match)
        for forwarder in self.forwarders:
            forwarder.delay(delay_ms / 1000, jitter_ms / 1000)
        self.impairment = (
            f"delay {delay_ms:g}±{jitter_ms:g} ms, loss {100 * values / 64:.1f} %"
            if delay_ms or values
            else ""
        )

    def _drop(self, side: str, prio: str, match: list[str]) -> None:
        self._tc(
            side, "filter", "add", "parent", "1:", "protocol", "ip", "prio", prio, "u32",
            *match, "flowid", "1:30",
        )  # fmt: skip

    def dropped(self) -> int:
        """Packets dropped on the link (partitions and loss), both ends together."""
        dropped = 0
        for side in ("peer", "host"):
            dev = self.host_dev if side == "host" else self.peer_dev
            where = [] if side == "host" else ["-n", self.name]
            shown = _run("tc", *where, "-s", "class", "show", "dev", dev, check=False).stdout
            for block in shown.split("class htb ")[1:]:
                if block.startswith("1:30 ") and "dropped " in block:
                    dropped += int(block.split("dropped ", 1)[1].split(",", 1)[0])
        return dropped


class Forwarder:
    """Forwards `listen_host`:(a free port) to 127.0.0.1:`target_port`, each direction of
    each connection in order, every chunk held `delay` ± `jitter` seconds (0 by default)."""

    def __init__(self, listen_host: str, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self._listener = socket.create_server((listen_host, 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.connections = 0
        self._delay = (0.0, 0.0)
        self._stop = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> Forwarder:
        self._thread.start()
        return self

    def delay(self, seconds: float, jitter: float = 0.0) -> None:
        """Hold what the client sends `seconds` ± `jitter` (normal) before passing it on."""
        self._delay = (seconds, jitter)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()
        with self._lock:
            for sock in list(self._open):
                _close(sock)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            self.connections += 1
            with self._lock:
                self._open.update((client, upstream))
            _Pipe(self, client, upstream, delayed=True).start()
            _Pipe(self, upstream, client, delayed=False).start()

    def _forget(self, *socks: socket.socket) -> None:
        with self._lock:
            self._open.difference_update(socks)
        for sock in socks:
            _close(sock)


class _Pipe:
    """One direction of one connection: a reader that stamps each chunk with the moment it
    may leave, and a writer that sends it then."""

    def __init__(
        self, owner: Forwarder, source: socket.socket, sink: socket.socket, delayed: bool
    ) -> None:
        self.owner, self.source, self.sink, self.delayed = owner, source, sink, delayed
        self.chunks: collections.deque[tuple[float, bytes]] = collections.deque()
        self.ready = threading.Condition()
        self.last_due = 0.0

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self.source.recv(65536)
            except OSError:
                data = b""
            delay, jitter = self.owner._delay if self.delayed else (0.0, 0.0)
            due = time.monotonic() + max(0.0, random.gauss(delay, jitter) if jitter else delay)
            self.last_due = due = max(due, self.last_due)  # TCP delivers in order
            with self.ready:
                self.chunks.append((due, data))
                self.ready.notify()
            if not data:
                return

    def _write(self) -> None:
        while True:
            with self.ready:
                while not self.chunks:
                    self.ready.wait()
                due, data = self.chunks.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:  # the source closed: so does this side, and then the rest
                self.owner._forget(self.source, self.sink)
                return
            try:
                self.sink.sendall(data)
            except OSError:
                self.owner._forget(self.source, self.sink)
                return


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
