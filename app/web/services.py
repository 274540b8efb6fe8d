"""The API's views reach the process's root (app/web/root.py) through the Flask app, and
their database session through the request."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import current_app, g
from sqlalchemy.orm import Session

if TYPE_CHECKING:
    from app.web.root import ApiRoot


def services() -> ApiRoot:
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
