"""The one place the Celery app is built; configured by celeryconfig.py."""

from __future__ import annotations

from celery import Celery

from app.config import load_settings


def create_celery(**overrides) -> Celery:
    """The app configured by celeryconfig.py (or the module DIFFQ_CELERY_CONFIG names);
    `overrides` replace settings (tests, tools)."""
    # Task modules are listed, not imported: only a worker imports them (and torch).
    app = Celery("diffq", include=["tasks.generate", "tasks.webhooks", "tasks.worker_boot"])
    app.config_from_object(load_settings().celery_config)
    app.conf.update(overrides)
    from workers.heartbeat import Heartbeat

    app.steps["consumer"].add(Heartbeat)  # the worker's /healthz (workers/heartbeat.py)
    return app


app = create_celery()
