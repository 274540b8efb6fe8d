"""The one clock that times compared across machines are written and read on: the
database's. Leases (below); webhook events' due times, which the recording worker
writes and the delivery worker compares; and a job's publish time (`published_at`),
which the API or relay writes and an idle worker's stranded-delivery watch compares
(workers/stranded.py); and a job's started, finished and updated times, written by
whichever worker ran it and shown to clients beside each other (app/jobs/transitions.py).

A lease is written by a worker and read by the relay's reaper and the operators' requeue,
on other machines. A worker's own clock may be off or jump (an NTP step, a VM resumed
from a snapshot): a lease written on it could expire at once (another worker takes over
a job that is still running) or last an hour (a dead worker's job waits that long). So
on PostgreSQL a lease's deadline is `statement_timestamp()` plus its length, and expiry
is compared with the same clock. SQLite serves one host, whose clock is the only one.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import DateTime, func
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from app.db.types import utcnow

# A plain DateTime, not the UTCDateTime decorator: `now + timedelta` must bind the
# timedelta as an interval, which a decorator would coerce to its own type.
_TIMESTAMP = DateTime(timezone=True)


def now(session: Session) -> ColumnElement[datetime] | datetime:
    """The database's time for this statement (PostgreSQL), or this host's (SQLite)."""
    if session.get_bind().dialect.name == "postgresql":
        return func.statement_timestamp(type_=_TIMESTAMP)
    return utcnow()


def after(session: Session, seconds: float) -> ColumnElement[datetime] | datetime:
    """`seconds` from now on the database's clock: a lease's deadline, a retry's due time."""
    return now(session) + timedelta(seconds=seconds)
