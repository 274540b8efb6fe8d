"""What each role opens to the network, as deployed: the object store's S3 port only,
with credentials; the API's metrics on their own port, open to monitoring only; Flower's
every page behind its credentials and never framed; the database aggregates of a
scrape reused."""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from testbed.ports import free_port, wait_for_port
from testbed.processes import ManagedProcess
from testbed.seaweed import weed_binary, weed_ports
from testbed.waiting import wait_until

from .conftest import new_key, submit

pytestmark = pytest.mark.services

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
POLICIES = {
    doc["metadata"]["name"]: doc["spec"]
    for doc in yaml.safe_load_all((DEPLOY / "k8s" / "base" / "network.yaml").read_text())
    if doc and doc.get("kind") == "NetworkPolicy"
}
WEED_PORTS = {"master": 9333, "volume": 8080, "filer": 8888, "s3": 8333}


def _listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            found.append((_address(address, width), int(port, 16)))
    return found


def _address(hexed: str, width: int) -> str:
    raw = bytes.fromhex(hexed)
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def _loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1")


def test_compose_publishes_only_the_s3_port_of_the_object_store_and_keeps_it_apart():
    s3 = COMPOSE["s3"]
    assert s3["ports"] == ["127.0.0.1:8333:8333"]
    assert s3["networks"] == ["objects"]
    # Only the roles that read or write images share its network.
    sharing = {name for name, svc in COMPOSE.items() if "objects" in (svc.get("networks") or [])}
    assert sharing == {"s3", "api", "relay", "webhooks", "worker"}, sharing
    # Every other published port is on the host's loopback; the API's metrics port is not
    # published at all.
    for name, service in COMPOSE.items():
        for published in service.get("ports", []):
            assert published.startswith("127.0.0.1:"), (name, published)
    assert not any("9806" in p for p in COMPOSE["api"]["ports"])


def test_the_object_store_as_compose_runs_it_opens_only_its_s3_port_with_credentials(tmp_path):
    """The compose command itself, its ports moved to free ones: the master, volume and
    filer servers listen on loopback only; the S3 gateway refuses a request unsigned."""
    config = tmp_path / "s3.json"
    config.write_text(
        '{"identities": [{"name": "d", "credentials": [{"accessKey": "ak", "secretKey": "sk"}],'
        ' "actions": ["Admin", "Read", "Write", "List"]}]}'
    )
    # Ports as the suite's own S3 server draws them (testbed/seaweed.py: none of them
    # another's gRPC twin, port + 10000: a clash failed this test once), drawn again if
    # another process takes one before weed binds it.
    for attempt in range(3):
        ports = weed_ports()
        weed = _compose_weed(ports, config, tmp_path / f"try{attempt}")

        def up_or_gone(weed=weed, ports=ports) -> str | None:
            if weed.process.poll() is not None:
                return "exited"
            return "up" if all(_accepts(ports[n]) for n in ("s3", "filer")) else None

        if wait_until(up_or_gone, timeout=60, what="weed's S3 and filer ports") == "up":
            break
        if "address already in use" not in weed.log() or attempt == 2:
            raise AssertionError(f"weed exited: {weed.log()[-2000:]}")
    try:
        time.sleep(1)
        listening = _listening(weed.pid)
        exposed = sorted({port for address, port in listening if not _loopback(address)})
        print(f"\nweed listens on {sorted(listening)}; beyond loopback: {exposed}")
        # The S3 gateway (and its gRPC twin, port + 10000), nothing else.
        assert exposed == sorted({ports["s3"], ports["s3"] + 10000}), listening
        for name in ("master", "volume", "filer"):
            assert (("127.0.0.1", ports[name])) in listening, (name, listening)
        anonymous = requests.get(f"http://127.0.0.1:{ports['s3']}/diffq-images/", timeout=10)
        assert anonymous.status_code == 403
        listing = requests.get(f"http://127.0.0.1:{ports['s3']}/", timeout=10)
        assert listing.status_code == 403
    finally:
        weed.stop()


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _compose_weed(ports: dict[str, int], config, workdir) -> ManagedProcess:
    """The compose file's `s3` command, its ports and paths moved here, started."""
    workdir.mkdir()
    args = []
    for arg in COMPOSE["s3"]["command"]:
        arg = arg.replace("/etc/seaweedfs/s3.json", str(config)).replace("=/data", f"={workdir}")
        for name, port in WEED_PORTS.items():
            arg = re.sub(rf"^-{name}\.port={port}$", f"-{name}.port={ports[name]}", arg)
        args.append(arg)
    assert {f"-{n}.port={p}" for n, p in ports.items()} <= set(args), args
    return ManagedProcess("weed-compose", [weed_binary(), *args], dict(os.environ), workdir).start()


