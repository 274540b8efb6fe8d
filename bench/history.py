"""Jobs history at volume: submit, list, the fair-share choice and the relay's passes on a
jobs table of --rows rows, against the same calls on a table with no history; and how
fast job retention deletes finished rows, against the rate jobs arrive.

    .venv/bin/python -m bench.history [--rows 10000000] [--tenants 1000] [--days 30]
        [--repeat 200] [--arrival 500] [--compare-fix]

Runs on a private PostgreSQL (testbed/private_postgres.py) migrated to head. The history
is generated server-side (INSERT ... SELECT FROM generate_series), in time order as a
real table fills: ids are UUIDv7 of their creation time, mostly terminal jobs (90%
succeeded, 7% failed, 3% canceled) spread over --days, tenants skewed (the largest has
about a tenth of the rows), five models each with its queue, images of succeeded jobs
older than --result-days removed (`data_removed_at`), every column the application
writes filled as its transitions fill it. The live set (--queued queued and --running
running jobs, published, leases valid) and --recent jobs finished in the last ten
minutes (what fair share's window reads) are the same in every phase and made fresh
before each, so that every relay pass measures its queries with nothing due.

Every figure calls the application's own functions: `submit_job` (the broker replaced by
a stub that confirms at once, so the figure is the database's part), `service.list_jobs`
(the first page of the largest tenant, a page in the middle of its history, and its
failed jobs), `fairness.choose` for a queued job's message, each function
`relay_pass` calls (timed one by one; `reap_lost_jobs` without its restart grace, so its
scan runs) and `relay_pass` whole. Retention: `purge_finished_jobs` passes on the loaded
table with the job retention set one day short of the history, its rate against
--arrival jobs/s with the relay's 2 s interval between passes.

`--compare-fix` measures the loaded table a second time without the indexes of migration
0019 (FIX_INDEXES), which are then put back, for the before/after in one run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2

from bench.report import percentile, print_table

# (model, queue, share of jobs)
MODELS = (
    ("sdxl", "gpu.sdxl", 0.40),
    ("sd15", "gpu.sd15", 0.25),
    ("flux", "gpu.flux", 0.20),
    ("sd3", "gpu.sd3", 0.10),
    ("wan", "gpu.wan", 0.05),
)
# Migration 0019's indexes, for --compare-fix (the model declares them too).
FIX_INDEXES = ("ix_jobs_checkpointed", "ix_jobs_deadline", "ix_jobs_waiting")
RELAY_INTERVAL = 2.0  # `diffq relay --interval`'s default
LIST_LIMIT = 20  # GET /v1/jobs's default page


# ---------------------------------------------------------------------------- the data


def _request_json(model: str) -> str:
    """A stored request as the API stores it (JobRequest.stored()), as JSON."""
    import json

    from app.kinds import request_from_stored

    params = {
        "prompt": "a lighthouse on a cliff at dusk, oil painting",
        "negative_prompt": None,
        "model": model,
        "width": 1024,
        "height": 1024,
        "steps": 30,
        "guidance_scale": 7.5,
        "seed": 0,
        "num_images": 1,
        "scheduler": "default",
        "output_format": "png",
        "priority": "normal",
    }
    return json.dumps(request_from_stored(params).stored())


def _models_sql() -> str:
    """A VALUES list of (i, model, queue, input template, [lo, hi) of its share)."""
    rows, upto = [], 0.0
    for i, (model, queue, share) in enumerate(MODELS):
        template = _request_json(model).replace("'", "''")
        hi = 2.0 if i == len(MODELS) - 1 else upto + share
        rows.append(f"({i}, '{model}', '{queue}', '{template}'::jsonb, {upto}, {hi})")
        upto += share
    return "VALUES " + ", ".join(rows)


# The id: UUIDv7 of `t` (48-bit milliseconds, version 7, random rest, RFC 9562 variant).
UUID7 = (
    "(lpad(to_hex(floor(extract(epoch FROM {t}) * 1000)::bigint), 12, '0') || '7'"
    " || substr(md5(random()::text), 1, 3)"
    " || (ARRAY['8', '9', 'a', 'b'])[1 + floor(random() * 4)::int]"
    " || substr(md5(random()::text), 1, 15))::uuid"
)

COLUMNS = (
    "id, tenant_id, status, model, queue, priority, publish_priority, input, work_units,"
    " metadata, progress, attempts, version, result, error_code, error_message, created_at,"
    " updated_at, started_at, finished_at, deadline_at, idempotency_key, request_hash,"
    " published_at, lease_owner, lease_expires_at, webhook_url, webhook_events,"
    " data_removed_at, admitted_at, gpu_seconds, device, permit_id, cache_key, cached_from,"
    " replay_of, manifest, batch_id, custom_id, adapter_set, warm_skips, requeues,"
    " checkpoint_step, yield_reason, preemptions, spent_seconds"
)

# One row per g of generate_series(first, last), created in time order over
# [start, start + span]; `s` is the status draw, `m` the model, `tn` the tenant.
HISTORY = """
WITH tenants AS (SELECT array_agg(id ORDER BY name) AS ids FROM tenants),
models (i, model, queue, template, lo, hi) AS ({models})
INSERT INTO jobs ({columns})
SELECT {uuid7}, tenants.ids[1 + floor(%(tenants)s * power(r.tn, 3))::int],
  CASE WHEN r.s < 0.90 THEN 'succeeded' WHEN r.s < 0.97 THEN 'failed' ELSE 'canceled' END,
  m.model, m.queue,
  CASE WHEN r.p < 0.10 THEN 'low' WHEN r.p < 0.95 THEN 'normal' ELSE 'high' END,
  CASE WHEN r.p < 0.10 THEN 1 WHEN r.p < 0.95 THEN 5 ELSE 9 END,
  m.template || jsonb_build_object('prompt', 'history job ' || r.g, 'seed', r.g),
  30, NULL,
  CASE WHEN r.s < 0.90 THEN '{{"stage": "done", "step": 30, "total_steps": 30, "percent": 100.0}}'
       WHEN r.never THEN '{{"stage": "queued", "step": 0, "total_steps": 30, "percent": 0.0}}'
       ELSE '{{"stage": "denoising", "step": 12, "total_steps": 30, "percent": 40.0}}' END::jsonb,
  CASE WHEN r.never THEN 0 ELSE 1 END, CASE WHEN r.never THEN 2 ELSE 5 END,
  CASE WHEN r.s < 0.90 AND r.finished >= %(images_since)s THEN jsonb_build_object('images',
    jsonb_build_array(jsonb_build_object('key', 'results/' || r.g || '/0.png',
      'content_type', 'image/png', 'bytes', 1500000, 'sha256', md5(r.g::text) || md5(r.g::text))))
  END,
  CASE WHEN r.s < 0.90 THEN NULL WHEN r.s < 0.97 THEN
    (ARRAY['gpu_oom', 'timeout', 'internal_error', 'content_filtered'])[1 + (r.g %% 4)]
    ELSE 'canceled' END,
  CASE WHEN r.s < 0.90 THEN NULL WHEN r.s < 0.97 THEN 'the run failed'
    ELSE 'canceled by the client' END,
  r.created,
  CASE WHEN r.s < 0.90 AND r.finished < %(images_since)s
    THEN r.finished + %(result_days)s * interval '1 day' ELSE r.finished END,
  CASE WHEN r.never THEN NULL ELSE r.started END, r.finished,
  NULL, NULL, NULL,
  r.created + interval '15 milliseconds', NULL, NULL, NULL, NULL,
  CASE WHEN r.s < 0.90 AND r.finished < %(images_since)s
    THEN r.finished + %(result_days)s * interval '1 day' END,
  r.created,
  CASE WHEN r.never THEN NULL ELSE extract(epoch FROM r.finished - r.started) * 0.95 END,
  CASE WHEN r.never THEN NULL ELSE 'NVIDIA H100 80GB HBM3' END,
  NULL, NULL, NULL, NULL,
  CASE WHEN r.s < 0.90 THEN jsonb_build_object('weights_digest', md5(m.model), 'seed', r.g) END,
  NULL, NULL, '', 0, 0, NULL, NULL, 0, 0
