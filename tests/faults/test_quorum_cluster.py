"""Quorum queues on a 3-node RabbitMQ cluster whose nodes are machines of their own
(testbed/rabbit_cluster.py, on a simulated LAN: testbed/lan.py), under a steady submit
rate: the node leading the GPU queue killed with -9, a minority node cut off, and the
majority side losing a node, which leaves no quorum at all until a node comes back.

The API and the two GPU workers are machines on the same LAN (each a namespace with its
own address); they reach PostgreSQL and S3 on this host through forwarders on the host's
LAN address, and the broker nodes directly, with a broker URL that lists the three (kombu
fails over). The relay and the webhook deliverer run on this host. Every process uses
DIFFQ_QUEUE_TYPE=quorum. The cluster has its own database, so the fault suite's relay
never sees these jobs.

Each scenario prints submitted / succeeded / lost / duplicate results, terminal changes
and webhooks, and asserts none lost and none duplicated. `bench/quorum_cluster.py` runs
them longer.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from urllib.parse import urlsplit

import pytest

from app.jobs.states import JobStatus
from testbed import netns
from testbed.processes import ApiServer, start_worker
from tests.faults.harness import Scenario, SteadyLoad
from tests.faults.linked import _through

pytestmark = [pytest.mark.faults, pytest.mark.services]

WHY_NOT = netns.available()
if WHY_NOT:
    print(f"\nquorum-cluster scenarios skipped: {WHY_NOT}")
    pytest.skip(f"the quorum cluster needs network namespaces: {WHY_NOT}", allow_module_level=True)

QUEUE = "gpu.tiny"
QUEUES = ["gpu.tiny", "gpu.tiny-batch", "webhooks"]
WORKERS = ("qa", "qb")
# Longer than the nodes' net_ticktime (10 s): the cut-off node is seen gone and pauses.
HOLD = float(os.environ.get("DIFFQ_QUORUM_HOLD", "20"))
ROUNDS = int(os.environ.get("DIFFQ_QUORUM_ROUNDS", "1"))
SUBMIT_PERIOD = float(os.environ.get("DIFFQ_QUORUM_SUBMIT_PERIOD", "1.0"))


@dataclasses.dataclass
class Quorum:
    stack: object  # the fault suite's stack, its broker, database and processes replaced
    cluster: object
    forwarders: list

    def start_worker(self, name: str):
        machine = self.cluster.lan.machines.get(name) or self.cluster.lan.add(name)
        worker = start_worker(
            self.stack.env,
            self.stack.logs,
            f"worker-{name}",
            models="tiny,tiny-slow,tiny-batch",
            prefix=machine.command([]),
        )
        self.stack.workers[name] = worker
        return worker

    def ensure_workers(self) -> None:
        for name in WORKERS:
            worker = self.stack.workers.get(name)
            if worker is None or worker.process.poll() is not None:
                self.start_worker(name)


def _forwarded(lan, stack) -> tuple[dict[str, str], list]:
    """The stack's environment for a machine on the LAN: PostgreSQL and S3 through
    forwarders on this host's LAN address, the broker nodes directly."""
    pg = netns.Forwarder(lan.host_address, stack.pg.port).start()
    s3 = netns.Forwarder(lan.host_address, urlsplit(stack.s3.endpoint).port).start()
    env = {
        **stack.env,
        "DIFFQ_DATABASE_URL": _through(stack.env["DIFFQ_DATABASE_URL"], lan.host_address, pg.port),
        "DIFFQ_S3_ENDPOINT_URL": f"http://{lan.host_address}:{s3.port}",
    }
    return env, [pg, s3]


