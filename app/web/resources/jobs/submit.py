"""The web side of submitting (app/jobs/submit.py): this request's tenant, session,
publisher and caps in; a refusal out as the HTTP error it is."""

from __future__ import annotations

import uuid
from typing import Any

from flask_smorest import abort

from app.jobs.submit import Caps, Refused, Submission, Submitted, submit_job
from app.web.auth import current_tenant, tenant_quota
from app.web.inputs import keep, without_inputs
from app.web.services import close_request_session, request_session, services


def submit(
    request_data: dict[str, Any],
    *,
    idempotency_key: str | None = None,
    body_hash: str | None = None,
    replay_of: uuid.UUID | None = None,
) -> Submitted:
    """`request_data` as JobCreateSchema loads it. Its input images are stored (or held)
    now that the request passed every check of its own, before the job is."""
    svc = services()
    request_data, inputs = without_inputs(request_data)
    keep(inputs)
    submission = Submission(
        **request_data, idempotency_key=idempotency_key, body_hash=body_hash, replay_of=replay_of
    )
    caps = Caps(svc.settings.max_queued, svc.settings.max_running, tenant_quota())
    try:
        return submit_job(
            request_session(),
            svc.publisher,
            current_tenant(),
            submission,
            caps,
            release=close_request_session,
        )
    except Refused as refused:
        headers = {"Retry-After": str(refused.retry_after)} if refused.retry_after else None
        abort(refused.status, message=refused.message, **({"headers": headers} if headers else {}))