FROM (
  SELECT d.*, d.s >= 0.985 AS never, d.created + d.wait AS started,
    d.created + CASE WHEN d.s >= 0.985 THEN interval '30 seconds' ELSE d.wait + d.run END
      AS finished
  FROM (
    SELECT g, random() AS s, random() AS p, random() AS tn, random() AS mi,
      %(start)s::timestamptz + %(span)s * ((g - 1 + random()) / %(total)s) * interval '1 second'
        AS created,
      random() * interval '5 seconds' AS wait,
      (2 + random() * 20) * interval '1 second' AS run
    FROM generate_series(%(first)s, %(last)s) AS g
  ) AS d
) AS r
CROSS JOIN tenants
JOIN models AS m ON r.mi >= m.lo AND r.mi < m.hi
"""

# The live set: queued jobs (published, admitted, waiting under a minute) and running
# ones (leases valid for an hour), created in the last minute.
LIVE = """
WITH tenants AS (SELECT array_agg(id ORDER BY name) AS ids FROM tenants),
models (i, model, queue, template, lo, hi) AS ({models})
INSERT INTO jobs ({columns})
SELECT {uuid7}, tenants.ids[1 + floor(%(tenants)s * power(r.tn, 3))::int],
  r.status, m.model, m.queue, 'normal', 5,
  m.template || jsonb_build_object('prompt', 'live job ' || r.g, 'seed', r.g),
  30, NULL,
  CASE WHEN r.status = 'queued'
    THEN '{{"stage": "queued", "step": 0, "total_steps": 30, "percent": 0.0}}'
    ELSE '{{"stage": "denoising", "step": 12, "total_steps": 30, "percent": 40.0}}' END::jsonb,
  CASE WHEN r.status = 'queued' THEN 0 ELSE 1 END, CASE WHEN r.status = 'queued' THEN 0 ELSE 3 END,
  NULL, NULL, NULL, r.created, r.created,
  CASE WHEN r.status = 'running' THEN r.created + interval '1 second' END,
  NULL, NULL, NULL, NULL,
  r.created + interval '15 milliseconds',
  CASE WHEN r.status = 'running' THEN 'worker-' || (r.g %% 1000) END,
  CASE WHEN r.status = 'running' THEN now() + interval '1 hour' END,
  NULL, NULL, NULL, r.created, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  '', 0, 0, NULL, NULL, 0, 0