@pytest.fixture(scope="module")
def quorum(fault_stack, tmp_path_factory):
    from app.broker.topology import declare_topology
    from app.db.migrate import upgrade
    from app.db.session import Database
    from testbed.rabbit_cluster import RabbitCluster
    from testbed.services import broker_connection

    fault_stack.stop_workers(list(fault_stack.workers))  # their CPU goes to this cluster's
    workdir = tmp_path_factory.mktemp("quorum")
    started = time.monotonic()
    cluster = RabbitCluster(workdir / "cluster").create()
    formed = time.monotonic() - started
    processes = []
    forwarders: list = []
    db = None
    try:
        with broker_connection(cluster.url) as conn:
            declare_topology(conn, QUEUES, "quorum")
        database_url = fault_stack.pg.create_database(f"quorum_{uuid.uuid4().hex[:8]}")
        upgrade(database_url)
        logs = workdir / "logs"
        logs.mkdir()
        host_env = {
            **fault_stack.env,
            "DIFFQ_DATABASE_URL": database_url,
            "DIFFQ_BROKER_URL": cluster.url,
            "DIFFQ_QUEUE_TYPE": "quorum",
            # A 4 s AMQP heartbeat: a connection to a node that went silent is given up
            # in seconds, and the client fails over to another node.
            "DIFFQ_CELERY_CONFIG": "tests.faults.partition_celeryconfig",
            # A delivery stranded by a leader change (workers/stranded.py) is taken back
            # well within the scenario's settling time.
            "DIFFQ_STRANDED_AFTER": "20",
        }
        db = Database(database_url, pool_size=2)
        stack = dataclasses.replace(
            fault_stack, env=host_env, logs=logs, db=db, relay=None, workers={}, deliverer=None
        )
        stack.start_relay()  # on this host
        stack.start_deliverer()
        processes += [stack.relay, stack.deliverer]
        # The API and the workers are machines on the LAN.
        stack.env, forwarders = _forwarded(cluster.lan, stack)
        api_machine = cluster.lan.add("api")
        stack.api = ApiServer(
            stack.env, logs, name="api-quorum", host=api_machine.address,
            prefix=api_machine.command([]),
        ).start()  # fmt: skip
        processes.append(stack.api)
        quorum = Quorum(stack, cluster, forwarders)
        quorum.ensure_workers()
        print(f"\nquorum cluster formed in {formed:.1f} s; nodes {[n.name for n in cluster.nodes]}")
        yield quorum
        processes += list(quorum.stack.workers.values())
    finally:
        for process in reversed(processes):
            process.stop()
        for forwarder in forwarders:
            forwarder.stop()
        if db is not None:
            db.dispose()
        cluster.close()


@pytest.fixture(autouse=True)
def quiet_queue(quorum) -> None:
    """Overrides the suite's: the cluster whole, this stack's workers up, no job waiting."""
    from sqlalchemy import func, select

    from app.db.models.jobs import Job

    for node in quorum.cluster.nodes:
        quorum.cluster.rejoin(node)
        if node.pid() is None or not os.path.exists(f"/proc/{node.pid()}"):
            node.start()
    quorum.cluster.recover()
    quorum.ensure_workers()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        with quorum.stack.db.session() as session:
            busy = session.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))
            )
        if not busy:
            return
        time.sleep(0.5)
    pytest.fail(f"{busy} jobs still queued or running from an earlier scenario")


def _by_hand(restarted: list[str]) -> str:
    """What the scenario's notes say of nodes restarted to bring the cluster back whole
    (RabbitMQ's own recovery hung: testbed/rabbit_cluster.py `recover`)."""
    return f" ({', '.join(restarted)} hung recovering: restarted)" if restarted else ""


