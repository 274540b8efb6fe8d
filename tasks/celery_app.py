"""The worker's Celery app: the broker edge's (app/broker/celery.py) with the task modules
and the worker's own consumer step."""

from __future__ import annotations

from celery import Celery

from app import services as root
from app.broker import celery


def create_celery(**overrides) -> Celery:
    """Configured by celeryconfig.py when first used; `overrides` replace settings."""
    # Task modules are listed, not imported: only a worker imports them (and torch).
    app = celery.create_celery(
        services, include=["tasks.generate", "tasks.webhooks", "tasks.boot"], **overrides
    )
    from workers.heartbeat import Heartbeat

    app.steps["consumer"].add(Heartbeat)  # the worker's /healthz (workers/heartbeat.py)
    return app


def services() -> root.Services:
    """The process's root, with this Celery app in it (a worker's main process, a
    `celery` command; a GPU worker's pool child installs one of its own)."""
    return root.root(celery=app, db_pool_size=1)


app = create_celery()
