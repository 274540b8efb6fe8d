"""How far one control plane carries: a simulated fleet of GPU workers on one PostgreSQL
and one RabbitMQ, and what each worker costs them (docs/scale.md).

    .venv/bin/python -m bench.fleet [--fleets 25,50,100,200] [--seconds 30]
        [--job-seconds 1,30] [--models 4] [--tenants 20] [--streams 1]
        [--variants base] [--procs 2] [--pool 24]

For each fleet size and variant: a fresh database on a private PostgreSQL (with
`pg_stat_statements`), a fresh vhost on the local RabbitMQ, the real API (gunicorn) and
the real relay (`diffq relay`) as processes, `--procs` processes of simulated workers
(bench/fleet_sim.py: each delivery through `workers.execute.execute_job`, the stand-in
pipeline sleeping its steps), and a process of SSE clients, `--streams` per job. Jobs
are submitted through the API, closed-loop: the fleet busy with a fifth more queued.
After `--warmup` seconds, `--seconds` are measured: statements and WAL by statement
(`pg_stat_statements`), NOTIFYs, AMQP messages (the simulated workers' deliveries, acks
and Celery events, plus one publish per submit), the lag from a job's `finished_at` to
its stream's terminal event, the relay's pass time (its /metrics), submit latency, and
CPU per component (from /proc).

A variant is a set of DIFFQ_* settings, named here (`VARIANTS`), so a change to the
control plane is measured before and after in one run. A variant of `POOLED` runs every
component's pool through a PgBouncer of `--pool` server connections (testbed/pgbouncer.py;
their LISTEN sessions direct), and "db conns" counts the server sessions the database
holds, sampled every 0.5 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg2
import requests
from kombu import Connection

from bench.fleet_sim import FLEET_CLAIM_PASS, STEP_SECONDS, run_streams, run_workers
from bench.report import percentile, print_table
from testbed import services
from testbed.ports import free_port
from testbed.private_postgres import PrivatePostgres
from testbed.processes import ApiServer, ManagedProcess

# name -> DIFFQ_* settings that differ from the defaults
VARIANTS: dict[str, dict[str, str]] = {
    # A progress write's notification only wakes a stream, which reads the row.
    "wake": {"DIFFQ_PROGRESS_NOTIFY": "wake"},
    # The notification carries the progress; the stream sends it on (app/jobs/notify.py).
    "carried": {"DIFFQ_PROGRESS_NOTIFY": "carried"},
    # Progress writes notify nothing; each API process polls its streams' running jobs.
    "poll": {"DIFFQ_PROGRESS_NOTIFY": "poll"},
    # `poll`, with claims that wait on a row another claim holds (before claims passed
    # such a job over: workers/claim.py `PASS_AT_MOST`, set by bench/fleet_sim.py).
    "poll-wait": {"DIFFQ_PROGRESS_NOTIFY": "poll", FLEET_CLAIM_PASS: "0"},
    # `poll` behind PgBouncer in transaction mode (README, "Connection poolers"): every
    # pool through it, the LISTEN sessions on PostgreSQL itself.
    "poll-pooled": {"DIFFQ_PROGRESS_NOTIFY": "poll"},
}
# Variants behind a PgBouncer, and its server connections (`--pool` sets them).
POOLED = {"poll-pooled"}

MODEL_TOML = """
[models.{name}]
path = "{path}"
queue = "gpu.{name}"
dtype = "float32"
max_width = 64
max_height = 64
default_width = 64
default_height = 64
max_steps = 999
default_steps = 10
soft_time_limit = 600
time_limit = 900
"""


def _models_file(root: Path, models: int) -> tuple[Path, list[str]]:
    names = [f"sim{i}" for i in range(models)]
    weights = root / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    text = f'default_model = "{names[0]}"\n' + "".join(
        MODEL_TOML.format(name=name, path=weights) for name in names
    )
    path = root / "models.toml"
    path.write_text(text)
    return path, names


# --- CPU per component, from /proc -------------------------------------------------------


def _parents() -> dict[int, int]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def _tree(roots: list[int], parents: dict[int, int]) -> set[int]:
    group, frontier = set(roots), list(roots)
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        group.update(children)
        frontier = children
    return group


def _cpu(pids: set[int]) -> float:
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _beam_pids() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "beam.smp":
                    found.append(int(entry.name))
    return found


class Components:
    def __init__(self, roots: dict[str, list[int]]) -> None:
        self.roots = roots

    def sample(self) -> dict[str, float]:
        """CPU seconds so far of each component's processes and their descendants (the
        submitter: this process alone, its children being the other components)."""
        parents = _parents()
        found = {name: _cpu(_tree(pids, parents)) for name, pids in self.roots.items()}
        found["submitter"] = _cpu({os.getpid()})
        return found


# --- PostgreSQL's side -------------------------------------------------------------------

STATEMENT_KINDS = [  # (label, pattern on the normalized statement), first match wins
    ("notify", r"pg_notify"),
    ("progress write", r"^update jobs set progress="),
    ("lease renewal", r"update jobs set lease_expires_at"),
    ("claim", r"^update jobs set status=.*started_at="),
    ("outcome", r"^update jobs set status=.*finished_at="),
    ("submit: insert", r"insert into jobs"),
    ("submit: slot", r"diffq_reserve_slot|submit_reservations"),
    ("submit: published mark", r"update jobs set published_at"),
    ("job read (streams, API)", r"^select jobs\.id, jobs\.tenant_id, jobs\.status"),
    ("usage", r"daily_usage"),
    ("webhook outbox", r"insert into webhook_events|from webhook_events"),
    ("fair share, queue position", r"from jobs join tenants|jobs.queue = \$1 and jobs.status"),
    ("transaction", r"^(begin|commit|rollback)"),
]


def statement_kind(query: str) -> str:
    text = " ".join(query.lower().split())
    for label, pattern in STATEMENT_KINDS:
        if re.search(pattern, text):
            return label
    return "other: " + text[:60]


def _pg(url: str):
    conn = psycopg2.connect(url.replace("postgresql+psycopg2://", "postgresql://", 1))
    conn.autocommit = True
    return conn


def _statements(conn) -> list[dict]:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT query, calls, total_exec_time, wal_bytes FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return [{"query": q, "calls": c, "ms": t, "wal": int(w)} for q, c, t, w in cur.fetchall()]


def _wal_lsn(conn) -> int:
    with conn.cursor() as cur:
        cur.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cur.fetchone()[0])


class WaitSampler:
    """What the database's busy backends wait on, sampled every 0.5 s from
    pg_stat_activity: (wait event, statement kind) -> samples. A lock that many claims
    queue on shows here, where pg_stat_statements shows only its time."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.samples: dict[str, int] = {}
        self.taken = 0
        self.sessions: list[int] = []  # the database's server sessions, each sample
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            with self.conn.cursor() as cur:
                cur.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'cpu'), query "
                    "FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state = 'active' AND pid != pg_backend_pid()"
                )
                rows = cur.fetchall()
                cur.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid != pg_backend_pid()"
                )
                self.sessions.append(int(cur.fetchone()[0]))
            self.taken += 1
            for wait, query in rows:
                key = f"{wait} / {statement_kind(query)}"
                self.samples[key] = self.samples.get(key, 0) + 1

    def top(self, n: int = 8) -> list[dict]:
        """The commonest, each as busy backends on average."""
        ordered = sorted(self.samples.items(), key=lambda kv: -kv[1])[:n]
        return [{"wait / statement": k, "backends": v / max(1, self.taken)} for k, v in ordered]


