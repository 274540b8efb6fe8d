"""Engines and sessions: one Database per process, built from the settings."""

from __future__ import annotations

import json
import logging
import math
import select
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2
from psycopg2.extensions import TRANSACTION_STATUS_IDLE
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # WAL lets the API read while a worker writes; busy_timeout waits out short locks.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


# No statement runs longer on a diffq session (behind a pooler: the role's setting).
STATEMENT_TIMEOUT_MS = 15000

# A pooled connection idle longer than this is pinged before use; one used more recently
# is only checked for a message or EOF from the server (no round trip).
PING_AFTER_IDLE = 5.0


def _checked_in(_dbapi_conn, record) -> None:
    record.info["idle_since"] = time.monotonic()


def _check_alive(dialect, dbapi_conn, record) -> None:
    """The pool's checkout: a connection the server ended is swapped for a fresh one.

    A server that ends a connection (a restart, `pg_terminate_backend`, an idle timeout)
    sends its last message and closes the socket, so a pooled connection with anything to
    read is one to drop: polling the socket costs no round trip, where `pool_pre_ping`
    costs one per checkout. A connection idle for longer than PING_AFTER_IDLE, which a
    firewall may have dropped without a word, is pinged as `pool_pre_ping` would. Raising
    DisconnectionError makes the pool discard the connection and check out another.
    """
    if dbapi_conn.closed:
        raise DisconnectionError("the connection is closed")
    idle_since = record.info.get("idle_since")
    if idle_since is None or time.monotonic() - idle_since > PING_AFTER_IDLE:
        try:
            dialect.do_ping(dbapi_conn)
        except Exception as exc:  # any failure: a fresh connection
            raise DisconnectionError(f"ping failed: {exc}") from exc
        return
    poller = select.poll()
    poller.register(dbapi_conn.fileno(), select.POLLIN)
    if poller.poll(0):
        raise DisconnectionError("the server has ended the connection")


def portable_json(value: Any, default: Any = None) -> str:
    """JSON that every store takes: PostgreSQL's JSON types refuse the `Infinity`, and
    `NaN` Python writes for non-finite floats (a scheduler's configuration holds
    `-inf`), so those are written as the strings "Infinity", "-Infinity" and "NaN"."""
    return json.dumps(_finite(value), default=default)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def make_engine(
    url: str,
    *,
    pool_size: int = 5,
    idle_transaction_seconds: float | None = None,
    pooled: bool = False,
) -> Engine:
    """`idle_transaction_seconds` (PostgreSQL): the server ends a session of this engine
    that holds a transaction open without sending a statement for that long, releasing
    its locks (a process frozen between an UPDATE and its COMMIT would hold the row
    until it died).

    `pooled` (DIFFQ_DATABASE_POOLED): the URL is a transaction pooler's (PgBouncer in
    transaction mode), which refuses the `options` startup parameter and hands each
    transaction to any of its server connections: the session settings below are then
    the server's to set, on the role or the database (README, "Connection poolers")."""
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 10},
            json_serializer=portable_json,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # Fail fast when the server is away, and never let one statement hang a worker.
    connect_args: dict[str, Any] = {"connect_timeout": 5}
    if not pooled:
        options = f"-c statement_timeout={STATEMENT_TIMEOUT_MS}"
        if idle_transaction_seconds:
            ms = int(idle_transaction_seconds * 1000)
            options += f" -c idle_in_transaction_session_timeout={ms}"
        connect_args["options"] = options
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=1800,
        json_serializer=portable_json,
        connect_args=connect_args,
    )
    dialect = engine.dialect
    event.listen(engine, "connect", _checked_in)  # just made: alive
    event.listen(engine, "checkin", _checked_in)
    event.listen(engine, "checkout", lambda conn, record, _: _check_alive(dialect, conn, record))
    return engine


