"""The Celery app as the broker edge sees it: built without reading anything, configured by
celeryconfig.py (or the module DIFFQ_CELERY_CONFIG names) when first used.

A process that publishes (the API, the relay, a CLI command) needs only this; tasks/
adds the task modules and the worker's steps to the same construction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cached_property
from typing import Any

from celery import Celery
from celery.utils.imports import import_from_cwd

from app.broker.topology import WEBHOOK_QUEUE


class LazyConfig(Mapping):
    """Celery's configuration source, read on the app's first `conf` access: the module
    DIFFQ_CELERY_CONFIG names (celeryconfig.py by default), over the broker backend's
    settings (URL, transport options, the catalog's queues and the webhooks queue).
    Errors (a bad setting, a missing catalog) surface there, in the process that needs
    the configuration, not at import."""

    def __init__(self, root: Callable[[], Any]) -> None:
        self._root = root

    @cached_property
    def _data(self) -> dict:
        svc = self._root()
        module = import_from_cwd(svc.settings.celery_config)
        own = {name: getattr(module, name) for name in dir(module) if not name.startswith("_")}
        catalog = svc.catalog
        queues = [*catalog.queues, WEBHOOK_QUEUE]
        return {**svc.broker.celery_settings(queues, catalog.get(None).queue), **own}

    def __getitem__(self, key: str):
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def create_celery(root: Callable[[], Any], *, include: Iterable[str] = (), **overrides) -> Celery:
    """`root` returns the process's root (app/services.py) whose settings, catalog and
    broker configure the app, called on the app's first `conf` access, never here.
    `overrides` replace settings (tests, tools)."""
    app = Celery("diffq", include=list(include))
    app.config_from_object(LazyConfig(root))
    app.conf.update(overrides)
    return app
