"""Job-change notifications: a progress write's carries the progress (app/jobs/notify.py),
and a stream sends it on only while nothing else changed (app/web/watch.py)."""

from __future__ import annotations

import uuid

from app.jobs.notify import MAX_PAYLOAD_BYTES, job_changed_payload, parse_job_changed
from app.web.watch import Carried, Subscription

JOB = uuid.UUID("01a2270a-2bb9-71bf-b1b7-5eb154b34fd0")
PROGRESS = {"stage": "denoising", "step": 3, "total_steps": 20, "percent": 15.0}


def test_a_progress_write_carries_its_version_and_progress():
    payload = job_changed_payload(JOB, "gpu.tiny", False, version=7, progress=PROGRESS)
    change = parse_job_changed(payload)
    assert change is not None
    assert (change.job_id, change.queue, change.order_changed) == (JOB, "gpu.tiny", False)
    assert (change.version, change.progress) == (7, PROGRESS)


def test_a_change_that_moves_the_queue_carries_nothing():
    payload = job_changed_payload(JOB, "gpu.tiny", True, version=7, progress=PROGRESS)
    assert payload == f"{JOB} gpu.tiny order"
    change = parse_job_changed(payload)
    assert change.order_changed and change.version is None and change.progress is None


def test_an_older_workers_payload_still_parses_without_the_carried_fields():
    change = parse_job_changed(f"{JOB} gpu.tiny progress")
    assert change is not None and not change.order_changed
    assert change.version is None and change.progress is None


def test_a_progress_too_large_for_postgresql_is_not_carried():
    big = {"stage": "denoising", "note": "x" * MAX_PAYLOAD_BYTES}
    payload = job_changed_payload(JOB, "gpu.tiny", False, version=7, progress=big)
    assert payload == f"{JOB} gpu.tiny progress"


def test_foreign_and_broken_payloads_are_refused_or_read_plainly():
    assert parse_job_changed("hello") is None
    assert parse_job_changed(f"{JOB} gpu.tiny order extra") is None
    broken = parse_job_changed(f"{JOB} gpu.tiny progress seven {{}}")
    assert broken is not None and broken.progress is None  # read from the row instead
    listed = parse_job_changed(f"{JOB} gpu.tiny progress 7 [1,2]")
    assert listed is not None and listed.progress is None


class _Watcher:
    def _follow_queue(self, sub, queue):
        pass

    def _remove(self, sub):
        pass


def _woken(*changes) -> Subscription:
    sub = Subscription(_Watcher(), JOB)
    for change in changes:
        sub.wake(own=True, carried=change)
    assert sub.wait(0) == "job"
    return sub


def test_carried_progress_is_sent_without_reading_the_newest_first():
    later = Carried(7, "running", {**PROGRESS, "step": 4})
    assert _woken(Carried(6, "running", PROGRESS), later).carried() == later
    # A poll's state may arrive after a newer notification's: the newest counts.
    assert _woken(later, Carried(6, "running", PROGRESS)).carried() == later


def test_any_change_that_came_without_its_state_means_reading_the_row():
    assert _woken(Carried(6, "running", PROGRESS), None).carried() is None
    assert _woken(None).carried() is None  # a change of status, or a reconnect
    sub = Subscription(_Watcher(), JOB)
    sub.wake(own=False)  # only its queue moved
    assert sub.wait(0) == "queue" and sub.carried() is None
    assert sub.wait(0) is None and sub.carried() is None  # a timeout


def test_a_change_after_the_wait_is_kept_for_the_next():
    first, second = Carried(6, "running", PROGRESS), Carried(7, "running", PROGRESS)
    sub = _woken(first)
    sub.wake(own=True, carried=second)
    assert sub.carried() == first  # what the first wait took
    assert sub.wait(0) == "job" and sub.carried() == second