FROM (
  SELECT g, CASE WHEN g <= %(queued)s THEN 'queued' ELSE 'running' END AS status,
    random() AS tn, random() AS mi,
    now() - interval '60 seconds' + g * (interval '50 seconds' / %(total)s) AS created
  FROM generate_series(1, %(total)s) AS g
) AS r
CROSS JOIN tenants
JOIN models AS m ON r.mi >= m.lo AND r.mi < m.hi
"""


def _history_sql() -> str:
    return HISTORY.format(models=_models_sql(), columns=COLUMNS, uuid7=UUID7.format(t="r.created"))


def _live_sql() -> str:
    return LIVE.format(models=_models_sql(), columns=COLUMNS, uuid7=UUID7.format(t="r.created"))


def _connect(url: str):
    conn = psycopg2.connect(url.replace("postgresql+psycopg2://", "postgresql://"))
    conn.autocommit = True
    return conn


def make_tenants(conn, tenants: int) -> None:
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO tenants (id, name, created_at, webhook_secret, weight)"
            " SELECT gen_random_uuid(), 'tenant-' || lpad(g::text, 6, '0'),"
            " now() - interval '400 days', 'whsec_' || md5(g::text), 1"
            " FROM generate_series(1, %s) AS g",
            (tenants,),
        )


# Ids from 20 minutes ago on (UUIDv7 order): the live set, the recent jobs, the submits.
RECENT_IDS = (
    "id > (lpad(to_hex(floor(extract(epoch FROM now() - interval '20 minutes') * 1000)"
    "::bigint), 12, '0') || '00000000000000000000')::uuid"
)


def refresh_live(conn, args) -> None:
    """The live set and the last ten minutes' finished jobs, made again (recent, so that
    no relay pass has work to do), and whatever the last phase submitted removed."""
    now = time.time()
    with conn.cursor() as cur:
        cur.execute(f"DELETE FROM jobs WHERE status IN ('queued', 'running') OR {RECENT_IDS}")
        cur.execute(
            _live_sql(),
            {"tenants": args.tenants, "queued": args.queued, "total": args.queued + args.running},
        )
        if args.recent:
            cur.execute(
                _history_sql(),
                {
                    "tenants": args.tenants,
                    "start": _ts(now - 600),
                    "span": 540,
                    "total": args.recent,
                    "first": 1,
                    "last": args.recent,
                    "images_since": _ts(now - 86400),
                    "result_days": args.result_days,
                },
            )
        cur.execute("ANALYZE jobs")


def job_indexes(conn) -> dict[str, str]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index AS i"
            " WHERE indrelid = 'jobs'::regclass"
            " AND NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conindid = i.indexrelid)"
        )
        return dict(cur.fetchall())


def load_history(conn, args, skip: tuple[str, ...] = ()) -> tuple[float, dict[str, str]]:
    """Insert --rows history rows without the secondary indexes, then build them (all but
    `skip`); returns the seconds it took and the indexes' definitions."""
    started = time.perf_counter()
    indexes = job_indexes(conn)
    now = time.time()
    span = args.days * 86400.0
    start = now - span - 3600  # the newest finished an hour ago
    images_since = now - args.result_days * 86400.0
    with conn.cursor() as cur:
        cur.execute("SET synchronous_commit = off")
        cur.execute("SET session_replication_role = replica")  # no FK trigger per row
        for name in indexes:
            cur.execute(f'DROP INDEX "{name}"')
        chunk = 1_000_000
        for first in range(1, args.rows + 1, chunk):
            last = min(args.rows, first + chunk - 1)
            cur.execute(
                _history_sql(),
                {
                    "tenants": args.tenants,
                    "start": _ts(start),
                    "span": span,
                    "total": args.rows,
                    "first": first,
                    "last": last,
                    "images_since": _ts(images_since),
                    "result_days": args.result_days,
                },
            )
            print(f"  {last:,} rows ({time.perf_counter() - started:.0f} s)", flush=True)
        cur.execute("SET session_replication_role = origin")
        cur.execute("SET maintenance_work_mem = '512MB'")
        for name, definition in indexes.items():
            if name not in skip:
                cur.execute(definition)
        cur.execute("VACUUM ANALYZE jobs")
    return time.perf_counter() - started, indexes