def execute_alone(
    session: Session, sql: str, params: dict, *, again_if_lost: bool = False
) -> list[tuple]:
    """PostgreSQL: run one statement, written in the driver's SQL (`%(name)s` parameters),
    as a transaction of its own on the session's connection, after committing what the
    session did before it; returns its rows as the driver gives them.

    The statement runs in the driver's autocommit, so it costs one round trip (no BEGIN,
    no COMMIT): the server commits it as it ends, durably unless the statement itself
    relaxes `synchronous_commit`. It goes straight to the driver's cursor (the submit's
    hot path: no compilation, no result processing), keeping SQLAlchemy's error contract:
    a failure raises SQLAlchemy's exception for it (IntegrityError, OperationalError, ...)
    and a lost connection is invalidated. A statement that fails leaves nothing behind;
    the caller rolls the session back as after any error.

    With `again_if_lost`, for a statement that may run twice (counting a request, say),
    a connection found lost is replaced and the statement runs once more: the server can
    end a connection between the pool's checkout and its first statement (a backend
    signalled to terminate answers nothing more), and a request need not fail for it.
    """
    connection = _connection_of(session)
    driver = connection.connection.dbapi_connection
    pending = session.new or session.dirty or session.deleted
    if pending or driver.info.transaction_status != TRANSACTION_STATUS_IDLE:
        session.commit()  # what the session did so far (else its commit has nothing to do)
        connection = _connection_of(session)
        driver = connection.connection.dbapi_connection
    driver.autocommit = True
    try:
        with driver.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description is not None else []
    except psycopg2.Error as err:
        dialect = connection.dialect
        lost = dialect.is_disconnect(err, driver, None)
        if lost:
            connection.invalidate(err)
            if again_if_lost:
                session.rollback()  # holds nothing of the caller's: that was committed first
                return execute_alone(session, sql, params)
        raise DBAPIError.instance(
            sql, params, err, psycopg2.Error, connection_invalidated=lost, dialect=dialect
        ) from err
    finally:
        if not driver.closed:
            driver.autocommit = False


def _connection_of(session: Session) -> Connection:
    """The connection a statement alone runs on: a session bound to one connection (the
    API's request) lends it as it is while the session has no transaction of its own, so
    the statement begins and commits nothing on the session's side either."""
    bind = session.bind
    if isinstance(bind, Connection) and not session.in_transaction():
        return bind
    return session.connection()


class Database:
    """An engine and its session factory; `session()` commits on success, rolls back on error."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 5,
        idle_transaction_seconds: float | None = None,
        pooled: bool = False,
        listen_url: str | None = None,
    ) -> None:
        """`listen_url`: where LISTEN connections go (DIFFQ_DATABASE_LISTEN_URL): a
        session of their own, which a transaction pooler cannot keep (default `url`)."""
        self.url = url
        self.listen_url = listen_url or url
        self.pooled = pooled
        self.engine = make_engine(
            url,
            pool_size=pool_size,
            idle_transaction_seconds=idle_transaction_seconds,
            pooled=pooled,
        )
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    def unbounded_statements(self) -> bool:
        """Behind a pooler: whether the server lets a statement run without a time limit
        (the role or the database has no `statement_timeout`), which diffq cannot set
        through the pooler itself."""
        with self.engine.connect() as conn:
            return conn.execute(text("SHOW statement_timeout")).scalar() in ("0", None)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def dispose(self) -> None:
        self.engine.dispose()


def warn_if_unbounded(db: Database) -> None:
    """Behind a pooler, say at start when the server leaves statements unbounded; a
    server that cannot be reached now is the pool's to report at first use."""
    try:
        unbounded = db.unbounded_statements()
    except DBAPIError:
        return
    if unbounded:
        log.warning(
            "DIFFQ_DATABASE_POOLED is set and the server has no statement_timeout for this "
            "role: a statement may hang a worker. Set it on the role, e.g. ALTER ROLE diffq "
            "SET statement_timeout = '%ds' (README, Connection poolers)",
            STATEMENT_TIMEOUT_MS // 1000,
        )


def relaxed_commit(session: Session) -> None:
    """This transaction's commit returns before its WAL reaches disk (PostgreSQL only):
    for writes whose loss in a crash is harmless."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL synchronous_commit = off"))


def unclaimed_ids(session: Session, query) -> list:
    """The ids `query` selects, passing over rows another transaction has locked and
    locking those it takes (SKIP LOCKED on PostgreSQL; SQLite has one writer at a time),
    for passes that several processes run at once."""
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return list(session.scalars(query))
