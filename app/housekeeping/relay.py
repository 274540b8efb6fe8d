"""The relay (`diffq relay`): its root, and its pass, every housekeeping step once, in an
order where each sees the last's work (a job reaped here is republished by the outbox
step of the same pass)."""

from __future__ import annotations

from app.broker.publish import Publisher
from app.catalog import Catalog
from app.config import Settings
from app.db.session import Database
from app.housekeeping.admission import forget_windows, release_held
from app.housekeeping.aging import promote_starving
from app.housekeeping.batches import batches_pass
from app.housekeeping.deadlines import cancel_expired
from app.housekeeping.leases import reap_lost_jobs
from app.housekeeping.outbox import dispatch_webhooks, publish_unpublished
from app.housekeeping.preemption import preempt_for_urgent
from app.housekeeping.purge import purge_finished_jobs
from app.housekeeping.retention import (
    remove_expired_results,
    remove_left_checkpoints,
    remove_unused_inputs,
)
from app.services import Services
from app.storage import Storage


def relay_pass(
    db: Database,
    publisher: Publisher,
    settings: Settings,
    storage: Storage | None = None,
    catalog: Catalog | None = None,
) -> None:
    reap_lost_jobs(db, max_attempts=settings.max_attempts, restart_grace=settings.lease_seconds)
    release_held(db, publisher, cap=settings.max_running)
    forget_windows(db)
    if storage is not None:
        remove_expired_results(db, storage, retention_seconds=settings.result_retention)
        remove_unused_inputs(db, storage, retention_seconds=settings.result_retention)
        remove_left_checkpoints(db, storage)
    purge_finished_jobs(db, retention_seconds=settings.job_retention)
    publish_unpublished(db, publisher, older_than_seconds=settings.relay_after)
    cancel_expired(db)
    promote_starving(db, publisher, aging_seconds=settings.priority_aging)
    if catalog is not None:
        preempt_for_urgent(
            db,
            catalog,
            after_seconds=settings.preempt_after,
            min_left_seconds=settings.preempt_min_left,
            max_preemptions=settings.max_preemptions,
        )
    # Before dispatch: their webhooks.
    batches_pass(db, job_retention=settings.job_retention, discard=publisher.broker.discard)
    # A delivery worker that vanished holds its event for twice its timeout and a margin.
    dispatch_webhooks(db, publisher, lease_seconds=settings.webhook_timeout * 2 + 30)


class Relay(Services):
    """The relay's root: app/services.py's (database, publisher, store), one pass at a time."""

    def run_pass(self) -> None:
        relay_pass(self.db, self.publisher, self.settings, self.storage, self.catalog)