def _ts(epoch: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC).isoformat()


def sizes(conn) -> list[dict]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT 'jobs (heap + TOAST)', pg_table_size('jobs'), NULL UNION ALL"
            " SELECT indexrelid::regclass::text, pg_relation_size(indexrelid), NULL"
            " FROM pg_index WHERE indrelid = 'jobs'::regclass UNION ALL"
            " SELECT 'total', pg_total_relation_size('jobs'), NULL"
        )
        rows = cur.fetchall()
    return [{"relation": name, "MB": size / 2**20} for name, size, _ in rows]


# ------------------------------------------------------------------------- the stubs


class StubBroker:
    def discard(self, _ids) -> int:
        return 0


class StubPublisher:
    """A broker that confirms every publish at once: the figures are the database's."""

    broker = StubBroker()

    def publish(self, job, spec=None) -> bool:
        return True

    def publish_webhook(self, event_id) -> bool:
        return True


class StubStorage:
    def delete(self, key: str) -> None:
        pass


# ------------------------------------------------------------------------ the timings


@dataclass
class Probe:
    name: str
    call: Callable[[], object]
    samples: list[float] = field(default_factory=list)


def _catalog():
    from app.catalog import Catalog, ModelSpec

    specs = {m: ModelSpec(name=m, path=Path(f"/models/{m}"), queue=q) for m, q, _ in MODELS}
    return Catalog(specs, MODELS[0][0])


