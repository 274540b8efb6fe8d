"""The composition root: what a process wires together, built once per process.

Every process (the API, a GPU worker and its pool children, a webhook worker, the relay,
each CLI command) reads its settings once, here, and gets the catalog, database, result
store and publisher from one `Services`. Each resource is opened on first use, so a
process holds only what it touches (the relay never loads a model; `diffq keys` never
opens the store). The Celery app is passed in by a process that has one (a worker's,
from tasks/), or built here for publishing (app/broker/celery.py): app/ never imports
tasks/ or workers/.

Importing the root also subscribes the listeners every process that changes jobs needs:
webhook events are written in the transaction of each change (app/jobs/changes.py).
"""

from __future__ import annotations

import threading
from functools import cached_property
from typing import TypeVar

from app.broker.backend import Broker, broker_for
from app.broker.publish import Publisher
from app.catalog import Catalog, load_catalog
from app.config import Settings, load_settings
from app.db.session import Database, warn_if_unbounded
from app.storage import Storage, open_storage
from app.webhooks import events as _webhook_events  # noqa: F401 - subscribes to job changes

S = TypeVar("S", bound="Services")


class resource(cached_property):
    """Built on first use, once even when threads race for it (a webhook worker's pool)."""

    _lock = threading.RLock()

    @classmethod
    def reset_lock(cls) -> None:
        """In a forked child: a new lock (a parent thread building a resource at the fork
        would have left it held for ever; workers/forkguard.py)."""
        cls._lock = threading.RLock()

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        with self._lock:
            return super().__get__(instance, owner)


class Services:
    """The base root. A process's own root type adds what only it holds: the API's
    (app/web/services.py), a GPU worker's (workers/runtime.py), a webhook worker's
    (app/webhooks/worker.py), the relay's (app/housekeeping/relay.py)."""

    def __init__(
        self,
        settings: Settings,
        *,
        db_pool_size: int | None = None,
        publish_pause: float = 0.0,
        **opened,
    ) -> None:
        """`opened`: resources already built (`catalog`, `celery`, `db`, `storage`, ...)
        that this root uses instead of opening its own (None: open on first use)."""
        self.settings = settings
        self._db_pool_size = db_pool_size
        self._publish_pause = publish_pause
        for name, value in opened.items():
            if not isinstance(getattr(type(self), name, None), resource):
                raise TypeError(f"{type(self).__name__} has no resource {name!r}")
            if value is not None:
                self.__dict__[name] = value

    @resource
    def catalog(self) -> Catalog:
        return load_catalog(self.settings)

    # How long the database lets this process hold a transaction without a statement
    # (None: no limit). A root whose process may freeze mid-transaction sets it.
    idle_transaction_seconds: float | None = None

    @resource
    def db(self) -> Database:
        settings = self.settings
        options = {"idle_transaction_seconds": self.idle_transaction_seconds}
        if self._db_pool_size is not None:
            options["pool_size"] = self._db_pool_size
        db = Database(
            settings.database_url,
            pooled=settings.database_pooled,
            listen_url=settings.database_listen_url,
            **options,
        )
        if settings.database_pooled:
            warn_if_unbounded(db)
        return db

    @resource
    def storage(self) -> Storage:
        return open_storage(self.settings)

    @resource
    def broker(self) -> Broker:
        """The broker backend the broker URL's scheme names (app/broker/backend.py)."""
        return broker_for(self.settings)

    @resource
    def celery(self):
        """The Celery app passed in (tasks/ gives a worker's), or a publishing one."""
        from app.broker.celery import create_celery

        return create_celery(lambda: self)

    @resource
    def publisher(self) -> Publisher:
        return Publisher(
            self.catalog,
            broker=self.broker,
            celery_app=self.celery,
            timeout=self.settings.publish_timeout,
            pause_after_failure=self._publish_pause,
        )

    def opened(self, name: str) -> bool:
        """Whether a resource (`db`, `storage`, ...) has been built yet."""
        return name in self.__dict__

    def derive(self, cls: type[S] | None = None, **options) -> S:
        """A root for a forked child (of type `cls`, this one's by default): the same
        settings, catalog and Celery app, its own connections."""
        if self.opened("celery"):
            options.setdefault("celery", self.celery)
        return (cls or type(self))(self.settings, catalog=self.catalog, **options)

    def close(self) -> None:
        if self.opened("db"):
            self.db.dispose()


_root: Services | None = None


def root(**options) -> Services:
    """This process's root, built (and its settings read) on the first call; `options`
    (the Celery app, the pool size) count only on that first call."""
    global _root
    if _root is None:
        _root = Services(load_settings(), **options)
    return _root


def reset() -> None:
    """Close and forget this process's root (a CLI run in a process that outlives it)."""
    global _root
    if _root is not None:
        _root.close()
    _root = None


def install(services: Services) -> Services:
    """Make `services` this process's root (a forked child, a test)."""
    global _root
    _root = services
    return services
