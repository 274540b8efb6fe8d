"""The API's views reach the process's root (app/services.py) through the Flask app."""

from __future__ import annotations

from flask import current_app, g
from sqlalchemy.orm import Session

from app import services as root
from app.web.watch import JobWatcher


class Services(root.Services):
    """The root, plus what only the API holds: the LISTEN/NOTIFY watcher of its streams."""

    @root.resource
    def watcher(self) -> JobWatcher:
        return JobWatcher(self.db)


def services() -> Services:
    return current_app.extensions["diffq"]


def request_session() -> Session:
    """One session per request on one connection: authentication and the view share it,
    and it stays checked out across their commits (one pool checkout)."""
    session = g.get("db_session")
    if session is None:
        connection = services().db.engine.connect()
        session = g.db_session = services().db.sessions(bind=connection)
    return session


def close_request_session(_exc: BaseException | None = None) -> None:
    """Teardown: anything the view did not commit is rolled back."""
    session = g.pop("db_session", None)
    if session is not None:
        connection = session.bind
        session.close()
        connection.close()
