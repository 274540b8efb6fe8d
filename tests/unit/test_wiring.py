"""The composition root, the Celery configuration read on first use, and the click CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import click
import pytest

from app.config import load_settings
from app.services import Services


def _env(tmp_path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIFFQ_")}
    return {**env, "DIFFQ_HOME": str(tmp_path), **extra}


def test_a_root_opens_each_resource_on_first_use_and_once(tmp_path):
    svc = Services(load_settings(_env(tmp_path)), db_pool_size=1)
    assert not any(svc.opened(name) for name in ("catalog", "db", "storage", "publisher"))
    assert svc.db is svc.db and svc.opened("db") and not svc.opened("storage")
    publisher = svc.publisher  # needs the catalog, and builds it
    assert svc.opened("catalog") and publisher.catalog is svc.catalog
    child = svc.derive(db_pool_size=3)
    assert child.settings is svc.settings and child.catalog is svc.catalog
    assert child.db is not svc.db
    svc.close()
    child.close()


def test_importing_the_celery_app_reads_no_settings(tmp_path):
    """A bad setting and a missing model file: importing is fine, configuring is not."""
    code = (
        "import celeryconfig, tasks\n"
        "try:\n"
        "    tasks.app.conf.broker_url\n"
        "except ValueError as exc:\n"
        "    print('configure:', exc)\n"
    )
    env = _env(
        tmp_path,
        DIFFQ_LOG_FORMAT="yaml",
        DIFFQ_MODELS_FILE=str(tmp_path / "missing.toml"),
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "configure: DIFFQ_LOG_FORMAT must be one of text, json" in out


def test_the_celery_app_takes_its_broker_and_queues_from_the_settings(tmp_path):
    code = (
        "import tasks\n"
        "conf = tasks.app.conf\n"
        "print(conf.broker_url, conf.task_default_queue, conf.task_acks_late, "
        "sorted(q.name for q in conf.task_queues))\n"
    )
    env = _env(tmp_path, DIFFQ_BROKER_URL="amqp://u:p@broker.invalid:5672//")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split(maxsplit=3)
    assert out[:3] == ["amqp://u:p@broker.invalid:5672//", "gpu.tiny", "True"]
    assert "'webhooks'" in out[3] and "'gpu.tiny'" in out[3]


def _commands(group: click.Group, path=()):
    for name, command in group.commands.items():
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def test_every_diffq_command_answers_help(capsys):
    from cli import diffq, main

    paths = list(_commands(diffq))
    assert {("jobs", "submit"), ("requeue",), ("dlq", "purge"), ("up",)} <= set(paths)
    for path in paths:
        assert main([*path, "--help"]) == 0, path
        assert "Usage: diffq " + " ".join(path) in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tenants", "set", "t", "--weight", "-1"], "must be a positive number"),
        (["tenants", "set", "t", "--daily-gpu-seconds", "5", "--no-quota"], "exclude each"),
        (["jobs", "list", "--status", "lost"], "Invalid value for '--status'"),
        (["nope"], "No such command"),
    ],
)
def test_usage_errors_exit_2_with_the_reason(argv, message, capsys, tmp_path, monkeypatch):
    from cli import main

    monkeypatch.setenv("DIFFQ_HOME", str(tmp_path))
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_operators_commands_are_the_same_on_celery_and_diffq():
    from importlib.metadata import entry_points

    from cli import diffq

    registered = {e.name: e.load() for e in entry_points(group="celery.commands")}
    for name in ("dlq", "requeue", "queues"):
        assert registered[name] is diffq.commands[name]
    assert registered["jobs"].commands["requeue"] is registered["requeue"]  # old spelling
    assert diffq.commands["jobs"].commands.keys() >= {"submit", "get", "list", "watch"}


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("postgresql://u:p@db:5432/diffq", "postgresql+psycopg2://u:p@db:5432/diffq"),
        ("postgres://u:p@db/diffq", "postgresql+psycopg2://u:p@db/diffq"),
        ("postgresql+psycopg2://u@db/diffq", "postgresql+psycopg2://u@db/diffq"),
        ("sqlite:////srv/diffq.sqlite3", "sqlite:////srv/diffq.sqlite3"),
    ],
)
def test_a_postgresql_url_without_a_driver_means_psycopg2(tmp_path, given, used):
    assert load_settings(_env(tmp_path, DIFFQ_DATABASE_URL=given)).database_url == used


def test_another_postgresql_driver_is_refused_naming_the_variable(tmp_path):
    with pytest.raises(ValueError, match=r"DIFFQ_DATABASE_URL.*psycopg2"):
        load_settings(_env(tmp_path, DIFFQ_DATABASE_URL="postgresql+psycopg://u@db/diffq"))


def test_the_listen_url_is_the_database_url_unless_set_and_read_the_same_way(tmp_path):
    """Behind a transaction pooler the LISTEN sessions go to PostgreSQL itself
    (DIFFQ_DATABASE_LISTEN_URL); unset, they go where everything else does."""
    pooled = "postgresql://u@pgbouncer:6432/diffq"
    alone = load_settings(_env(tmp_path, DIFFQ_DATABASE_URL=pooled))
    assert (
        alone.database_listen_url
        == alone.database_url
        == pooled.replace("postgresql://", "postgresql+psycopg2://")
    )
    assert not alone.database_pooled
    split = load_settings(
        _env(
            tmp_path,
            DIFFQ_DATABASE_URL=pooled,
            DIFFQ_DATABASE_POOLED="1",
            DIFFQ_DATABASE_LISTEN_URL="postgres://u@db:5432/diffq",
        )
    )
    assert split.database_pooled
    assert split.database_listen_url == "postgresql+psycopg2://u@db:5432/diffq"
    with pytest.raises(ValueError, match=r"DIFFQ_DATABASE_LISTEN_URL.*psycopg2"):
        load_settings(_env(tmp_path, DIFFQ_DATABASE_LISTEN_URL="postgresql+asyncpg://u@db/diffq"))


@pytest.mark.parametrize(
    ("name", "raw", "said"),
    [
        ("DIFFQ_MAX_WAIT", "ten", "must be an integer"),
        ("DIFFQ_INPUT_TTL", "a day", "must be a number"),
        ("DIFFQ_WEBHOOK_SCHEDULE", "5,soon", "must be comma-separated seconds"),
        ("DIFFQ_WEBHOOK_SCHEDULE", "5,-1", "must not be negative"),
    ],
)
def test_a_setting_that_does_not_parse_is_refused_naming_the_variable(tmp_path, name, raw, said):
    with pytest.raises(ValueError, match=rf"^{name} {said}, got '{raw}'$"):
        load_settings(_env(tmp_path, **{name: raw}))


def test_settings_unset_or_empty_take_their_defaults(tmp_path):
    empty = load_settings(_env(tmp_path, DIFFQ_MAX_WAIT="", DIFFQ_WEBHOOK_SCHEDULE=""))
    unset = load_settings(_env(tmp_path))
    assert (empty.max_wait, empty.webhook_schedule) == (unset.max_wait, unset.webhook_schedule)
    assert load_settings(_env(tmp_path, DIFFQ_INPUT_TTL="90.5")).input_ttl == 90.5
