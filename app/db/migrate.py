"""Run the alembic migrations from code (`diffq db upgrade`, embedded start-up, tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).parent


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    cfg.attributes["configure_logging"] = False
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def check(database_url: str) -> None:
    """Raise if the models and the migrations disagree."""
    command.check(alembic_config(database_url))


class SchemaBehind(RuntimeError):
    """The database's migrations are not the ones this code expects."""


_HEADS: set[str] | None = None


def schema_at_head(engine) -> None:
    """Raise unless the database carries every migration this code was built with (the
    migrate Job has run): a readiness check, one small query."""
    global _HEADS
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    if _HEADS is None:
        _HEADS = set(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads())
    with engine.connect() as conn:
        current = set(MigrationContext.configure(conn).get_current_heads())
    if current != _HEADS:
        raise SchemaBehind(f"database at {sorted(current)}, code expects {sorted(_HEADS)}")
