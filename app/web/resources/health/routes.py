"""GET /healthz (the process answers) and GET /readyz (its dependencies answer)."""

from __future__ import annotations

from flask.views import MethodView
from flask_smorest import Blueprint

from app.web.services import services

blp = Blueprint("health", __name__, description="Probes for load balancers and Kubernetes.")


def _check(probe) -> str:
    try:
        probe()
    except Exception as exc:  # noqa: BLE001 - a probe reports, it does not raise
        # The class name only: messages can carry internal hostnames.
        return f"unavailable ({type(exc).__name__})"
    return "ok"


def _broker_probe() -> None:
    publisher = services().publisher
    with publisher.celery.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)


@blp.route("/healthz")
class Health(MethodView):
    @blp.doc(security=[])
    @blp.response(200)
    def get(self):
        """Liveness: the process is up"""
        return {"status": "ok"}


@blp.route("/readyz")
class Ready(MethodView):
    @blp.doc(security=[])
    @blp.response(200, description="Every dependency answered.")
    @blp.alt_response(503, description="At least one dependency did not answer.")
    def get(self):
        """Readiness: database, broker and storage each answer"""
        svc = services()
        checks = {
            "database": _check(svc.db.ping),
            "broker": _check(_broker_probe),
            "storage": _check(svc.storage.check),
        }
        ready = all(state == "ok" for state in checks.values())
        return {"status": "ready" if ready else "unavailable", "checks": checks}, (
            200 if ready else 503
        )
