"""Partitions between an API process and the services it writes to, simulated: a second API
process in a network namespace of its own (testbed/netns.py) reaches the broker and
PostgreSQL over a veth link, cut from one of them under a steady submit rate; the relay,
the workers and the webhook deliverer stay on the host.

- N5, cut from the broker: a submit is durable once PostgreSQL has it, so the API goes on
  answering 202; the publishes that time out are the relay's, and the messages the link
  held and delivered late are duplicates the workers' claim turns away.
- N6, cut from PostgreSQL: nothing can be made durable, so the API answers 503 (or, for a
  request caught mid-statement, answers late); nothing is half-stored. A client retries
  with its Idempotency-Key once the link is back and gets exactly one job per key.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest
import requests
from sqlalchemy import func, select

from app.jobs.states import JobStatus
from testbed import netns
from testbed.jobs import auth
from testbed.processes import ApiServer
from tests.faults.harness import Scenario, SteadyLoad
from tests.faults.linked import linked_env

pytestmark = [pytest.mark.faults, pytest.mark.services]

WHY_NOT = netns.available()
if WHY_NOT:
    print(f"\nAPI partition scenarios skipped: {WHY_NOT}")
    pytest.skip(
        f"API partition scenarios need network namespaces: {WHY_NOT}", allow_module_level=True
    )

HOLD = 12.0  # seconds cut: over two AMQP heartbeats (4 s) and the PostgreSQL timeouts


@dataclass
class RemoteApi:
    ns: netns.NetNS
    api: ApiServer
    ports: dict[str, int]


@pytest.fixture(scope="module")
def remote_api(fault_stack):
    ns = netns.NetNS().create()
    try:
        env, ports = linked_env(fault_stack, ns)
        env["DIFFQ_METRICS_DIR"] = str(fault_stack.logs.parent / "metrics-api-n")
        api = ApiServer(
            env, fault_stack.logs, name="api-n", host=ns.address, prefix=ns.command([])
        ).start(timeout=60)
    except BaseException:
        ns.close()
        raise
    try:
        assert ns.holds(api.pid)
        yield RemoteApi(ns, api, ports)
    finally:
        api.stop()
        ns.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def assert_once(fig) -> None:
    assert fig.lost == 0, fig.line()
    assert fig.duplicate_results == 0, fig.line()
    assert fig.duplicate_terminal == 0, fig.line()
    assert fig.duplicate_deliveries == 0 and fig.undelivered == 0, fig.line()
    assert fig.succeeded == fig.submitted - fig.refused, fig.line()


def test_n5_api_cut_from_the_broker_keeps_accepting(fault_stack, remote_api):
    sc = Scenario(
        f"N5 API cut from broker {HOLD:g} s",
        fault_stack,
        fault_stack.new_key(),
        api_url=remote_api.api.url,
    )
    with SteadyLoad(sc, 0.5, prompt="N5", steps=8) as load:
        time.sleep(3)  # publishing normally first: the pooled connection is open
        before = len(load.latencies)
        remote_api.ns.partition(remote_api.ports["broker"])
        sc.figures.faults += 1
        time.sleep(HOLD)
        remote_api.ns.heal()
        during = load.latencies[before:]
        time.sleep(3)
    rows = sc.settle(240)
    fig = sc.report(rows)
    dropped = remote_api.ns.dropped()
    fig.notes = (
        f"{len(during)} submits during the cut: p50 {_percentile(during, 0.5):.2f} s, "
        f"max {max(during):.2f} s; {dropped} packets dropped"
    )
    print(fig.notes)
    assert dropped > 0, fig.line()
    # Durable in PostgreSQL is accepted: the broker's absence refuses nothing.
    assert fig.refused == 0, fig.line()
    # A publish waits for its confirm at most twice its 2 s timeout, then the relay has it.
    assert max(during) < 10, fig.notes
    assert_once(fig)


@dataclass
class Attempts:
    """Submits with an Idempotency-Key each, and what each was answered."""

    answers: dict[str, list[int | None]] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _submit(api_url: str, key: str, idem: str, attempts: Attempts, webhook: str) -> str | None:
    started = time.monotonic()
    try:
        answer = requests.post(
            f"{api_url}/v1/jobs",
            json={"prompt": f"N6 {idem}", "steps": 8, "webhook": webhook},
            headers={**auth(key), "Idempotency-Key": idem},
            timeout=60,
        )
        code = answer.status_code
    except requests.RequestException:
        answer, code = None, None
    with attempts.lock:
        attempts.answers.setdefault(idem, []).append(code)
        attempts.latencies.append(time.monotonic() - started)
    return answer.json()["id"] if code in (200, 201, 202) else None


def test_n6_api_cut_from_postgres_stores_nothing_by_half(fault_stack, remote_api):
    from app.db.models.jobs import Job

    key = fault_stack.new_key()
    sc = Scenario(
        f"N6 API cut from PostgreSQL {HOLD:g} s",
        fault_stack,
        key,
        api_url=remote_api.api.url,
    )
    attempts = Attempts()
    hook = f"{fault_stack.receiver.url}/jobs"
    stop = threading.Event()
    idems: list[str] = []

    def steady() -> None:
        threads = []
        while not stop.is_set():
            idem = f"n6-{uuid.uuid4().hex[:12]}"
            idems.append(idem)
            thread = threading.Thread(
                target=_submit, args=(remote_api.api.url, key, idem, attempts, hook)
            )
            thread.start()  # one client each: a hung request does not hold the next
            threads.append(thread)
            stop.wait(0.5)
        for thread in threads:
            thread.join()

    runner = threading.Thread(target=steady)
    runner.start()
    time.sleep(3)
    cut_at = len(idems)
    remote_api.ns.partition(remote_api.ports["postgres"])
    sc.figures.faults += 1
    time.sleep(HOLD)
    remote_api.ns.heal()
    healed_at = len(idems)
    time.sleep(3)
    stop.set()
    runner.join()

    # The client's retry, once the link is back: the same key, until it is answered 202.
    refused = [idem for idem, codes in attempts.answers.items() if codes[-1] != 202]
    for idem in refused:
        for _ in range(5):
            if _submit(remote_api.api.url, key, idem, attempts, hook):
                break
            time.sleep(1)
    job_ids = {}
    for idem in idems:
        found = _submit(remote_api.api.url, key, idem, attempts, hook)  # the key's one job
        assert found is not None, (idem, attempts.answers[idem])
        job_ids[idem] = found
    sc.accepted = sorted(set(job_ids.values()))
    sc.figures.submitted = len(idems)
    rows = sc.settle(240)
    fig = sc.report(rows)

    with fault_stack.db.session() as session:
        tenant_id = rows[sc.accepted[0]].tenant_id
        stored = session.scalar(
            select(func.count()).select_from(Job).where(Job.tenant_id == tenant_id)
        )
    codes = [
        codes[0] for idem, codes in attempts.answers.items() if idem in idems[cut_at:healed_at]
    ]
    fig.notes = (
        f"{healed_at - cut_at} submits during the cut answered "
        f"{ {c: codes.count(c) for c in set(codes)} }; {len(refused)} retried with their key; "
        f"{stored} jobs stored for {len(idems)} keys"
    )
    print(fig.notes)
    # One job per key: none half-stored, none stored twice by a retry.
    assert stored == len(idems) == len(sc.accepted), fig.notes
    assert all(row.status == JobStatus.SUCCEEDED for row in rows.values()), fig.line()
    # Refused honestly while the database was away (503), not accepted and lost.
    assert any(c == 503 for c in codes), fig.notes
    assert fig.lost == 0 and fig.duplicate_results == 0, fig.line()
