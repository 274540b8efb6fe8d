"""Engines and sessions: one Database per process, built from the settings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from psycopg2.extensions import TRANSACTION_STATUS_IDLE
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session, sessionmaker


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    # WAL lets the API read while a worker writes; busy_timeout waits out short locks.
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def make_engine(url: str, *, pool_size: int = 5) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 10})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=1800,
        # Fail fast when the server is away, and never let one statement hang a worker.
        connect_args={"connect_timeout": 5, "options": "-c statement_timeout=15000"},
    )


def execute_alone(session: Session, sql: str, params: dict) -> list[tuple]:
    """PostgreSQL: run one statement, written in the driver's SQL (`%(name)s` parameters),
    as a transaction of its own on the session's connection, after committing what the
    session did before it; returns its rows as the driver gives them.

    The statement runs in the driver's autocommit, so it costs one round trip (no BEGIN,
    no COMMIT): the server commits it as it ends, durably unless the statement itself
    relaxes `synchronous_commit`. It skips SQLAlchemy's compilation and type processing
    (the submit's hot path), not its error handling: failures raise SQLAlchemy's
    exceptions and a lost connection is invalidated. A statement that fails leaves
    nothing behind; the caller rolls the session back as after any error.
    """
    connection = session.connection()
    driver = connection.connection.dbapi_connection
    pending = session.new or session.dirty or session.deleted
    if pending or driver.info.transaction_status != TRANSACTION_STATUS_IDLE:
        session.commit()  # what the session did so far (else its commit has nothing to do)
        connection = session.connection()
        driver = connection.connection.dbapi_connection
    driver.autocommit = True
    try:
        result = connection.exec_driver_sql(sql, params)
        return result.fetchall() if result.returns_rows else []
    finally:
        if not driver.closed:
            driver.autocommit = False


class Database:
    """An engine and its session factory; `session()` commits on success, rolls back on error."""

    def __init__(self, url: str, *, pool_size: int = 5) -> None:
        self.url = url
        self.engine = make_engine(url, pool_size=pool_size)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

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
