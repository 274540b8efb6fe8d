"""GET /v1/jobs/{id}/events: Server-Sent Events for one job, until it finishes."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

from flask import Response, request, stream_with_context
from flask.views import MethodView
from flask_smorest import abort

from app.jobs import service
from app.jobs.queue_info import fair_window, queue_info
from app.jobs.states import JobStatus
from app.web.auth import current_tenant, require_api_key
from app.web.bodies import Blueprint
from app.web.resources.jobs.presenter import job_view
from app.web.services import close_request_session, request_session, services
from app.web.streams import take_slot

blp = Blueprint(
    "job_events", __name__, url_prefix="/v1/jobs", description="Follow a job as it runs."
)
blp.before_request(require_api_key)

# While queued, a stream re-reads its position when its queue moves, at most this often.
QUEUED_MIN_REFRESH_SECONDS = 1.0
RECONNECT_MS = 2000


def _event(name: str, event_id: int, data: dict) -> str:
    return f"id: {event_id}\nevent: {name}\ndata: {json.dumps(data, default=str)}\n\n"


def _last_event_id() -> int:
    try:
        return int(request.headers.get("Last-Event-ID", "-1"))
    except ValueError:
        return -1


@blp.route("/<uuid:job_id>/events")
class JobEvents(MethodView):
    @blp.doc(
        responses={
            "200": {
                "description": "`text/event-stream`. Events: `status` (data: the job object) "
                "when the status changes, `progress` (data: the progress object, plus "
                "`queue_position` and `eta_seconds` while queued) when progress moves. Each "
                "event's `id` is the job's version: reconnect with `Last-Event-ID` to resume "
                "from the current state without repeats. A `: keep-alive` comment comes after "
                "DIFFQ_SSE_KEEPALIVE (15) idle seconds. The stream closes after the terminal "
                "status event.",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            },
            "204": {"description": "The job had finished and that was already sent."},
            "404": {"description": "No such job (or not yours)."},
            "429": {
                "description": "Too many open streams: the tenant's on this API process "
                "(DIFFQ_MAX_TENANT_STREAMS) or the process's (DIFFQ_MAX_STREAMS); "
                "`errors.streams` says which. Retry-After says when to try again."
            },
        }
    )
    def get(self, job_id: uuid.UUID):
        """Stream a job's status and progress

        Server-Sent Events until the job ends: the events are the 200 answer's. Reconnect
        with `Last-Event-ID` to go on from the job's current state; a job that had ended
        and was sent is a 204.
        """
        tenant_id = current_tenant()
        job = service.get_job(request_session(), tenant_id, job_id)
        if job is None:
            abort(404, message="No such job.")
        last_seen = _last_event_id()
        if job.status.terminal and last_seen >= job.version:
            return Response(status=204)
        slot = take_slot(services().streams, tenant_id)  # 429 past a cap
        close_request_session()  # no connection is held while the stream is open
        response = Response(
            stream_with_context(_stream(job_id, tenant_id, last_seen)),
            mimetype="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        response.call_on_close(slot.release)  # however the stream ends, even unstarted
        return response


def _stream(job_id: uuid.UUID, tenant_id: uuid.UUID, last_seen: int) -> Iterator[str]:
    """Server-Sent Events text for `job_events`."""
    yield f"retry: {RECONNECT_MS}\n\n"
    for event in job_events(job_id, tenant_id, last_seen):
        if event is None:
            yield ": keep-alive\n\n"
        else:
            yield _event(*event)


def job_events(
    job_id: uuid.UUID, tenant_id: uuid.UUID, last_seen: int
) -> Iterator[tuple[str, int, dict] | None]:
    """(name, id, data) for what changed since `last_seen` (a job version), then for every
    change, until the job finishes; None after DIFFQ_SSE_KEEPALIVE idle seconds. Shared by
    the event stream and the WebSocket."""
    svc = services()
    keepalive = svc.settings.sse_keepalive
    subscription = svc.watcher.subscribe(job_id)
    sent_status = sent_progress = None
    last_write = time.monotonic()
    try:
        while True:
            with svc.db.session() as session:
                job = service.get_job(session, tenant_id, job_id)
                queued = job is not None and job.status == JobStatus.QUEUED
                info = queue_info(session, job, fair_window(svc.settings)) if queued else None
            if job is None:
                return
            view = job_view(job, svc.storage, svc.settings.presign_ttl, info)
            progress = dict(job.progress or {})
            if info is not None:
                progress.update(queue_position=info.position, eta_seconds=info.eta_seconds)
            fresh = job.version > last_seen
            if sent_status is None and not fresh:
                # A resumed stream: the client already has this version.
                sent_status, sent_progress = view["status"], progress
            if fresh and view["status"] != sent_status:
                yield ("status", job.version, view)
                sent_status, last_write = view["status"], time.monotonic()
            if (fresh or queued) and progress != sent_progress and not job.status.terminal:
                yield ("progress", job.version, progress)
                sent_progress, last_write = progress, time.monotonic()
            last_seen = max(last_seen, job.version)
            if job.status.terminal:
                return
            subscription.follow_queue(job.queue if queued else None)
            running = job.status == JobStatus.RUNNING
            subscription.follow_progress(running)
            while True:  # until the row must be read again
                refreshed = time.monotonic()
                woke = subscription.wait(keepalive)
                if woke == "queue":
                    # A busy queue wakes its waiting streams often: at most one re-read a
                    # second.
                    time.sleep(
                        max(0.0, QUEUED_MIN_REFRESH_SECONDS - (time.monotonic() - refreshed))
                    )
                if time.monotonic() - last_write >= keepalive:
                    yield None
                    last_write = time.monotonic()
                # A running job's progress, carried by a notification or the process's
                # poll (app/web/watch.py), is sent on without reading the row.
                carried = subscription.carried() if running else None
                if carried is None or carried.status != JobStatus.RUNNING:
                    break
                if carried.version <= last_seen:
                    continue  # what the last read already saw
                last_seen, progress = carried.version, dict(carried.progress)
                if progress != sent_progress:
                    yield ("progress", last_seen, progress)
                    sent_progress, last_write = progress, time.monotonic()
    finally:
        subscription.close()
