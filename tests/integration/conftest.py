"""Fixtures of the integration tests."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["postgresql", "sqlite"])
def database(request, tmp_path):
    """The session's PostgreSQL database, then a fresh embedded SQLite one migrated to
    head: code that runs on both is tested on both."""
    if request.param == "postgresql":
        yield request.getfixturevalue("db")
        return
    from app.db.migrate import upgrade
    from app.db.session import Database

    url = f"sqlite:///{tmp_path / 'embedded.sqlite3'}"
    upgrade(url)
    database = Database(url)
    yield database
    database.dispose()
