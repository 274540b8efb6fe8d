"""What the API's views need, built once by the factory and kept on the Flask app."""

from __future__ import annotations

from dataclasses import dataclass

from flask import current_app, g
from sqlalchemy.orm import Session

from app.broker.publish import Publisher
from app.catalog import Catalog
from app.config import Settings
from app.db.session import Database
from app.storage import Storage
from app.web.watch import JobWatcher


@dataclass
class Services:
    settings: Settings
    catalog: Catalog
    db: Database
    storage: Storage
    publisher: Publisher
    watcher: JobWatcher


def services() -> Services:
    return current_app.extensions["diffq"]


def request_session() -> Session:
    """One session per request on one connection: authentication and the view share it,
    and it stays checked out across their commits (one pool checkout, one ping)."""
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
