"""Alembic environment: migrations are deploy steps, so they refuse to wait on locks forever."""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import text

from app.config import load_settings
from app.db.models import Base  # the package: every table in the metadata
from app.db.session import make_engine
from app.db.types import UTCDateTime

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def render_item(type_, obj, autogen_context):
    """Migrations spell our column types in plain SQLAlchemy, so they never import app."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or load_settings().database_url


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        compare_type=True,
        render_item=render_item,
        render_as_batch=_url().startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(_url(), pool_size=1)
    with engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            # A migration that cannot get its lock soon fails instead of queueing every
            # query behind it; a runaway statement is stopped.
            connection.execute(text("SET lock_timeout = '5s'"))
            connection.execute(text("SET statement_timeout = '120s'"))
            connection.commit()
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            compare_type=True,
            render_item=render_item,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
