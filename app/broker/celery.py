"""The Celery app as the broker edge sees it: built without reading anything, configured by
celeryconfig.py (or the module DIFFQ_CELERY_CONFIG names) when first used.

A process that publishes (the API, the relay, a CLI command) needs only this; tasks/
adds the task modules and the worker's steps to the same construction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from celery import Celery


def create_celery(
    root: Callable[[], object] | None = None, *, include: Iterable[str] = (), **overrides
) -> Celery:
    """`root` returns the process's root (app/services.py) whose settings and catalog
    configure the app (default: `app.services.root`); it is called on the app's first
    `conf` access, never here. `overrides` replace settings (tests, tools)."""
    app = Celery("diffq", include=list(include))

    def configure(sender: Celery, **_kwargs) -> None:
        import celeryconfig
        from app import services

        svc = (root or services.root)()
        sender.config_from_object(svc.settings.celery_config)
        sender.add_defaults(lambda: celeryconfig.from_services(svc))

    app.on_configure.connect(configure, sender=app, weak=False)
    app.conf.update(overrides)
    return app