def _relay_passes(port: int) -> tuple[float, float]:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith("diffq_relay_pass_duration_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("diffq_relay_pass_duration_seconds_count"):
            count = float(line.split()[-1])
    return total, count


def _sim_counts(folder: Path) -> dict[str, int]:
    totals: dict[str, int] = {}
    for path in folder.glob("counts-*.json"):
        with contextlib.suppress(OSError, ValueError):
            for key, value in json.loads(path.read_text()).items():
                totals[key] = totals.get(key, 0) + value
    return totals


# --- one fleet -------------------------------------------------------------------------


class Submitter:
    """Closed loop: keeps the fleet busy, with a fifth of it more waiting."""

    def __init__(self, api_url, keys, models, job_seconds, fleet, conn, streams, jobs_q):
        self.api_url, self.keys, self.models = api_url, keys, models
        self.job_seconds, self.fleet, self.conn = job_seconds, fleet, conn
        self.streams, self.jobs_q = streams, jobs_q
        self.latencies: list[tuple[float, float]] = []  # (at, seconds)
        self.failures = 0
        self.stop = threading.Event()
        self.local = threading.local()
        self.random = random.Random(7)

    def _session(self) -> requests.Session:
        if not hasattr(self.local, "session"):
            self.local.session = requests.Session()
        return self.local.session

    def _submit(self, _i) -> None:
        key = self.random.choice(self.keys)
        seconds = self.random.uniform(*self.job_seconds)
        body = {
            "model": self.random.choice(self.models),
            "prompt": "a fleet of cubes",
            "steps": max(1, round(seconds / STEP_SECONDS)),
        }
        started = time.perf_counter()
        try:
            answer = self._session().post(
                f"{self.api_url}/v1/jobs",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=30,
            )
        except requests.RequestException:
            self.failures += 1
            return
        elapsed = time.perf_counter() - started
        if answer.status_code != 202:
            self.failures += 1
            return
        self.latencies.append((time.time(), elapsed))
        if self.streams:
            self.jobs_q.put((answer.json()["id"], key, self.streams))

    def _outstanding(self) -> int:
        with self.conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')")
            return int(cur.fetchone()[0])

    def run(self) -> None:
        target = self.fleet + max(1, self.fleet // 5)
        with ThreadPoolExecutor(8) as pool:
            while not self.stop.is_set():
                missing = target - self._outstanding()
                if missing > 0:
                    list(pool.map(self._submit, range(missing)))
                self.stop.wait(0.5)


def run_fleet(pg: PrivatePostgres, fleet: int, variant: str, args, root: Path) -> dict:
    run = f"fleet_{fleet}_{variant}_{uuid.uuid4().hex[:6]}"
    work = root / run
    (work / "logs").mkdir(parents=True)
    database_url = pg.create_database(run)
    from app.broker.topology import declare_topology
    from app.db.migrate import upgrade
    from app.keys import create_key, get_or_create_tenant

    upgrade(database_url)
    conn = _pg(database_url)
    with conn.cursor() as cur:
        cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    broker_url = services.create_vhost(run)
    models_file, models = _models_file(work, args.models)
    with Connection(broker_url) as amqp:
        declare_topology(amqp, [f"gpu.{name}" for name in models])
    relay_port = free_port()
    bouncer = None
    pooled: dict[str, str] = {}
    if variant in POOLED:
        from testbed.pgbouncer import PgBouncer

        with conn.cursor() as cur:  # a pooled deployment bounds statements on the server
            cur.execute(f"ALTER DATABASE \"{run}\" SET statement_timeout = '15s'")
        bouncer = PgBouncer(pg.admin_url, args.pool).start()
        pooled = {
            "DIFFQ_DATABASE_URL": bouncer.url(database_url),
            "DIFFQ_DATABASE_POOLED": "1",
            "DIFFQ_DATABASE_LISTEN_URL": database_url,
        }
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DIFFQ_")},
        "OMP_NUM_THREADS": "1",
        "DIFFQ_HOME": str(work / "home"),
        "DIFFQ_DATABASE_URL": database_url,
        "DIFFQ_BROKER_URL": broker_url,
        "DIFFQ_MODELS_FILE": str(models_file),
        "DIFFQ_LOG_LEVEL": "WARNING",
        "DIFFQ_WORKER_METRICS_PORT": "0",
        "DIFFQ_RATE_LIMIT": "0",
        "DIFFQ_AUTH_FAILURES": "0",
        "DIFFQ_MAX_QUEUED": "1000000",
        **VARIANTS[variant],
        **pooled,
    }
    from app.db.session import Database

    db = Database(database_url, pool_size=1)
    with db.session() as session:
        keys = [
            create_key(session, get_or_create_tenant(session, f"tenant-{i}"), "fleet")
            for i in range(args.tenants)
        ]
    db.dispose()
    cleanup = [bouncer.stop] if bouncer is not None else []
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    jobs_q = ctx.Queue()
    stop_file = work / "stop"
    children: list = []  # the simulated workers' and the streams' processes
    try:
        threads = max(64, 2 * fleet * max(1, args.streams) + 32)
        api = ApiServer(env, work / "logs", workers=args.api_workers, threads=threads).start()
        cleanup.append(api.stop)
        relay = ManagedProcess(
            "relay",
            [sys.executable, "-m", "cli", "relay", "--metrics-port", str(relay_port)],
            env,
            work / "logs",
        ).start()
        cleanup.append(relay.stop)
        sims = []
        per = [
            fleet // args.procs + (1 if i < fleet % args.procs else 0) for i in range(args.procs)
        ]
        first = 0
        for i, count in enumerate(per):
            sim_env = {**env, "FLEET_COUNTS_FILE": str(work / f"counts-{i}.json")}
            process = ctx.Process(
                target=run_workers, args=(sim_env, first, count, str(stop_file), results)
            )
            process.start()
            sims.append(process)
            children.append(process)
            first += count
        streamer = ctx.Process(target=run_streams, args=(api.url, jobs_q, results))
        streamer.start()
        children.append(streamer)
        submitter = Submitter(
            api.url, keys, models, args.job_seconds, fleet, conn, args.streams, jobs_q
        )
        feeder = threading.Thread(target=submitter.run, daemon=True)
        feeder.start()
        with open(pg.data / "postmaster.pid") as fh:
            postmaster = int(fh.readline())
        components = Components(
            {
                "postgres": [postmaster],
                "rabbitmq": _beam_pids(),
                "api": [api.pid],
                "relay": [relay.pid],
                "workers (sim)": [p.pid for p in sims],
                "streams": [streamer.pid],
            }
        )
        deadline = time.monotonic() + 90
        while _sim_counts(work).get("consuming", 0) < fleet:  # every worker consuming
            if time.monotonic() > deadline or not all(p.is_alive() for p in sims):
                for process in sims:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.pid, signal.SIGUSR1)
                time.sleep(1)
                raise RuntimeError(f"the simulated workers did not start: {_sim_counts(work)}")
            time.sleep(0.5)
        time.sleep(args.warmup)
        # The window: everything below is the difference between its two ends.
        with conn.cursor() as cur:
            cur.execute("SELECT pg_stat_statements_reset()")
        t0 = time.time()
        cpu0, wal0 = components.sample(), _wal_lsn(conn)
        relay0, counts0 = _relay_passes(relay_port), _sim_counts(work)
        waits = WaitSampler(_pg(database_url))
        waits.thread.start()
        time.sleep(args.seconds)
        waits.stop.set()
        waits.thread.join(timeout=5)
        waits.conn.close()
        t1 = time.time()
        cpu1, wal1 = components.sample(), _wal_lsn(conn)
        relay1, counts1 = _relay_passes(relay_port), _sim_counts(work)
        statements = _statements(conn)
        with conn.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM jobs WHERE finished_at >= to_timestamp(%s) "
                "AND finished_at < to_timestamp(%s)",
                (t0, t1),
            )
            finished = int(cur.fetchone()[0])
        submitter.stop.set()
        feeder.join(timeout=30)
        stop_file.touch()
        jobs_q.put(None)
        gathered = {}
        for _ in range(len(sims) + 1):
            kind, value = results.get(timeout=60)
            gathered.setdefault(kind, []).append(value)
        for process in [*sims, streamer]:
            process.join(timeout=30)
    finally:
        stop_file.touch()
        for process in children:
            process.join(timeout=20)
            if process.is_alive():
                process.kill()
        for step in reversed(cleanup):
            with contextlib.suppress(Exception):
                step()
        conn.close()
        with contextlib.suppress(Exception):
            services.delete_vhost(run)
    seconds = t1 - t0
    lags = [
        lag for stream in gathered.get("streams", []) for at, lag in stream["lags"] if t0 <= at < t1
    ]
    submits = [s for at, s in submitter.latencies if t0 <= at < t1]
    amqp = {k: counts1.get(k, 0) - counts0.get(k, 0) for k in set(counts1) | set(counts0)}
    by_kind: dict[str, dict] = {}
    for row in statements:
        kind = statement_kind(row["query"])
        entry = by_kind.setdefault(kind, {"calls": 0, "ms": 0.0, "wal": 0})
        for field in ("calls", "ms", "wal"):
            entry[field] += row[field]
    # AMQP: one publish per submit, per delivery one delivery and one ack, and the events.
    messages = len(submits) + 2 * amqp.get("deliveries", 0) + amqp.get("events", 0)
    relay_passes = relay1[1] - relay0[1]
    return {
        "fleet": fleet,
        "variant": variant,
        "jobs/s": finished / seconds,
        "stmts/s": sum(r["calls"] for r in statements) / seconds,
        "WAL KB/s": (wal1 - wal0) / 1024 / seconds,
        "NOTIFY/s": by_kind.get("notify", {}).get("calls", 0) / seconds,
        "AMQP msg/s": messages / seconds,
        "lag p50 ms": 1000 * percentile(lags, 50),
        "lag p99 ms": 1000 * percentile(lags, 99),
        "relay pass ms": 1000 * (relay1[0] - relay0[0]) / relay_passes if relay_passes else None,
        "submit p50 ms": 1000 * percentile(submits, 50),
        "submit p99 ms": 1000 * percentile(submits, 99),
        "cpu": {name: 100 * (cpu1[name] - cpu0[name]) / seconds for name in cpu0},
        "waits": waits.top(),
        "db conns": max(waits.sessions, default=0),
        "db conns mean": sum(waits.sessions) / max(1, len(waits.sessions)),
        "kinds": {k: {f: v / seconds for f, v in e.items()} for k, e in by_kind.items()},
        "top": [
            {
                "query": r["query"][:300],
                "calls/s": r["calls"] / seconds,
                "wal/s": r["wal"] / seconds,
            }
            for r in sorted(statements, key=lambda r: -r["wal"])[:15]
        ],
        "errors": sum(c.get("errors", 0) for c in gathered.get("workers", [])),
        "submit failures": submitter.failures,
        "streams": sum(len(s["lags"]) for s in gathered.get("streams", [])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fleets", default="25,50,100,200")
    parser.add_argument("--variants", default="wake,carried,poll")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--job-seconds", default="1,30", help="min,max (uniform)")
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--streams", type=int, default=1, help="SSE streams per job")
    parser.add_argument("--procs", type=int, default=2, help="processes of simulated workers")
    parser.add_argument("--api-workers", type=int, default=2)
    parser.add_argument(
        "--pool", type=int, default=24, help="PgBouncer's server connections (POOLED variants)"
    )
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    args.job_seconds = tuple(float(x) for x in args.job_seconds.split(","))
    fleets = [int(x) for x in args.fleets.split(",")]
    variants = args.variants.split(",")
    pg = PrivatePostgres(
        {
            "shared_preload_libraries": "pg_stat_statements",
            "pg_stat_statements.track": "top",
            "max_connections": "800",
        }
    ).init()
    pg.start()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="diffq-fleet-") as tmp:
            for fleet in fleets:
                for variant in variants:
                    row = run_fleet(pg, fleet, variant, args, Path(tmp))
                    rows.append(row)
                    shown = {k: v for k, v in row.items() if k not in ("kinds", "top", "waits")}
                    print(json.dumps(shown), flush=True)
    finally:
        pg.close()
    _report(rows, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def _report(rows: list[dict], args) -> None:
    lo, hi = args.job_seconds
    base = {row["fleet"]: row for row in rows if row["variant"] == rows[0]["variant"]}
    table = []
    for row in rows:
        first = base[row["fleet"]]
        flat = {k: v for k, v in row.items() if k not in ("cpu", "kinds", "top", "waits")}
        flat["stmts/s/worker"] = row["stmts/s"] / row["fleet"]
        flat["WAL KB/s/worker"] = row["WAL KB/s"] / row["fleet"]
        flat["WAL vs base"] = row["WAL KB/s"] / first["WAL KB/s"] if first["WAL KB/s"] else None
        for name, value in row["cpu"].items():
            flat[f"cpu% {name}"] = value
        table.append(flat)
    columns = [
        "fleet", "variant", "jobs/s", "stmts/s", "stmts/s/worker", "WAL KB/s",
        "WAL KB/s/worker", "WAL vs base", "NOTIFY/s", "AMQP msg/s", "lag p50 ms",
        "lag p99 ms", "relay pass ms", "submit p50 ms", "submit p99 ms", "db conns",
        "db conns mean",
    ]  # fmt: skip
    print_table(
        f"Fleet: jobs {lo:g}-{hi:g} s, {args.models} models, {args.tenants} tenants, "
        f"{args.streams} stream(s) per job, {args.seconds:g} s measured",
        table,
        columns,
    )
    cpu_columns = ["fleet", "variant", *[k for k in table[0] if k.startswith("cpu% ")]]
    print_table("CPU per component (% of one core)", table, cpu_columns)
    for row in rows:
        print_table(
            f"What busy backends wait on: fleet {row['fleet']}, {row['variant']}",
            row["waits"],
            ["wait / statement", "backends"],
        )
        kinds = sorted(row["kinds"].items(), key=lambda kv: -kv[1]["wal"])
        print_table(
            f"Statements by kind: fleet {row['fleet']}, {row['variant']} (per second)",
            [
                {
                    "kind": kind,
                    "calls/s": v["calls"],
                    "calls/s/worker": v["calls"] / row["fleet"],
                    "WAL KB/s": v["wal"] / 1024,
                    "exec ms/s": v["ms"],
                }
                for kind, v in kinds[:12]
            ],
            ["kind", "calls/s", "calls/s/worker", "WAL KB/s", "exec ms/s"],
        )


if __name__ == "__main__":
    main()
