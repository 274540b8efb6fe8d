"""GET /v1/usage: what the caller's tenant used, per UTC day, model and device."""

from __future__ import annotations

from datetime import timedelta

from flask.views import MethodView
from sqlalchemy import select

from app import usage
from app.db.models.tenants import Tenant
from app.db.types import utcnow
from app.web.auth import current_tenant, require_api_key
from app.web.bodies import Blueprint
from app.web.resources.usage.schemas import UsageQuerySchema, UsageSchema
from app.web.services import request_session, services

blp = Blueprint(
    "usage", __name__, url_prefix="/v1/usage", description="GPU time, jobs and images used."
)
blp.before_request(require_api_key)


@blp.route("")
class Usage(MethodView):
    @blp.arguments(UsageQuerySchema, location="query")
    @blp.response(200, UsageSchema)
    def get(self, args):
        """Your usage

        GPU-seconds (device time inside the pipeline call), jobs and images of your
        succeeded jobs, per UTC day, model and device, with the price where the operator
        set one (DIFFQ_GPU_PRICES), and your daily GPU-second quota.
        """
        settings = services().settings
        session = request_session()
        tenant_id = current_tenant()
        today = utcnow().date()
        last = args.get("to") or today
        first = args.get("from_") or last - timedelta(days=29)
        rows = []
        for row in usage.between(session, tenant_id, first, last):
            rows.append(
                {
                    "day": row.day,
                    "model": row.model,
                    "device": row.device,
                    "gpu_seconds": round(row.gpu_seconds, 4),
                    "jobs": row.jobs,
                    "images": row.images,
                    "price": usage.price(settings.gpu_prices, row.device, row.gpu_seconds),
                }
            )
        prices = [r["price"] for r in rows]
        limit = session.scalar(select(Tenant.daily_gpu_seconds).where(Tenant.id == tenant_id))
        return {
            "from_": first,
            "to": last,
            "currency": settings.price_currency,
            "data": rows,
            "totals": {
                "gpu_seconds": round(sum(r["gpu_seconds"] for r in rows), 4),
                "jobs": sum(r["jobs"] for r in rows),
                "images": sum(r["images"] for r in rows),
                "price": round(sum(prices), 6) if rows and None not in prices else None,
            },
            "quota": {
                "daily_gpu_seconds": limit,
                "used_today": round(usage.used_on(session, tenant_id, today), 4),
            },
        }