def _until(condition, timeout: float) -> float | None:
    """Polled once a second: a condition asks rabbitmqctl, and each call starts an Erlang
    VM (about a CPU-second), which a tighter loop spends from the machine the rest of the
    suite shares."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(1.0)
    return None


def assert_once(fig) -> None:
    print(fig.notes)
    assert fig.faults >= 1, fig.line()
    assert fig.lost == 0, fig.line()
    assert fig.duplicate_results == 0, fig.line()
    assert fig.duplicate_terminal == 0, fig.line()
    assert fig.duplicate_deliveries == 0 and fig.undelivered == 0, fig.line()
    assert fig.succeeded == fig.submitted - fig.refused, fig.line()
    # A refusal is an honest 503 (nothing stored), never the rule: the outbox carries.
    assert fig.refused <= fig.submitted // 4, fig.line()


def test_q1_the_queue_leader_killed(quorum):
    """kill -9 of the node leading the GPU queue's quorum: a follower is elected, the
    clients connected to the dead node fail over, and what it held is on the others."""
    cluster = quorum.cluster
    sc = Scenario("Q1 quorum leader kill -9", quorum.stack, quorum.stack.new_key())
    notes = []
    with SteadyLoad(sc, SUBMIT_PERIOD, prompt="Q1", steps=16):
        for _ in range(ROUNDS):
            time.sleep(4)  # work in every state: ready, unacked, running
            victim = cluster.leader(QUEUE)
            victim.kill()
            sc.figures.faults += 1
            killed_at = time.monotonic()
            new = cluster.leader(QUEUE, other_than=victim)
            elected = time.monotonic() - killed_at
            time.sleep(HOLD / 2)
            victim.start()
            # One fault at a time: the node has rejoined before the next leader goes.
            whole, restarted = cluster.recover()
            notes.append(
                f"{victim.name} killed, {new.name} leads after {elected:.1f} s, "
                f"whole {whole:.1f} s after the restart{_by_hand(restarted)}"
            )
            sc.figures.recovery_seconds.append(elected)
    rows = sc.settle(240)
    fig = sc.report(rows)
    fig.notes = "; ".join(notes)
    assert_once(fig)


def test_q2_a_minority_node_cut_off(quorum):
    """The leader cut from the other nodes and from every client for longer than the
    nodes' tick time: it pauses (pause_minority) and drops its clients, the majority
    elects a leader and serves, and the node rejoins by itself when the cut heals."""
    cluster = quorum.cluster
    sc = Scenario(f"Q2 minority node cut off {HOLD:g} s", quorum.stack, quorum.stack.new_key())
    notes = []
    with SteadyLoad(sc, SUBMIT_PERIOD, prompt="Q2", steps=16):
        for _ in range(ROUNDS):
            time.sleep(4)
            victim = cluster.leader(QUEUE)
            cluster.isolate(victim)
            sc.figures.faults += 1
            paused = _until(lambda v=victim: not v.serving(), HOLD + 30)
            assert paused is not None, "the cut-off node never paused"
            cluster.leader(QUEUE, other_than=victim)
            time.sleep(max(0.0, HOLD - paused))
            cluster.rejoin(victim)
            whole, restarted = cluster.recover()
            notes.append(
                f"{victim.name} paused {paused:.1f} s into the cut, whole {whole:.1f} s "
                f"after the heal{_by_hand(restarted)}"
            )
            sc.figures.recovery_seconds.append(whole)
    rows = sc.settle(240)
    fig = sc.report(rows)
    fig.notes = "; ".join(notes)
    assert_once(fig)


def test_q3_the_majority_side_loses_a_node(quorum):
    """One node cut off, then one of the two left killed: no side has a majority, every
    node stops serving, and no publish can be confirmed. The API goes on accepting
    (a job is durable in PostgreSQL; the relay publishes it later). The killed node is
    started again, then the cut heals: every job ends once."""
    cluster = quorum.cluster
    sc = Scenario(f"Q3 majority loses a node {HOLD:g} s", quorum.stack, quorum.stack.new_key())
    with SteadyLoad(sc, SUBMIT_PERIOD, prompt="Q3", steps=16):
        time.sleep(4)
        leader = cluster.leader(QUEUE)
        cut, killed = next(n for n in cluster.nodes if n is not leader), leader
        cluster.isolate(cut)
        assert _until(lambda: not cut.serving(), HOLD + 30) is not None
        killed.kill()
        sc.figures.faults += 2
        down_from = time.monotonic()
        assert _until(lambda: not cluster.serving_nodes(), 60) is not None, "a node still serves"
        submitted_before = sc.figures.submitted
        time.sleep(HOLD)
        during = sc.figures.submitted - submitted_before
        killed.start(timeout=120)  # with the third node: a majority again
        cluster.rejoin(cut)
        whole, restarted = cluster.recover()
        outage = time.monotonic() - down_from
        sc.figures.recovery_seconds.append(whole)
    rows = sc.settle(240)
    fig = sc.report(rows)
    fig.notes = (
        f"no quorum for {outage:.0f} s; {during} submits meanwhile; "
        f"{cut.name} cut, {killed.name} killed; whole {whole:.1f} s after the restart"
        f"{_by_hand(restarted)}"
    )
    assert_once(fig)
    assert during >= 1
