"""The guards' parts on their own: the failure counter's windows and bound, stream slots
given back once, spent tickets cleared when expired, the access log's redaction."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from app.web import throttle
from app.web.access_log import redact
from app.web.streams import Slot, StreamSlots
from app.web.throttle import FailureCounter


def test_failures_are_forgotten_when_their_window_ends():
    now = [120.0]
    counter = FailureCounter(limit=3, clock=lambda: now[0])
    for _ in range(3):
        assert counter.retry_after("addr:a") is None
        counter.failed("addr:a", None)
    assert counter.retry_after("addr:a") == 60  # the window started at 120
    assert counter.retry_after("addr:b", None) is None
    now[0] = 179.5
    assert counter.retry_after("addr:a") == 1
    now[0] = 180.0
    assert counter.retry_after("addr:a") is None


def test_the_failure_table_stays_bounded(monkeypatch):
    monkeypatch.setattr(throttle, "MAX_ENTRIES", 100)
    now = [0.0]
    counter = FailureCounter(limit=5, clock=lambda: now[0])
    for n in range(1000):
        if n == 500:
            now[0] = 60.0  # a new window: the old one's counters go first
        counter.failed(f"addr:{n}")
    assert len(counter._counts) <= 100


def test_a_limit_of_zero_counts_nothing():
    counter = FailureCounter(limit=0)
    for _ in range(100):
        counter.failed("addr:a")
    assert counter.retry_after("addr:a") is None and not counter._counts


def test_a_stream_slot_is_given_back_once():
    slots = StreamSlots(per_process=2, per_tenant=1)
    tenant, other = uuid.uuid4(), uuid.uuid4()
    assert slots.take(tenant) is None
    assert slots.take(tenant) == "tenant"
    assert slots.take(other) is None
    assert slots.take(uuid.uuid4()) == "process"
    slot = Slot(slots, tenant)
    slot.release()
    slot.release()  # the stream's close and its generator's end both call it
    assert slots.open == 1 and slots.take(tenant) is None


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        (
            "GET /v1/jobs/1/ws?ticket=abc.def-ghi HTTP/1.1",
            "GET /v1/jobs/1/ws?ticket=[redacted] HTTP/1.1",
        ),
        ("ticket=abc&last_event_id=3", "ticket=[redacted]&last_event_id=3"),
        ("last_event_id=3&ticket=abc", "last_event_id=3&ticket=[redacted]"),
        ("/files/a.png?expires=9&signature=f00", "/files/a.png?expires=9&signature=[redacted]"),
        ("/v1/jobs?limit=5", "/v1/jobs?limit=5"),
        ("/v1/jobs?myticket=5", "/v1/jobs?myticket=5"),
    ],
)
def test_the_access_log_redacts_credentials_in_query_strings(line, shown):
    assert redact(line) == shown


@pytest.mark.services
def test_spending_a_ticket_clears_the_expired_ones(stack, db):
    from sqlalchemy import select

    from app.db.models.limits import UsedTicket
    from app.db.types import utcnow
    from app.web.tickets import make_ticket, read_ticket, spend

    old = uuid.uuid4().hex
    with db.session() as session:
        session.add(UsedTicket(ticket_id=old, expires_at=utcnow() - timedelta(seconds=1)))
        session.commit()
    job = uuid.uuid4()
    ticket = read_ticket("k", 60, make_ticket("k", uuid.uuid4(), job), job)
    assert (
        ticket is not None
        and read_ticket("other", 60, make_ticket("k", uuid.uuid4(), job), job) is None
    )
    with db.session() as session:
        assert spend(session, ticket) is True
        assert spend(session, ticket) is False
        kept = set(session.scalars(select(UsedTicket.ticket_id)))
    assert old not in kept and ticket.ticket_id in kept


@pytest.fixture(params=["postgresql", "sqlite"])
def shared_store(request, tmp_path):
    """The failures table on the suite's PostgreSQL, then on a migrated SQLite file (the
    embedded service's store)."""
    if request.param == "postgresql":
        yield request.getfixturevalue("db")
        return
    from app.db.migrate import upgrade
    from app.db.session import Database

    url = f"sqlite:///{tmp_path / 'diffq.sqlite3'}"
    upgrade(url)
    database = Database(url)
    yield database
    database.dispose()


def test_the_failure_count_is_shared_by_the_api_processes(shared_store):
    """Two processes' counters on one store, an address failing on each in turn: the
    address is refused once the failures of both reach the limit, plus at most one that
    the second process lets through before it counts its own (each process alone would
    allow the whole limit: twice as many)."""
    limit, now = 6, [float(uuid.uuid4().int % 10**6) * 60]  # a window no other test used
    name = f"addr:{uuid.uuid4()}"
    processes = [
        FailureCounter(limit, clock=lambda: now[0], shared=throttle.SharedFailures(shared_store))
        for _ in range(2)
    ]
    through = 0
    for n in range(4 * limit):
        process = processes[n % 2]
        if process.retry_after(name) is None:
            through += 1
            process.failed(name)
    print(f"\nshared failed-auth count: {through} failures through for a limit of {limit}")
    assert limit <= through <= limit + 1
    assert all(p.retry_after(name) is not None for p in processes)
    now[0] += 60  # the next minute: counted afresh, and the past minute's rows dropped
    assert all(p.retry_after(name) is None for p in processes)
    processes[0].failed(name)
    from sqlalchemy import func, select

    from app.db.models.limits import AuthFailure

    with shared_store.session() as session:
        windows = session.scalars(
            select(func.count()).select_from(AuthFailure).where(AuthFailure.name == name)
        ).one()
    assert windows == 1
