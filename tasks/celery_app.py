"""The one place the Celery app is built; configured by celeryconfig.py when first used."""

from __future__ import annotations

from celery import Celery

from app import services as root


def create_celery(**overrides) -> Celery:
    """The app configured by celeryconfig.py (or the module DIFFQ_CELERY_CONFIG names);
    `overrides` replace settings (tests, tools). Building it reads nothing: the settings
    and the catalog are read when the app is first configured (its first `conf` access)."""
    # Task modules are listed, not imported: only a worker imports them (and torch).
    app = Celery("diffq", include=["tasks.generate", "tasks.webhooks", "tasks.boot"])
    app.on_configure.connect(_configure, sender=app, weak=False)
    app.conf.update(overrides)
    from workers.heartbeat import Heartbeat

    app.steps["consumer"].add(Heartbeat)  # the worker's /healthz (workers/heartbeat.py)
    return app


def _configure(sender: Celery, **_kwargs) -> None:
    import celeryconfig

    svc = services()
    sender.config_from_object(svc.settings.celery_config)
    sender.add_defaults(lambda: celeryconfig.from_services(svc))


def services() -> root.Services:
    """The process's root, with this Celery app in it (a worker's main process, a
    `celery` command; a GPU worker's pool child installs one of its own)."""
    return root.root(celery=app, db_pool_size=1)


app = create_celery()