def probes(db, settings, args) -> list[Probe]:
    """The measured calls, each a closure over what it needs from the table as it is."""
    from sqlalchemy import func, select

    from app.db.models.jobs import Job
    from app.db.models.tenants import Tenant
    from app.db.types import utcnow
    from app.housekeeping import relay
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
    from app.jobs import fairness, service
    from app.jobs.states import JobStatus
    from app.jobs.submit import Caps, Submission, submit_job
    from app.kinds import job_request, request_from_stored

    publisher, storage, catalog = StubPublisher(), StubStorage(), _catalog()
    with db.session() as session:
        # The largest tenant (the skew gives the first the most rows), and the id in the
        # middle of its history.
        big = session.scalar(select(Tenant.id).where(Tenant.name == "tenant-000001"))
        count = session.scalar(select(func.count()).where(Job.tenant_id == big))
        middle = session.scalar(
            select(Job.id).where(Job.tenant_id == big).order_by(Job.id).offset(count // 2).limit(1)
        )
        queued = session.scalars(
            select(Job.id).where(Job.status == JobStatus.QUEUED).order_by(Job.id).limit(50)
        ).all()
    spec = catalog.models[MODELS[0][0]]
    request = request_from_stored(
        {
            "prompt": "a submit at volume",
            "model": spec.name,
            "width": 1024,
            "height": 1024,
            "steps": 30,
            "guidance_scale": 7.5,
            "seed": 1,
            "num_images": 1,
            "scheduler": "default",
            "output_format": "png",
            "priority": "normal",
        }
    )
    caps = Caps(settings.max_queued, settings.max_running, None)
    submitted = [0]

    def submit():
        # A tenant of its own: the queued cap (DIFFQ_MAX_QUEUED) never refuses the run.
        submitted[0] += 1
        with db.sessions() as session:
            submit_job(
                session,
                publisher,
                tenants[submitted[0] % len(tenants)],
                Submission(spec, request),
                caps,
            )

    with db.session() as session:
        tenants = list(session.scalars(select(Job.tenant_id).distinct().limit(200)))

    def listing(**kwargs):
        def call():
            with db.session() as session:
                rows, _ = service.list_jobs(session, big, limit=LIST_LIMIT, **kwargs)
                for job in rows:
                    job_request(job)  # the row reads back as the API reads it

        return call

    turn = [0]

    def choose():
        turn[0] += 1
        with db.sessions() as session:
            job = session.get(Job, queued[turn[0] % len(queued)])
            fairness.choose(session, job, utcnow(), settings.fair_share_window)
            session.rollback()

    keep = (args.days + 1) * 86400.0  # nothing due: the scan alone
    return [
        Probe("submit_job (broker stubbed)", submit),
        Probe("list_jobs, first page", listing()),
        Probe("list_jobs, mid-history page", listing(before=middle)),
        Probe("list_jobs, status=failed", listing(status=JobStatus.FAILED)),
        Probe("fairness.choose", choose),
        Probe("reap_lost_jobs", lambda: reap_lost_jobs(db, max_attempts=settings.max_attempts)),
        Probe("release_held", lambda: release_held(db, publisher, cap=settings.max_running)),
        Probe("forget_windows", lambda: forget_windows(db)),
        Probe(
            "remove_expired_results",
            lambda: remove_expired_results(
                db, storage, retention_seconds=args.result_days * 86400.0 + 86400
            ),
        ),
        Probe(
            "remove_unused_inputs",
            lambda: remove_unused_inputs(db, storage, retention_seconds=args.result_days * 86400.0),
        ),
        Probe("remove_left_checkpoints", lambda: remove_left_checkpoints(db, storage)),
        Probe("purge_finished_jobs", lambda: purge_finished_jobs(db, retention_seconds=keep)),
        Probe(
            "publish_unpublished",
            lambda: publish_unpublished(db, publisher, older_than_seconds=settings.relay_after),
        ),
        Probe("cancel_expired", lambda: cancel_expired(db)),
        Probe(
            "promote_starving",
            lambda: promote_starving(db, publisher, aging_seconds=settings.priority_aging),
        ),
        Probe(
            "preempt_for_urgent",
            lambda: preempt_for_urgent(
                db,
                catalog,
                after_seconds=settings.preempt_after,
                min_left_seconds=settings.preempt_min_left,
                max_preemptions=settings.max_preemptions,
            ),
        ),
        Probe("batches_pass", lambda: batches_pass(db, job_retention=keep)),
        Probe(
            "dispatch_webhooks",
            lambda: dispatch_webhooks(
                db, publisher, lease_seconds=settings.webhook_timeout * 2 + 30
            ),
        ),
        Probe(
            "relay_pass (all of the above)",
            lambda: relay.relay_pass(db, publisher, _keep(settings, keep, args), storage, catalog),
        ),
    ]


def _keep(settings, keep: float, args):
    from dataclasses import replace

    return replace(
        settings, job_retention=keep, result_retention=args.result_days * 86400.0 + 86400
    )


def measure(db, settings, args) -> dict[str, dict[str, float]]:
    """--repeat calls of each probe after a few to warm up, or as many as --budget seconds
    allow (at least 5): an operation that reads the whole history takes seconds a call."""
    found = {}
    for probe in probes(db, settings, args):
        started = time.perf_counter()
        probe.call()
        warm = 1 if time.perf_counter() - started > 0.2 else min(5, args.repeat)
        for _ in range(warm - 1):  # plans cached, pages read once
            probe.call()
        spent = 0.0
        while len(probe.samples) < args.repeat and (len(probe.samples) < 5 or spent < args.budget):
            started = time.perf_counter()
            probe.call()
            took = time.perf_counter() - started
            spent += took
            probe.samples.append(took * 1000)
        found[probe.name] = {
            "n": len(probe.samples),
            "p50": percentile(probe.samples, 50),
            "p99": percentile(probe.samples, 99),
        }
        print(f"  {probe.name}: p50 {found[probe.name]['p50']:.2f} ms", flush=True)
    return found


def explain(db, conn, settings, args, names: list[str]) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) of every SELECT the named probes send, as they send it."""
    from sqlalchemy import event

    sent: list[tuple[str, object]] = []

    def record(_conn, _cursor, statement, parameters, _context, _many):
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            sent.append((statement, parameters))

    chosen = [p for p in probes(db, settings, args) if p.name in names]
    event.listen(db.engine, "before_cursor_execute", record)
    try:
        for probe in chosen:
            sent.clear()
            probe.call()
            for statement, parameters in list(sent):
                with conn.cursor() as cur:
                    cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)
                    plan = "\n".join(row[0] for row in cur.fetchall())
                print(f"\n-- {probe.name}\n{cur.query.decode()}\n{plan}", flush=True)
    finally:
        event.remove(db.engine, "before_cursor_execute", record)


def measure_purge(db, args, rest_ms: float) -> dict[str, float]:
    """Purge passes (as the relay runs them) over the oldest day, which is past a job
    retention one day shorter than the history. A relay cycle is the purge, the rest of
    the pass (`rest_ms`: a pass with nothing due) and the 2 s interval."""
    from app.housekeeping.purge import purge_finished_jobs

    retention = (args.days - 1) * 86400.0
    purged, seconds, passes = 0, 0.0, []
    for _ in range(args.purge_passes):
        started = time.perf_counter()
        n = purge_finished_jobs(db, retention_seconds=retention)
        took = time.perf_counter() - started
        purged += n
        seconds += took
        passes.append(took * 1000)
        if n == 0:
            break
    per_pass = purged / max(1, len(passes))
    return {
        "passes": len(passes),
        "purged": purged,
        "rows/pass": per_pass,
        "pass p50 ms": percentile(passes, 50),
        "pass p99 ms": percentile(passes, 99),
        "rows/s while purging": purged / seconds if seconds else 0.0,
        "rows/s, relay cycle": per_pass
        / (RELAY_INTERVAL + rest_ms / 1000 + seconds / max(1, len(passes))),
    }


# ------------------------------------------------------------------------------ main


def tune(pg, shared_buffers: str) -> None:
    """Settings a production server of this size would have (the defaults are for a
    laptop): written before the server starts."""
    conf = pg.data / "postgresql.auto.conf"
    with open(conf, "a") as out:
        out.write(
            f"shared_buffers = '{shared_buffers}'\n"
            "max_wal_size = '16GB'\n"
            "checkpoint_timeout = '30min'\n"
            "effective_cache_size = '8GB'\n"
            "random_page_cost = 1.1\n"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--days", type=int, default=30, help="the history's span")
    parser.add_argument("--result-days", type=int, default=7, help="images kept this long")
    parser.add_argument("--queued", type=int, default=3000)
    parser.add_argument("--running", type=int, default=1000)
    parser.add_argument(
        "--recent", type=int, default=3000, help="jobs finished in the last 10 minutes"
    )
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per operation")
    parser.add_argument("--purge-passes", type=int, default=30)
    parser.add_argument("--arrival", type=float, default=500.0, help="jobs/s to keep up with")
    parser.add_argument("--shared-buffers", default="1GB")
    parser.add_argument(
        "--compare-fix", action="store_true", help="measure the loaded table without 0019 too"
    )
    parser.add_argument(
        "--explain", nargs="*", default=[], help="EXPLAIN these operations' queries at volume"
    )
    args = parser.parse_args()

    from app.config import load_settings
    from app.db.migrate import upgrade
    from app.db.session import Database
    from testbed.private_postgres import PrivatePostgres

    settings = load_settings({})
    pg = PrivatePostgres().init()
    try:
        tune(pg, args.shared_buffers)
        pg.start()
        url = pg.create_database("history")
        upgrade(url)
        conn = _connect(url)
        db = Database(url, pool_size=2)
        make_tenants(conn, args.tenants)

        print("no history: the live set only", flush=True)
        refresh_live(conn, args)
        phases = {"no history": measure(db, settings, args)}

        print(f"loading {args.rows:,} rows of history", flush=True)
        skip = FIX_INDEXES if args.compare_fix else ()
        load_seconds, definitions = load_history(conn, args, skip)
        print(f"  loaded and indexed in {load_seconds:.0f} s", flush=True)
        label = f"{args.rows / 1e6:g}M"
        if args.compare_fix and FIX_INDEXES:
            refresh_live(conn, args)
            print(f"{label}, without 0019's indexes", flush=True)
            phases[f"{label}, no 0019"] = measure(db, settings, args)
            if args.explain:
                explain(db, conn, settings, args, args.explain)
            with conn.cursor() as cur:
                for name in FIX_INDEXES:
                    cur.execute(definitions[name])
                cur.execute("ANALYZE jobs")
        refresh_live(conn, args)
        print(label, flush=True)
        phases[label] = measure(db, settings, args)
        table_sizes = sizes(conn)
        if args.explain:
            explain(db, conn, settings, args, args.explain)
        print("retention", flush=True)
        purge = measure_purge(db, args, phases[label]["relay_pass (all of the above)"]["p50"])
        db.dispose()
        conn.close()
    finally:
        pg.close()

    report(args, phases, table_sizes, purge, load_seconds)


def report(args, phases, table_sizes, purge, load_seconds) -> None:
    names = list(phases)
    base = phases[names[0]]
    rows = []
    for op in base:
        row = {"operation": op, "empty p50": base[op]["p50"], "empty p99": base[op]["p99"]}
        for name in names[1:]:
            row[f"{name} p50"] = phases[name][op]["p50"]
            row[f"{name} p99"] = phases[name][op]["p99"]
            row[f"{name} x p50"] = phases[name][op]["p50"] / base[op]["p50"]
        rows.append(row)
    columns = ["operation", "empty p50", "empty p99"]
    for name in names[1:]:
        columns += [f"{name} p50", f"{name} p99", f"{name} x p50"]
    print_table(
        f"ms per call ({args.repeat} calls each, or at least 5 within {args.budget:g} s); "
        f"empty = no history ({args.queued} queued, {args.running} running, {args.recent} "
        f"finished in the last 10 minutes), then {args.rows:,} rows over {args.days} days "
        f"(loaded in {load_seconds:.0f} s)",
        rows,
        columns,
    )
    print_table("jobs table and its indexes", table_sizes, ["relation", "MB"])
    keeps_up = purge["rows/s, relay cycle"] >= args.arrival
    print_table(
        f"retention (purge_finished_jobs) at volume, against {args.arrival:g} jobs/s arriving",
        [{**purge, "keeps up": "yes" if keeps_up else "no"}],
        [
            "passes",
            "purged",
            "rows/pass",
            "pass p50 ms",
            "pass p99 ms",
            "rows/s while purging",
            "rows/s, relay cycle",
            "keeps up",
        ],
    )


if __name__ == "__main__":
    main()
