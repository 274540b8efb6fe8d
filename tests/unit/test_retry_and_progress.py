"""Upload retries with jittered backoff, and progress throttling."""

from __future__ import annotations

import random
import threading
import time

import pytest

from app.storage.base import StorageError, StorageUnavailable
from app.storage.retry import backoff_delays, outage_budget, put_with_retry
from workers.progress import ProgressReporter


class FlakyStore:
    def __init__(self, failures: int, transient: bool = True) -> None:
        self.failures = failures
        self.transient = transient
        self.calls = 0
        self.stored: dict[str, bytes] = {}

    def put(self, key, data, content_type):
        self.calls += 1
        if self.calls <= self.failures:
            raise StorageError("boom", transient=self.transient)
        self.stored[key] = data


def test_backoff_is_jittered_exponential_with_a_guaranteed_span():
    for seed in range(20):
        delays = list(backoff_delays(6, base=0.5, cap=4.0, rng=random.Random(seed)))
        assert len(delays) == 6
        for attempt, delay in enumerate(delays):
            step = min(4.0, 0.5 * 2**attempt)
            assert step / 2 <= delay <= step
        assert sum(delays) >= outage_budget(6, 0.5, 4.0) == 7.75
    assert len({round(d, 6) for d in backoff_delays(6, 0.5, 4.0)}) == 6  # jittered


def test_transient_failures_are_retried_until_success():
    store, slept = FlakyStore(failures=3), []
    retries = put_with_retry(
        store, "k", b"v", "image/png", retries=5, backoff=0.1, backoff_max=1, sleep=slept.append
    )
    assert retries == 3 and store.stored == {"k": b"v"} and len(slept) == 3


def test_retries_are_bounded():
    store = FlakyStore(failures=100)
    with pytest.raises(StorageUnavailable, match="after 4 attempt"):
        put_with_retry(
            store,
            "k",
            b"v",
            "image/png",
            retries=3,
            backoff=0.1,
            backoff_max=1,
            sleep=lambda _: None,
        )
    assert store.calls == 4


def test_permanent_failures_are_not_retried():
    store = FlakyStore(failures=1, transient=False)
    with pytest.raises(StorageUnavailable):
        put_with_retry(
            store,
            "k",
            b"v",
            "image/png",
            retries=5,
            backoff=0.1,
            backoff_max=1,
            sleep=lambda _: None,
        )
    assert store.calls == 1


def test_steps_never_wait_for_a_slow_database():
    """Every step returns while a write is held inside the database (an event holds it,
    not a clock: a step that waited for the write would end only after the write did)."""
    written = []
    inside, release, finished = threading.Event(), threading.Event(), threading.Event()

    def held_write(progress):
        inside.set()
        release.wait(30)
        written.append(progress)
        finished.set()
        return True

    reporter = ProgressReporter(held_write, interval=0.05)
    assert reporter.step(1, 20)
    assert inside.wait(10), "the writer thread never wrote"
    for step in range(2, 21):
        assert reporter.step(step, 20)
    write_still_held = not finished.is_set()
    release.set()
    reporter.stage("uploading", 20, 20)
    assert write_still_held  # 19 steps went by while the first write was held
    assert written[-1]["stage"] == "uploading"  # a stage is never overtaken by a step


def test_steps_are_throttled_and_the_last_one_is_written():
    written = []
    reporter = ProgressReporter(lambda p: written.append(p) or True, interval=0.1)
    reporter.stage("encoding_prompt", 0, 20)
    started = time.monotonic()
    for step in range(1, 21):
        reporter.step(step, 20)
        time.sleep(0.025)  # 20 steps over half a second, or longer on a loaded machine
    elapsed = time.monotonic() - started
    # The writer flushes the newest step after its rest (a stage write would drop it).
    deadline = time.monotonic() + 5
    while (not written or written[-1]["step"] != 20) and time.monotonic() < deadline:
        time.sleep(0.01)
    reporter.stage("uploading", 20, 20)
    stages = [p["stage"] for p in written]
    steps = [p["step"] for p in written if p["stage"] in ("denoising", "decoding")]
    assert stages[0] == "encoding_prompt" and stages[-1] == "uploading"
    # At most one write per 0.1 s rest however long the steps took (one per step
    # unthrottled), plus the first step's and the last's after the loop.
    assert len(steps) <= elapsed / 0.1 + 2, (len(steps), elapsed)
    assert steps == sorted(steps) and steps[-1] == 20


def test_the_first_stage_is_written_beside_the_run_not_before_it():
    written = []
    owner = [True]

    def slow_write(progress):
        time.sleep(0.2)  # a database round trip under load
        written.append(progress)
        return owner[0]

    reporter = ProgressReporter(slow_write, interval=0.0)
    started = time.perf_counter()
    assert reporter.begin("encoding_prompt", 0, 4) is True
    assert time.perf_counter() - started < 0.05  # the GPU does not wait for the write
    deadline = time.monotonic() + 5
    while not written and time.monotonic() < deadline:
        time.sleep(0.01)
    assert written[0]["stage"] == "encoding_prompt"
    reporter.stage("uploading", 4, 4)
    assert written[-1]["stage"] == "uploading"
    # A first write that finds the job lost stops the run at its first step.
    owner[0] = False
    lost = ProgressReporter(slow_write, interval=0.0)
    assert lost.begin("encoding_prompt", 0, 4) is True
    deadline = time.monotonic() + 5
    while lost.owner and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lost.step(1, 4) is False
    stop = threading.Event()
    stop.set()
    assert ProgressReporter(slow_write, interval=0.0, stop=stop).begin("encoding_prompt") is False


def test_a_lost_claim_or_a_cancel_stops_the_run_at_the_next_step():
    reporter = ProgressReporter(lambda _p: False, interval=0.0)
    assert reporter.stage("encoding_prompt") is False
    assert reporter.step(1, 4) is False

    stop = threading.Event()
    reporter = ProgressReporter(lambda _p: True, interval=10.0, stop=stop)
    assert reporter.step(1, 4) is True
    stop.set()
    assert reporter.step(2, 4) is False and reporter.last_step == 2
    reporter.close()


def test_two_threads_closing_the_reporter_never_join_its_writer_together():
    """The post-processing thread closes a job's reporter (its "uploading" stage) while
    the task's thread closes it at the end of the run. Two threads joining one thread at
    once race inside CPython 3.11's `Thread.join`: the first releases the exiting
    thread's lock and asserts it is free while the second has just taken it
    (`AssertionError`, and `RuntimeError: release unlocked lock` in the other). That
    failed a job's post-processing and let its lease lapse, so the job ran twice (seen in
    N7 under load). The window inside CPython cannot be held open from here; what the fix
    guarantees can: however many threads close at once, one joins at a time. The writer
    here is a stand-in whose join takes 50 ms and counts who is inside."""
    inside, most = [0], [0]
    lock = threading.Lock()

    class Writer:
        def join(self, timeout=None):
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.05)
            with lock:
                inside[0] -= 1

    reporter = ProgressReporter(lambda _progress: True, interval=0)
    reporter._thread = Writer()
    start = threading.Barrier(3)

    def close():
        start.wait()
        reporter.close()

    closers = [threading.Thread(target=close) for _ in range(3)]
    for thread in closers:
        thread.start()
    for thread in closers:
        thread.join(10)
    assert most[0] == 1