def test_kubernetes_opens_the_api_port_to_all_and_its_metrics_to_monitoring_only():
    public = POLICIES["diffq-api-ingress"]
    assert [p["port"] for rule in public["ingress"] for p in rule["ports"]] == [8000]
    metrics = POLICIES["diffq-metrics-ingress"]
    assert "diffq-api" in metrics["podSelector"]["matchExpressions"][0]["values"]
    [rule] = metrics["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert 9806 in [p["port"] for p in rule["ports"]]
    store = POLICIES["diffq-object-store"]
    assert store["podSelector"] == {"matchLabels": {"diffq.io/object-store": "true"}}
    [rule] = store["ingress"]
    assert sorted(p["port"] for p in rule["ports"]) == [8333, 9000]
    [peer] = rule["from"]
    allowed = set(peer["podSelector"]["matchExpressions"][0]["values"])
    assert allowed == {"diffq-api", "diffq-relay", "diffq-webhooks", "diffq-worker"}
    api = yaml.safe_load((DEPLOY / "k8s" / "base" / "api.yaml").read_text().split("\n---")[0])
    template = api["spec"]["template"]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == "9806"
    assert "--metrics-port" in template["spec"]["containers"][0]["command"]


def test_prometheus_scrapes_the_api_on_its_metrics_port():
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    [api] = [job for job in config["scrape_configs"] if job["job_name"] == "diffq-api"]
    assert api["static_configs"][0]["targets"] == ["api:9806"]


def test_the_database_aggregates_of_a_scrape_are_reused_for_their_ttl(stack, db, guarded_app):
    from app.gauges.readings import ServiceCollector

    now = [1000.0]
    collector = ServiceCollector(db, ["gpu.tiny-b"], None, cache_ttl=5.0, clock=lambda: now[0])

    def queued() -> float:
        for family in collector.collect():
            for sample in family.samples:
                if (
                    sample.name == "diffq_queue_depth"
                    and sample.labels.get("queue") == "gpu.tiny-b"
                ):
                    return sample.value
        return 0.0

    before = queued()
    client = guarded_app.test_client()
    key = new_key(db, "scrape")
    job = submit(client, key)
    assert queued() == before  # within the TTL: the same readings, no query
    now[0] += 5.1
    assert queued() == before + 1
    client.post(f"/v1/jobs/{job['id']}/cancel", headers={"Authorization": f"Bearer {key}"})


@pytest.fixture(scope="module")
def flower(stack, tmp_path_factory):
    port = free_port()
    env = {**stack.env, "DIFFQ_FLOWER_AUTH": "ops:correct-horse"}
    process = ManagedProcess(
        "flower-security",
        [sys.executable, "-m", "cli", "flower", "--bind", f"127.0.0.1:{port}"],
        env,
        tmp_path_factory.mktemp("flower"),
    ).start()
    try:
        wait_for_port(port, timeout=60)
    except TimeoutError:
        process.stop()
        pytest.fail(f"flower did not start:\n{process.log()[-3000:]}")
    yield f"http://127.0.0.1:{port}"
    process.stop()


@pytest.mark.parametrize("path", ["/metrics", "/healthcheck", "/", "/api/workers", "/broker"])
def test_every_flower_page_needs_its_credentials_and_none_can_be_framed(flower, path):
    anonymous = requests.get(f"{flower}{path}", timeout=10, allow_redirects=False)
    assert anonymous.status_code == 401, (path, anonymous.status_code)
    wrong = requests.get(f"{flower}{path}", auth=("ops", "nope"), timeout=10)
    assert wrong.status_code == 401
    if path in ("/metrics", "/healthcheck", "/"):
        good = wait_until(
            lambda: (
                (
                    r := requests.get(f"{flower}{path}", auth=("ops", "correct-horse"), timeout=30)
                ).status_code
                == 200
                and r
            ),
            timeout=30,
            interval=0.5,
        )
        for answer in (anonymous, good):
            assert answer.headers["X-Frame-Options"] == "DENY"
            assert "frame-ancestors 'none'" in answer.headers["Content-Security-Policy"]
