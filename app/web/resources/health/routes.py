"""GET /healthz (the process answers) and GET /readyz (it can accept a job durably).

Readiness gates on PostgreSQL alone (reachable, schema migrated): a job is durable once
its row is committed, and the relay publishes it when the broker comes back. Taking API
pods out of the Service during a broker outage would refuse exactly the jobs the outbox
exists to keep. The broker and the store are still reported, for people, not for gating.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait

from flask.views import MethodView

from app.db.migrate import schema_at_head
from app.web.bodies import Blueprint
from app.web.services import services

blp = Blueprint("health", __name__, description="Probes for load balancers and Kubernetes.")

# The checks that decide readiness; the others are reported only.
GATING = ("database", "schema")


def _check(probe) -> str:
    try:
        probe()
    except Exception as exc:  # noqa: BLE001 - a probe reports, it does not raise
        # The class name only: messages can carry internal hostnames.
        return f"unavailable ({type(exc).__name__})"
    return "ok"


def _broker_probe(publisher) -> None:
    with publisher.celery.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)


# Reported, not gating: they run beside each other and get REPORT_SECONDS, so that a hung
# broker or store never makes the probe itself time out.
REPORT_SECONDS = 2.0
_reporters = ThreadPoolExecutor(max_workers=4, thread_name_prefix="readyz")


def _reported(probes: dict) -> dict[str, str]:
    futures = {name: _reporters.submit(_check, probe) for name, probe in probes.items()}
    done, _ = wait(futures.values(), timeout=REPORT_SECONDS)
    return {
        name: future.result() if future in done else "unavailable (timeout)"
        for name, future in futures.items()
    }


@blp.route("/healthz")
class Health(MethodView):
    @blp.doc(security=[])
    @blp.response(200)
    def get(self):
        """Liveness: the process is up

        Checks nothing else (readiness is `/readyz`); needs no key.
        """
        return {"status": "ok"}


@blp.route("/readyz")
class Ready(MethodView):
    @blp.doc(
        security=[],
        responses={
            "200": {
                "content": {
                    "application/json": {
                        "example": {
                            "status": "ready",
                            "required": list(GATING),
                            "checks": {
                                "database": "ok",
                                "schema": "ok",
                                "broker": "unavailable (OperationalError)",
                                "storage": "ok",
                            },
                        }
                    }
                }
            }
        },
    )
    @blp.response(
        200,
        description="The database answers and carries the current schema: jobs are "
        "accepted durably. `broker` and `storage` are reported but do not gate (the relay "
        "publishes jobs accepted while the broker is away).",
    )
    @blp.alt_response(503, description="The database is away or not migrated.")
    def get(self):
        """Readiness: a job can be stored (database up, schema current)

        `checks` reports the database, its schema, the broker and the storage; only those
        in `required` decide the status. Needs no key.
        """
        svc = services()
        database = _check(svc.db.ping)
        checks = {
            "database": database,
            "schema": _check(lambda: schema_at_head(svc.db.engine))
            if database == "ok"
            else "unknown",
            **_reported(
                {"broker": lambda: _broker_probe(svc.publisher), "storage": svc.storage.check}
            ),
        }
        ready = all(checks[name] == "ok" for name in GATING)
        body = {"status": "ready" if ready else "unavailable", "required": list(GATING)}
        return {**body, "checks": checks}, (200 if ready else 503)
