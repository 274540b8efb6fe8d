"""Gauges read at scrape time from the sources of truth: PostgreSQL for jobs, RabbitMQ
for messages, DLQs and consumers. Broker readings are cached briefly so that several
scrapers (or a dashboard refresh) do not each open a connection."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import func, select

from app.broker.topology import dead_letter_queue_name
from app.db.models.jobs import Job
from app.db.models.limits import DailyUsage
from app.db.models.tenants import Tenant
from app.db.session import Database
from app.db.types import utcnow
from app.jobs import pauses
from app.jobs.forecast import Horizon, forecast_gpus
from app.jobs.states import JobStatus

if TYPE_CHECKING:
    from app.broker.backend import Broker

log = logging.getLogger(__name__)

FORECAST_TTL = 60.0  # seconds a demand forecast is reused


def job_gauges(db: Database, queues: Iterable[str], catalog=None) -> list[GaugeMetricFamily]:
    """Depth, oldest age and running jobs by queue; with the `catalog`, also whether each
    queue is paused (every model of it: app/jobs/pauses.py), which the alerts on waiting
    jobs leave out."""
    depth = GaugeMetricFamily(
        "diffq_queue_depth", "Jobs queued and not yet started, by queue", labels=["queue"]
    )
    oldest = GaugeMetricFamily(
        "diffq_queue_oldest_age_seconds",
        "Age of the oldest queued job, by queue (0 when none waits)",
        labels=["queue"],
    )
    running = GaugeMetricFamily(
        "diffq_jobs_in_flight", "Jobs running on a worker now, by queue", labels=["queue"]
    )
    seen: dict[tuple[str, JobStatus], tuple[int, object]] = {}
    with db.session() as session:
        rows = session.execute(
            select(Job.queue, Job.status, func.count(), func.min(Job.created_at))
            .where(Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))
            .group_by(Job.queue, Job.status)
        )
        for queue, status, count, first in rows:
            seen[(queue, status)] = (count, first)
        held = pauses.paused_queues(catalog, pauses.paused(session)) if catalog else None
    now = utcnow()
    for queue in sorted(set(queues) | {q for q, _ in seen}):
        count, first = seen.get((queue, JobStatus.QUEUED), (0, None))
        depth.add_metric([queue], count)
        age = (now - _aware(first)).total_seconds() if first is not None else 0.0
        oldest.add_metric([queue], max(0.0, age))
        running.add_metric([queue], seen.get((queue, JobStatus.RUNNING), (0, None))[0])
    if held is None:
        return [depth, oldest, running]
    paused = GaugeMetricFamily(
        "diffq_queue_paused",
        "1 while every model of the queue is paused by an operator (its jobs wait on "
        "purpose), else 0",
        labels=["queue"],
    )
    for queue in sorted(set(queues)):
        paused.add_metric([queue], 1 if queue in held else 0)
    return [depth, oldest, running, paused]


OTHER_TENANTS = "other"


def tenant_usage(db: Database, top: int) -> list[CounterMetricFamily]:
    """GPU-seconds, jobs and images per tenant since the start, read from daily usage.

    Cardinality stays bounded: the `top` tenants by GPU time are named, the rest are
    summed under tenant="other" (when a tenant climbs into the top, "other" drops by its
    share once, which rate() reads as a counter reset).
    """
    families = {
        "gpu_seconds": CounterMetricFamily(
            "diffq_tenant_gpu_seconds",
            "Device seconds of succeeded jobs, by tenant (top N, the rest as other)",
            labels=["tenant"],
        ),
        "jobs": CounterMetricFamily(
            "diffq_tenant_jobs", "Succeeded jobs, by tenant (top N)", labels=["tenant"]
        ),
        "images": CounterMetricFamily(
            "diffq_tenant_images", "Images of succeeded jobs, by tenant (top N)", labels=["tenant"]
        ),
    }
    with db.session() as session:
        rows = session.execute(
            select(
                Tenant.name,
                func.sum(DailyUsage.gpu_seconds),
                func.sum(DailyUsage.jobs),
                func.sum(DailyUsage.images),
            )
            .join(Tenant, Tenant.id == DailyUsage.tenant_id)
            .group_by(Tenant.name)
            .order_by(func.sum(DailyUsage.gpu_seconds).desc(), Tenant.name)
        ).all()
    totals: dict[str, list[float]] = {}
    for rank, (name, seconds, jobs, images) in enumerate(rows):
        label = name if rank < top else OTHER_TENANTS
        sums = totals.setdefault(label, [0.0, 0, 0])
        sums[0] += float(seconds or 0.0)
        sums[1] += int(jobs or 0)
        sums[2] += int(images or 0)
    for label, (seconds, jobs, images) in totals.items():
        families["gpu_seconds"].add_metric([label], seconds)
        families["jobs"].add_metric([label], jobs)
        families["images"].add_metric([label], images)
    return list(families.values())


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def broker_readings(
    broker: Broker, connect: Callable[[], Any], queues: Iterable[str]
) -> BrokerReadings | None:
    """A collector of the broker's gauges for /metrics, or None where the broker reads
    no depths (its `features`: the embedded one)."""
    return BrokerReadings(connect, queues) if broker.features.depths else None


class BrokerReadings:
    """Ready messages and consumers of each work queue and its DLQ (passive declares)."""

    def __init__(self, connect: Callable, queues: Iterable[str], ttl: float = 5.0) -> None:
        self._connect = connect
        self._queues = list(queues)
        self._ttl = ttl
        self._lock = threading.Lock()
        self._at = 0.0
        self._cached: list[GaugeMetricFamily] = []

    def collect(self) -> list[GaugeMetricFamily]:
        with self._lock:
            if time.monotonic() - self._at > self._ttl:
                self._cached = self._read()
                self._at = time.monotonic()
            return self._cached

    def _read(self) -> list[GaugeMetricFamily]:
        up = GaugeMetricFamily("diffq_broker_up", "1 if RabbitMQ answered the last scrape")
        messages = GaugeMetricFamily(
            "diffq_broker_queue_messages", "Ready messages in a work queue", labels=["queue"]
        )
        consumers = GaugeMetricFamily(
            "diffq_queue_consumers", "Workers consuming from a work queue", labels=["queue"]
        )
        dlq = GaugeMetricFamily(
            "diffq_dlq_depth", "Messages in a work queue's dead-letter queue", labels=["queue"]
        )
        try:
            with self._connect() as conn:
                conn.ensure_connection(max_retries=1, timeout=2)
                channel = conn.channel()
                for queue in self._queues:
                    ok = channel.queue_declare(queue, passive=True)
                    messages.add_metric([queue], ok.message_count)
                    consumers.add_metric([queue], ok.consumer_count)
                    dead = channel.queue_declare(dead_letter_queue_name(queue), passive=True)
                    dlq.add_metric([queue], dead.message_count)
                channel.close()
        except Exception as exc:  # noqa: BLE001 - a scrape reports, it does not raise
            log.warning("broker readings unavailable: %s: %s", type(exc).__name__, exc)
            up.add_metric([], 0)
            return [up]
        up.add_metric([], 1)
        return [up, messages, consumers, dlq]


class ServiceCollector:
    """A prometheus_client collector for the API's /metrics."""

    def __init__(
        self,
        db: Database,
        queues: list[str],
        broker: BrokerReadings | None,
        top_tenants: int = 10,
        cache_ttl: float = 0.0,
        clock=time.monotonic,
        catalog=None,
        forecast_lookahead: float = 600.0,
    ) -> None:
        self.db, self.queues, self.broker = db, queues, broker
        self.catalog = catalog  # for the paused queues
        self.top_tenants = top_tenants
        # The database aggregates of a scrape, reused for `cache_ttl` seconds: scrapes
        # from several Prometheus replicas (or anyone who reaches the port) cost one.
        self.cache_ttl, self.clock = cache_ttl, clock
        self._cached: tuple[float, list] | None = None
        self._lock = threading.Lock()
        # The demand forecast changes by the minute: read once a minute at most.
        self.horizon = Horizon(lookahead=max(1, round(forecast_lookahead / 60)))
        self._forecast: tuple[float, GaugeMetricFamily] | None = None

    def _job_families(self) -> list:
        from app.gauges.backlog import backlog_gauge

        with self._lock:
            now = self.clock()
            if self._cached is not None and now - self._cached[0] < self.cache_ttl:
                return self._cached[1]
            families: list = []
            try:
                families.extend(job_gauges(self.db, self.queues, self.catalog))
                families.append(backlog_gauge(self.db, self.queues))
                families.extend(tenant_usage(self.db, self.top_tenants))
            except Exception as exc:  # noqa: BLE001
                log.warning("job readings unavailable: %s: %s", type(exc).__name__, exc)
                return families  # not cached: the next scrape tries again
            forecast = self._forecast_gauge(now)
            if forecast is not None:
                families.append(forecast)
            self._cached = (now, families)
            return families

    def _forecast_gauge(self, now: float) -> GaugeMetricFamily | None:
        """The demand forecast, reused for FORECAST_TTL; one that cannot be read leaves
        the other readings as they are (its series is absent until it can)."""
        if self._forecast is not None and now - self._forecast[0] < FORECAST_TTL:
            return self._forecast[1]
        gauge = GaugeMetricFamily(
            "diffq_demand_forecast_gpus",
            "GPUs a queue's demand is expected to keep busy in the busiest 5 minutes "
            "starting within DIFFQ_FORECAST_LOOKAHEAD, from the same minutes of past weeks "
            "(or days) scaled by this week's level (app/jobs/forecast.py); 0 without history",
            labels=["queue"],
        )
        try:
            gpus = forecast_gpus(self.db, list(self.queues), self.horizon)
        except Exception as exc:  # noqa: BLE001
            log.warning("demand forecast unavailable: %s: %s", type(exc).__name__, exc)
            return None
        for queue in sorted(set(self.queues)):
            gauge.add_metric([queue], round(gpus.get(queue, 0.0), 3))
        self._forecast = (now, gauge)
        return gauge

    def collect(self):
        yield from self._job_families()
        if self.broker is not None:
            yield from self.broker.collect()
