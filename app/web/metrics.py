"""GET /metrics for Prometheus, and the request instruments every route records to.

Served on the API's metrics port only (DIFFQ_API_METRICS_PORT; app/web/edge.py), never on
the public one: it names tenants and their usage. The database aggregates are reused for
DIFFQ_METRICS_CACHE_TTL seconds.

Safe under gunicorn with several processes: `diffq api` gives the process tree one
multiprocess directory (app.metrics.multiproc), and each scrape sums every process's
files, then adds gauges read from PostgreSQL and RabbitMQ at that moment.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from flask import Flask, Response, g, request

from app.gauges.readings import ServiceCollector, broker_readings
from app.metrics import multiproc

if TYPE_CHECKING:
    from app.web.root import ApiRoot


def install(app: Flask, svc: ApiRoot) -> None:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    from app.metrics.instruments import HTTP_DURATION, HTTP_IN_FLIGHT, HTTP_REQUESTS

    broker = broker_readings(svc.broker, svc.celery.connection_for_read, svc.catalog.queues)
    readings = ServiceCollector(
        svc.db,
        svc.catalog.queues,
        broker,
        top_tenants=svc.settings.metrics_top_tenants,
        cache_ttl=svc.settings.metrics_cache_ttl,
        catalog=svc.catalog,
        forecast_lookahead=svc.settings.forecast_lookahead,
    )

    @app.before_request
    def _start_timer() -> None:
        g.request_started = time.perf_counter()
        rule = request.url_rule.rule if request.url_rule is not None else ""
        if rule != "/metrics" and not rule.endswith("/events"):
            HTTP_IN_FLIGHT.inc()
            g.in_flight = True

    @app.teardown_request
    def _done(_exc: BaseException | None = None) -> None:
        if g.pop("in_flight", False):
            HTTP_IN_FLIGHT.dec()

    @app.after_request
    def _count(response: Response) -> Response:
        started = g.pop("request_started", None)
        route = request.url_rule.rule if request.url_rule is not None else "unmatched"
        if route != "/metrics":
            HTTP_REQUESTS.labels(route, request.method, str(response.status_code)).inc()
            if started is not None:
                HTTP_DURATION.labels(route, request.method).observe(time.perf_counter() - started)
        return response

    @app.get("/metrics")
    def metrics() -> Response:
        # generate_latest needs only .collect(): the readings render as a registry would.
        body = generate_latest(multiproc.registry()) + generate_latest(readings)
        return Response(body, content_type=CONTENT_TYPE_LATEST)
