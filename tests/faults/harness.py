"""Fault scenarios' bookkeeping: what was accepted, what became of it, what was duplicated."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests
from sqlalchemy import func, select

from testbed.jobs import auth

TERMINAL = {"succeeded", "failed", "canceled"}
TERMINAL_EVENTS = ("job.succeeded", "job.failed", "job.canceled")
REPORT: list[Figures] = []

# The faults each scenario must inject, or it fails (`Scenario.report` asserts it). A run
# in which every scenario passes has injected at least their sum: the README's count.
FLOORS = {
    "F1": 50,  # kill -9 of a pool process mid-generation
    "F2": 3,  # kill -9 of a whole worker
    "F3": 4,  # SIGTERM rolling restarts
    "F4": 1,  # broker stopped and restarted
    "F7": 3,  # a poison job's crashes (the attempt cap)
    "F8": 10,  # PostgreSQL restarts
    "F9": 1,  # uploads refused while S3 is down (about 10 a run)
    "F12": 3,  # killed after recording, before acking
    "F13": 4,  # jobs over their time limit
    "F14": 220,  # database connections cut
    "F15": 1,  # broker kill -9, nothing to publish again
    "F16": 1,  # broker kill -9 under submits
    "F17": 1,  # kill -9 mid-batch
    "F17b": 1,  # a job canceled mid-batch
    "F18": 4,  # kill -9 mid-job of image-to-image and inpainting jobs (uploaded inputs)
    "F19": 5,  # a batch through 4 kill -9 and a broker restart
    "F20": 1,  # a job's message stranded with a consumer that does nothing with it
    "F21": 3,  # kill -9 of a pool process mid-clip (video)
    "F22": 1,  # a delivery held past RabbitMQ's consumer_timeout
    "F23": 1,  # a spot notice (SIGTERM) mid-clip: checkpointed, handed back, resumed
    "F24": 1,  # a job longer than consumer_timeout, handed back before it (each a delivery)
}


def stored_objects(stored_input: dict) -> int:
    """The objects a succeeded job stores: one per image; a clip, its MP4 and its poster
    (workers/store.py)."""
    if stored_input.get("kind") in ("txt2vid", "img2vid"):
        return 2
    return stored_input.get("num_images", 1)


def floor_of(scenario: str) -> int:
    """The floor of a scenario named "F1 …"; 0 for the control run and the soak."""
    return FLOORS.get(scenario.split(" ", 1)[0], 0)


@dataclass
class Figures:
    scenario: str
    faults: int = 0
    submitted: int = 0
    refused: int = 0  # answered non-202: never accepted, so never owed a result
    succeeded: int = 0
    failed: Counter = field(default_factory=Counter)
    lost: int = 0
    duplicate_results: int = 0
    duplicate_generations: int = 0
    # What a client sees: terminal state changes recorded in PostgreSQL (one webhook
    # event each) and `job.succeeded` deliveries received (distinct webhook-ids).
    duplicate_terminal: int = 0
    duplicate_deliveries: int = 0
    undelivered: int = 0
    recovery_seconds: list[float] = field(default_factory=list)
    notes: str = ""

    def plain(self) -> dict:
        """The figures as plain data (a worker process hands them to the controller)."""
        return {**asdict(self), "failed": dict(self.failed)}

    @classmethod
    def from_plain(cls, data: dict) -> Figures:
        return cls(**{**data, "failed": Counter(data["failed"])})

    def line(self) -> str:
        failed = ",".join(f"{code}={n}" for code, n in sorted(self.failed.items())) or "0"
        recovery = (
            "/".join(f"{r:.1f}" for r in self.recovery_seconds) if self.recovery_seconds else "-"
        )
        return (
            f"{self.scenario:<34} faults={self.faults:<3} submitted={self.submitted:<3} "
            f"refused={self.refused:<2} succeeded={self.succeeded:<3} failed={failed:<22} "
            f"lost={self.lost} dup_results={self.duplicate_results} "
            f"dup_generations={self.duplicate_generations} "
            f"dup_terminal={self.duplicate_terminal} dup_delivered={self.duplicate_deliveries} "
            f"undelivered={self.undelivered} recovery_s={recovery}"
            + (f"  ({self.notes})" if self.notes else "")
        )


class Scenario:
    """Submits over HTTP as one tenant, then settles and counts."""

    def __init__(self, name: str, stack, key: str, api_url: str | None = None) -> None:
        self.figures = Figures(name)
        self.stack = stack
        self.key = key
        self.api_url = api_url or stack.api.url  # another API process's, say
        self.accepted: list[str] = []
        self._lock = threading.Lock()

    def submit(self, **body) -> str | None:
        if self.stack.receiver is not None:
            body.setdefault("webhook", f"{self.stack.receiver.url}/jobs")
        try:
            response = requests.post(
                f"{self.api_url}/v1/jobs", json=body, headers=auth(self.key), timeout=30
            )
        except requests.RequestException:
            response = None
        with self._lock:
            self.figures.submitted += 1
            if response is None or response.status_code != 202:
                self.figures.refused += 1
                return None
            job_id = response.json()["id"]
            self.accepted.append(job_id)
            return job_id

    def rows(self, job_ids=None) -> dict[str, object]:
        from app.db.models.jobs import Job

        ids = [uuid.UUID(j) for j in (job_ids or self.accepted)]
        with self.stack.db.session() as session:
            return {str(j.id): j for j in session.scalars(select(Job).where(Job.id.in_(ids)))}

    def row(self, job_id: str):
        return self.rows([job_id]).get(job_id)

    def settle(self, timeout: float = 120.0, most: float = 2.0) -> dict[str, object]:
        """Wait until every accepted job is terminal. `timeout` bounds a stall, not the
        wait: it goes on while any job moves (its status, stage or step changes; a running
        job writes its step every DIFFQ_PROGRESS_INTERVAL), up to `most` x `timeout` in
        all. A machine under load slows a scenario without failing it; a job that is stuck
        (lost, or never delivered) still ends the wait `timeout` after the last move."""
        started = last_move = time.monotonic()
        seen = None
        while True:
            rows = self.rows()
            if all(row.status.value in TERMINAL for row in rows.values()):
                return rows
            state = {
                job_id: (
                    row.status,
                    (row.progress or {}).get("stage"),
                    (row.progress or {}).get("step"),
                )
                for job_id, row in rows.items()
            }
            now = time.monotonic()
            if state != seen:
                seen, last_move = state, now
            if now - last_move > timeout or now - started > most * timeout:
                return rows
            time.sleep(0.25)

    def terminal_events(self) -> Counter:
        """Terminal state changes per job, as PostgreSQL recorded them."""
        from app.db.models.webhooks import WebhookEvent

        ids = [uuid.UUID(j) for j in self.accepted]
        with self.stack.db.session() as session:
            found = session.execute(
                select(WebhookEvent.job_id, func.count())
                .where(WebhookEvent.job_id.in_(ids), WebhookEvent.type.in_(TERMINAL_EVENTS))
                .group_by(WebhookEvent.job_id)
            ).all()
        return Counter({str(job_id): n for job_id, n in found})

    def delivered_successes(self, timeout: float = 90.0) -> dict[str, set[str]]:
        """Distinct webhook-ids of `job.succeeded` answered 200, per job; waits until every
        succeeded job has one (or the time is up)."""
        wanted = {j for j, row in self.rows().items() if row.status.value == "succeeded"}
        if self.stack.relay is None:  # nothing dispatches webhook events: count what came
            timeout = 0.0
        deadline = time.monotonic() + timeout
        while True:
            seen: dict[str, set[str]] = {}
            for received in self.stack.receiver.requests():
                body = json.loads(received.body)
                job_id = body["data"]["id"]
                if body["type"] == "job.succeeded" and received.answered == 200:
                    seen.setdefault(job_id, set()).add(received.headers["webhook-id"])
            if wanted <= set(seen) or time.monotonic() > deadline:
                return seen
            time.sleep(0.5)

    def count(self, rows: dict[str, object]) -> Figures:
        fig = self.figures
        watched = self.stack.receiver is not None
        terminal = self.terminal_events() if watched else Counter()
        delivered = self.delivered_successes() if watched else {}
        logs = "".join(p.read_text(errors="replace") for p in self.stack.worker_logs())
        claims = Counter(re.findall(r"job (\S+) claimed \(attempt", logs))
        successes = Counter(re.findall(r"job (\S+) succeeded in", logs))
        for job_id in self.accepted:
            row = rows.get(job_id)
            status = row.status.value if row is not None else "missing"
            seen_twice = watched and status in TERMINAL and terminal[job_id] != 1
            fig.duplicate_terminal += seen_twice
            if status == "succeeded":
                fig.succeeded += 1
                objects = self.stack.objects_of(row)
                deliveries = len(delivered.get(job_id, ())) if watched else 1
                fig.duplicate_deliveries += deliveries > 1
                fig.undelivered += deliveries == 0
                if (
                    successes[job_id] > 1
                    or len(objects) != stored_objects(row.input)
                    or seen_twice
                    or deliveries > 1
                ):
                    fig.duplicate_results += 1
            elif status in ("failed", "canceled"):
                fig.failed[row.error_code] += 1
            else:
                fig.lost += 1
                print(describe_lost(row, job_id, logs))
            fig.duplicate_generations += max(0, claims[job_id] - 1)
        return fig

    def report(self, rows: dict[str, object]) -> Figures:
        fig = self.count(rows)
        REPORT.append(fig)
        print("\n" + fig.line())
        floor = floor_of(fig.scenario)
        assert fig.faults >= floor, (
            f"{fig.scenario}: {fig.faults} faults, under its floor of {floor}; the run's count "
            "(docs/reliability.md) rests on every floor"
        )
        return fig


def describe_lost(row, job_id: str, logs: str) -> str:
    """What a lost job's row and the workers' logs say of it: where to start looking."""
    if row is None:
        state = "no row"
    else:
        state = ", ".join(
            f"{name}={getattr(row, name)}"
            for name in (
                "status", "attempts", "lease_owner", "lease_expires_at", "published_at",
                "permit_id", "started_at", "updated_at",
            )
        )  # fmt: skip
    lines = [line for line in logs.splitlines() if job_id in line][-12:]
    return "\n".join([f"LOST {job_id}: {state}", *(f"  {line}" for line in lines)])


def describe_claims(job_ids, logs: str, but: tuple[str, ...] = ()) -> str:
    """The workers' lines about each of `job_ids` claimed more than once (but `but`):
    which deliveries ran it, and why each took it."""
    claims = Counter(re.findall(r"job (\S+) claimed \(attempt", logs))
    out = []
    for job_id in job_ids:
        if claims[job_id] > 1 and job_id not in but:
            lines = [line for line in logs.splitlines() if job_id in line][-16:]
            out += [f"CLAIMED {claims[job_id]}x {job_id}", *(f"  {line}" for line in lines)]
    return "\n".join(out)


def write_report(path: Path) -> None:
    lines = [fig.line() for fig in REPORT]
    totals = Figures("TOTAL (without the control)")
    for fig in REPORT:
        if fig.scenario.startswith("control"):
            continue
        totals.faults += fig.faults
        totals.submitted += fig.submitted
        totals.refused += fig.refused
        totals.succeeded += fig.succeeded
        totals.failed.update(fig.failed)
        totals.lost += fig.lost
        totals.duplicate_results += fig.duplicate_results
        totals.duplicate_generations += fig.duplicate_generations
        totals.duplicate_terminal += fig.duplicate_terminal
        totals.duplicate_deliveries += fig.duplicate_deliveries
        totals.undelivered += fig.undelivered
    lines.append(totals.line())
    ran = {fig.scenario.split(" ", 1)[0] for fig in REPORT}
    short = [
        f"{fig.scenario.split(' ', 1)[0]} {fig.faults}/{floor_of(fig.scenario)}"
        for fig in REPORT
        if fig.faults < floor_of(fig.scenario)
    ]
    missing = sorted(set(FLOORS) - ran, key=lambda n: (int(re.sub(r"\D", "", n)), n))
    lines.append(
        f"faults {totals.faults} (floors: {sum(FLOORS.values())} over {len(FLOORS)} scenarios); "
        f"under their floor: {', '.join(short) or 'none'}; not run: {', '.join(missing) or 'none'}"
    )
    path.write_text("\n".join(lines) + "\n")


class SteadyLoad:
    """Submits a job every `period` seconds until stopped."""

    def __init__(self, sc: Scenario, period: float, **body) -> None:
        self.sc, self.period, self.body = sc, period, body
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sc.submit(**self.body)
            self.latencies.append(time.monotonic() - started)
            self._stop.wait(self.period)

    def __enter__(self) -> SteadyLoad:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()
