"""Migrations are the schema: upgrade to head, match the models, one head, reversible."""

from __future__ import annotations

import uuid

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from app.db.migrate import alembic_config, check, upgrade
from testbed import services

pytestmark = pytest.mark.services


def test_there_is_a_single_head():
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    assert len(script.get_heads()) == 1


def test_postgres_upgrade_head_then_check_then_downgrade_and_back():
    from alembic import command

    name = f"diffq_migrate_{uuid.uuid4().hex[:8]}"
    url = services.create_database(name)
    try:
        upgrade(url)
        check(url)  # raises if the models and the migrations disagree
        engine = create_engine(url)
        assert {"tenants", "api_keys", "jobs", "alembic_version"} <= set(
            inspect(engine).get_table_names()
        )
        command.downgrade(alembic_config(url), "base")
        assert set(inspect(engine).get_table_names()) == {"alembic_version"}
        upgrade(url)
        check(url)
        engine.dispose()
    finally:
        services.drop_database(name)


def test_sqlite_upgrade_head_then_check(tmp_path):
    url = f"sqlite:///{tmp_path / 'diffq.sqlite3'}"
    upgrade(url)
    check(url)


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_0002_backfills_work_units_and_publish_priority(tmp_path, backend):
    from alembic import command
    from sqlalchemy import text

    name = f"diffq_migrate_{uuid.uuid4().hex[:8]}"
    url = (
        services.create_database(name)
        if backend == "postgresql"
        else f"sqlite:///{tmp_path / 'old.sqlite3'}"
    )
    try:
        command.upgrade(alembic_config(url), "0001")
        engine = create_engine(url)

        def new_id() -> str:  # how each dialect stores a Uuid column
            return uuid.uuid4().hex if backend == "sqlite" else str(uuid.uuid4())

        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO tenants (id, name, created_at) VALUES (:t, 't', :now)"),
                {"t": new_id(), "now": "2026-01-01 00:00:00+00"},
            )
            tenant = conn.execute(text("SELECT id FROM tenants")).scalar()
            conn.execute(
                text(
                    "INSERT INTO jobs (id, tenant_id, status, model, queue, priority, input, "
                    "attempts, created_at, updated_at) VALUES (:id, :t, 'queued', 'tiny', "
                    "'gpu.tiny', 'high', :input, 0, :now, :now)"
                ),
                {
                    "id": new_id(),
                    "t": tenant,
                    "input": '{"steps": 7, "num_images": 2}',
                    "now": "2026-01-01 00:00:00+00",
                },
            )
        upgrade(url)
        with engine.connect() as conn:
            row = conn.execute(text("SELECT work_units, publish_priority FROM jobs")).one()
        assert tuple(row) == (14, 9)
        engine.dispose()
    finally:
        if backend == "postgresql":
            services.drop_database(name)
