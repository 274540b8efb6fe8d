"""The Celery app as the broker edge sees it: built without reading anything, configured by
celeryconfig.py (or the module DIFFQ_CELERY_CONFIG names) when first used.

A process that publishes (the API, the relay, a CLI command) needs only this; tasks/
adds the task modules and the worker's steps to the same construction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cached_property

from celery import Celery
from celery.utils.imports import import_from_cwd


class LazyConfig(Mapping):
    """Celery's configuration source, read on the app's first `conf` access: the module
    DIFFQ_CELERY_CONFIG names, over `celeryconfig.from_services` (broker and queues from
    the root's settings and catalog). Errors (a bad setting, a missing catalog) surface
    there, in the process that needs the configuration, not at import."""

    def __init__(self, root: Callable[[], object] | None = None) -> None:
        self._root = root

    @cached_property
    def _data(self) -> dict:
        import celeryconfig
        from app import services

        svc = (self._root or services.root)()
        module = import_from_cwd(svc.settings.celery_config)
        own = {name: getattr(module, name) for name in dir(module) if not name.startswith("_")}
        return {**celeryconfig.from_services(svc), **own}

    def __getitem__(self, key: str):
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def create_celery(
    root: Callable[[], object] | None = None, *, include: Iterable[str] = (), **overrides
) -> Celery:
    """`root` returns the process's root (app/services.py) whose settings and catalog
    configure the app (default: `app.services.root`), called on the app's first `conf`
    access, never here. `overrides` replace settings (tests, tools)."""
    app = Celery("diffq", include=list(include))
    app.config_from_object(LazyConfig(root))
    app.conf.update(overrides)
    return app
