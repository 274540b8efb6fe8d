"""The submit's hot statements: one round trip each, in autocommit (app/db/session.py
`execute_alone`), and the authentication call that finds, counts and touches a key in
one (app/keys.py `admit`, migration 0009)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError

from app.db.models.limits import RequestCount
from app.db.models.tenants import ApiKey, Tenant
from app.db.session import execute_alone
from app.db.types import utcnow
from app.keys import admit

pytestmark = pytest.mark.services


def _tenant_ids(db, name: str) -> list:
    with db.session() as session:
        return list(session.scalars(select(Tenant.id).where(Tenant.name == name)))


def test_a_statement_alone_is_committed_when_it_returns(db):
    name = f"alone-{uuid.uuid4().hex[:8]}"
    with db.sessions() as session:
        execute_alone(
            session,
            "INSERT INTO tenants (id, name, created_at, weight) VALUES (%(id)s, %(n)s, now(), 1)",
            {"id": str(uuid.uuid4()), "n": name},
        )
        # Seen from another connection while this session is still open: committed.
        assert len(_tenant_ids(db, name)) == 1
        session.rollback()  # nothing of the session's to undo
    assert len(_tenant_ids(db, name)) == 1


def test_what_the_session_did_before_is_committed_first(db):
    name = f"before-{uuid.uuid4().hex[:8]}"
    with db.sessions() as session:
        session.add(Tenant(name=name))  # pending, not flushed
        execute_alone(session, "SELECT 1", {})
        assert len(_tenant_ids(db, name)) == 1


def test_a_session_on_one_connection_lends_it_as_the_api_request_does(db):
    first, second = f"lent-{uuid.uuid4().hex[:8]}", f"lent-{uuid.uuid4().hex[:8]}"
    insert = "INSERT INTO tenants (id, name, created_at, weight) VALUES (%(id)s, %(n)s, now(), 1)"
    with db.engine.connect() as connection:
        session = db.sessions(bind=connection)
        execute_alone(session, insert, {"id": str(uuid.uuid4()), "n": first})
        assert not session.in_transaction() and not connection.in_transaction()
        session.add(Tenant(name=second))  # pending: committed before the next statement
        execute_alone(session, "SELECT 1", {})
        assert len(_tenant_ids(db, first)) == 1 and len(_tenant_ids(db, second)) == 1
        session.close()


def test_a_failed_statement_leaves_nothing_and_the_session_goes_on(db):
    name = f"dup-{uuid.uuid4().hex[:8]}"
    insert = (
        "WITH extra AS (INSERT INTO tenants (id, name, created_at, weight) "
        "VALUES (%(other)s, %(other_name)s, now(), 1)) "
        "INSERT INTO tenants (id, name, created_at, weight) VALUES (%(id)s, %(n)s, now(), 1)"
    )
    params = {"other_name": name + "-x", "n": name}
    with db.sessions() as session:
        execute_alone(
            session, insert, {**params, "id": str(uuid.uuid4()), "other": str(uuid.uuid4())}
        )
        with pytest.raises(IntegrityError):  # the name is taken: SQLAlchemy's own error
            execute_alone(
                session,
                insert.replace("-x", ""),
                {**params, "id": str(uuid.uuid4()), "other": str(uuid.uuid4())},
            )
        session.rollback()
        assert session.scalar(select(Tenant.name).where(Tenant.name == name)) == name
    # The failed statement's other half (its CTE) was not kept either.
    assert _tenant_ids(db, name + "-x") and len(_tenant_ids(db, name)) == 1


def test_a_lost_connection_raises_and_is_invalidated(db):
    with db.sessions() as session:
        pid = execute_alone(session, "SELECT pg_backend_pid()", {})[0][0]
        with db.session() as other:  # the server ends the session's connection
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with pytest.raises(OperationalError) as raised:
            execute_alone(session, "SELECT 1", {})
        assert raised.value.connection_invalidated
        session.rollback()
        # The session goes on, on a fresh connection.
        assert execute_alone(session, "SELECT pg_backend_pid()", {})[0][0] != pid


@pytest.mark.parametrize("on_one_connection", [False, True])
def test_a_statement_that_may_run_twice_runs_again_on_a_fresh_connection(db, on_one_connection):
    connection = db.engine.connect() if on_one_connection else None
    with db.sessions(**({"bind": connection} if connection else {})) as session:
        pid = execute_alone(session, "SELECT pg_backend_pid()", {})[0][0]
        with db.session() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        again = execute_alone(session, "SELECT pg_backend_pid()", {}, again_if_lost=True)
        assert again[0][0] != pid
    if connection is not None:
        connection.close()


def _key_row(db, presented: str) -> ApiKey:
    with db.session() as session:
        return session.scalar(select(ApiKey).where(ApiKey.key_id == presented.split("_")[1]))


def _count(db, key_id: str) -> int:
    """The key's requests counted, over every window."""
    with db.session() as session:
        counts = session.scalars(select(RequestCount.count).where(RequestCount.key_id == key_id))
        return sum(counts)


def test_admit_finds_counts_and_touches_a_key_in_one_call(db, tenant_key):
    key_id = tenant_key.split("_")[1]
    with db.sessions() as session:
        first = admit(session, tenant_key, 100)
        second = admit(session, tenant_key, 100)
    assert first is not None and second is not None
    assert first.key.tenant_id == _key_row(db, tenant_key).tenant_id
    assert first.verdict.allowed and second.verdict.allowed
    assert _count(db, key_id) == 2
    assert _key_row(db, tenant_key).last_used_at is not None


def test_admit_refuses_over_the_limit_with_a_retry_after(db, tenant_key):
    with db.sessions() as session:
        verdicts = [admit(session, tenant_key, 2).verdict for _ in range(3)]
    assert [v.allowed for v in verdicts] == [True, True, False]
    assert 0 < verdicts[-1].retry_after <= 60


def test_a_wrong_secret_or_a_revoked_key_is_neither_admitted_nor_counted(db, tenant_key):
    key_id = tenant_key.split("_")[1]
    forged = tenant_key[:-4] + ("AAAA" if not tenant_key.endswith("AAAA") else "BBBB")
    with db.sessions() as session:
        assert admit(session, forged, 100) is None
        assert admit(session, "dq_not_a_key", 100) is None
    assert _count(db, key_id) == 0
    with db.session() as session:
        session.execute(update(ApiKey).where(ApiKey.key_id == key_id).values(revoked_at=utcnow()))
    with db.sessions() as session:
        assert admit(session, tenant_key, 100) is None
    assert _count(db, key_id) == 0


def test_last_used_at_is_written_at_most_once_a_minute(db, tenant_key):
    key_id = tenant_key.split("_")[1]
    recent = utcnow() - timedelta(seconds=10)
    with db.session() as session:
        session.execute(update(ApiKey).where(ApiKey.key_id == key_id).values(last_used_at=recent))
    with db.sessions() as session:
        admit(session, tenant_key, 0)
    assert abs((_key_row(db, tenant_key).last_used_at - recent).total_seconds()) < 0.01
    stale = utcnow() - timedelta(minutes=5)
    with db.session() as session:
        session.execute(update(ApiKey).where(ApiKey.key_id == key_id).values(last_used_at=stale))
    with db.sessions() as session:
        admit(session, tenant_key, 0)
    assert _key_row(db, tenant_key).last_used_at > stale + timedelta(minutes=4)
