"""GET /v1/jobs/{id}/ws: the job's events over a WebSocket, beside the SSE stream.

Same events and resume rule as /events (each message `{"id", "event", "data"}`, the id
being the job's version; resume with `?last_event_id=` or `Last-Event-ID`). The server
pings every DIFFQ_SSE_KEEPALIVE seconds and closes with a code for the terminal state.
Auth: `Authorization: Bearer <key>` on the handshake, or, for browsers (which cannot set
headers on a WebSocket), `?ticket=` from POST /v1/jobs/{id}/ws-ticket: signed, bound to
the tenant and the job, valid DIFFQ_WS_TICKET_TTL seconds, good for one socket
(app/web/tickets.py); the key never enters a URL. A ticket presented with another
tenant's key is refused, and a handshake whose `Origin` is not one of
DIFFQ_PUBLIC_ORIGINS is refused (403) before anything else.

Each open socket holds one gunicorn thread (the event loop below) and one reader thread
(simple-websocket's, which also sends the pings; their writes take turns,
app/web/websocket.py); no database connection.
"""

from __future__ import annotations

import json
import uuid

import flask
from flask import Response, g, request, url_for
from flask.views import MethodView
from flask_smorest import abort
from simple_websocket import ConnectionClosed

from app.jobs import service
from app.web import tickets
from app.web.auth import (
    CHALLENGE,
    client_names,
    current_tenant,
    presented_key,
    require_api_key,
    throttled,
)
from app.web.bodies import Blueprint
from app.web.resources.jobs.events import job_events
from app.web.services import close_request_session, request_session, services
from app.web.streams import take_slot
from app.web.websocket import SerialServer

blp = Blueprint(
    "job_ws", __name__, url_prefix="/v1/jobs", description="Follow a job over a WebSocket."
)

# Close codes (4000-4999 are the application's): the job's terminal state.
CLOSE_CODES = {"succeeded": 4000, "failed": 4001, "canceled": 4002}
CLOSE_GONE = 4004  # the job disappeared while followed
MAX_TICKET_CHARS = tickets.MAX_TICKET_CHARS
MAX_CLIENT_MESSAGE = 1024


def make_ticket(tenant_id: uuid.UUID, job_id: uuid.UUID) -> str:
    return tickets.make_ticket(services().settings.secret_key, tenant_id, job_id)


def _check_origin() -> None:
    """A browser's handshake comes from a page it names in `Origin`: only the configured
    public origins may open a socket (clients that are not browsers send none)."""
    origin = request.headers.get("Origin")
    if origin is not None and origin.strip().rstrip("/").lower() not in (
        services().settings.public_origins
    ):
        abort(
            403,
            message="This Origin may not open a WebSocket (DIFFQ_PUBLIC_ORIGINS).",
            errors={"headers": {"Origin": ["Not an allowed origin."]}},
        )


def _refuse_ticket(message: str) -> None:
    services().auth_failures.failed(*client_names(None))
    abort(401, message=message, headers=CHALLENGE)


def _authenticate(job_id: uuid.UUID) -> tickets.Ticket | None:
    """Sets g.tenant_id from the ticket, else from the Authorization header, else 401.
    Returns the ticket (unspent) when one was presented."""
    raw = request.args.get("ticket")
    if raw is None:
        require_api_key()
        return None
    throttled(client_names(presented_key()))
    settings = services().settings
    ticket = tickets.read_ticket(settings.secret_key, settings.ws_ticket_ttl, raw, job_id)
    if ticket is None:
        _refuse_ticket("Invalid or expired ticket.")
    if presented_key() is not None:
        require_api_key()  # a key beside the ticket must be valid, and the same tenant's
        if current_tenant() != ticket.tenant_id:
            _refuse_ticket("The ticket and the API key belong to different tenants.")
    g.tenant_id = ticket.tenant_id
    return ticket


def _last_event_id() -> int:
    raw = request.args.get("last_event_id") or request.headers.get("Last-Event-ID") or "-1"
    try:
        return int(raw)
    except ValueError:
        abort(422, errors={"query": {"last_event_id": ["Must be an integer."]}})
        raise  # not reached


@blp.route("/<uuid:job_id>/ws-ticket")
class JobWsTicket(MethodView):
    @blp.doc(
        responses={
            "201": {
                "description": "`ticket`: pass it as `?ticket=` to the WebSocket within "
                "`expires_in` seconds, once (it opens one socket); `url`: the WebSocket "
                "URL with it, on DIFFQ_PUBLIC_URL.",
                "content": {
                    "application/json": {
                        "example": {
                            "ticket": "eyJ0Ijoi...",
                            "expires_in": 60,
                            "url": "ws://127.0.0.1:8000/v1/jobs/0193.../ws?ticket=eyJ0Ijoi...",
                        }
                    }
                },
            },
            "404": {"description": "No such job (or not yours)."},
        }
    )
    def post(self, job_id: uuid.UUID):
        """Get a WebSocket ticket

        For browsers, which cannot send `Authorization` on a WebSocket: a short-lived,
        signed ticket for this job's `/ws`, so the API key never goes into a URL.
        """
        require_api_key()
        if service.get_job(request_session(), current_tenant(), job_id) is None:
            abort(404, message="No such job.")
        ticket = make_ticket(current_tenant(), job_id)
        # A WebSocket rule: werkzeug builds it as ws:// (wss:// behind https).
        url = url_for("job_ws.JobWebSocket", job_id=job_id, ticket=ticket, _external=True)
        return {"ticket": ticket, "expires_in": services().settings.ws_ticket_ttl, "url": url}, 201


@blp.route("/<uuid:job_id>/ws", websocket=True)
class JobWebSocket(MethodView):
    @blp.doc(
        parameters=[
            {
                "name": "ticket",
                "in": "query",
                "schema": {"type": "string", "maxLength": MAX_TICKET_CHARS},
                "description": "From POST /v1/jobs/{id}/ws-ticket, instead of Authorization.",
            },
            {
                "name": "last_event_id",
                "in": "query",
                "schema": {"type": "integer"},
                "description": "Resume after this event id (as SSE's Last-Event-ID).",
            },
        ],
        responses={
            "101": {
                "description": "Switching to the WebSocket protocol. Text messages: "
                '`{"id": 7, "event": "status" | "progress", "data": {...}}`, the same '
                "events as `/events`. Pings every DIFFQ_SSE_KEEPALIVE (15) seconds. After the "
                "terminal status the server closes with 4000 (succeeded), 4001 (failed) or "
                "4002 (canceled), the status as the reason.",
                "content": {
                    "application/json": {
                        "example": {"id": 3, "event": "progress", "data": {"stage": "denoising"}}
                    }
                },
            },
            "400": {"description": "Not a WebSocket handshake."},
            "401": {
                "description": "No or bad API key or ticket; a ticket already used, or "
                "presented with another tenant's key."
            },
            "403": {"description": "An `Origin` not among DIFFQ_PUBLIC_ORIGINS."},
            "404": {"description": "No such job (or not yours)."},
            "422": {"description": "`last_event_id` is not an integer."},
            "429": {
                "description": "Too many open streams (DIFFQ_MAX_TENANT_STREAMS, "
                "DIFFQ_MAX_STREAMS), or too many failed authentications; Retry-After."
            },
        },
    )
    def get(self, job_id: uuid.UUID):
        """Follow a job over a WebSocket

        The stream's events over a WebSocket, for clients that cannot send a header:
        authenticate with a single-use ticket (`POST /v1/jobs/{job_id}/ws-ticket`) in the
        `ticket` query parameter, or the key in `Authorization`.
        """
        _check_origin()
        ticket = _authenticate(job_id)
        tenant_id = current_tenant()
        job = service.get_job(request_session(), tenant_id, job_id)
        if job is None:
            abort(404, message="No such job.")
        last_seen = _last_event_id()
        if request.headers.get("Upgrade", "").lower() != "websocket":
            abort(400, message="Expected a WebSocket handshake (Upgrade: websocket).")
        slot = take_slot(services().streams, tenant_id)  # 429 past a cap
        try:
            if ticket is not None and not tickets.spend(request_session(), ticket):
                _refuse_ticket("This ticket was already used; ask for a new one.")
            close_request_session()  # no connection is held while the socket is open
            ws = SerialServer.accept(
                request.environ,
                ping_interval=services().settings.sse_keepalive,
                receive_bytes=1024,
                max_message_size=MAX_CLIENT_MESSAGE,  # clients have nothing to say
            )
            try:
                _follow(ws, job_id, tenant_id, last_seen)
            except ConnectionClosed:
                pass
            finally:
                if ws.connected:  # the job vanished, or the loop failed
                    ws.close(reason=CLOSE_GONE, message="gone")
        finally:
            slot.release()
        return _Done(ws.mode)


def _follow(ws: SerialServer, job_id: uuid.UUID, tenant_id: uuid.UUID, last_seen: int) -> None:
    status = None
    for event in job_events(job_id, tenant_id, last_seen):
        if not ws.connected:
            return
        while ws.receive(timeout=0) is not None:
            pass  # anything a client sends is read and dropped
        if event is None:
            continue  # idle: the reader thread pings
        name, event_id, data = event
        ws.send(json.dumps({"id": event_id, "event": name, "data": data}, default=str))
        if name == "status":
            status = data["status"]
    with services().db.session() as session:
        job = service.get_job(session, tenant_id, job_id)
    if job is not None and job.status.terminal:
        status = job.status.value
    if status in CLOSE_CODES and ws.connected:
        ws.close(reason=CLOSE_CODES[status], message=status)


class _Done(Response):
    """What the view returns after the socket closed: nothing more goes on the wire."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self._mode = mode

    def __call__(self, environ, start_response):
        if self._mode == "gunicorn":
            raise StopIteration()
        if self._mode == "werkzeug":
            return super().__call__(environ, start_response)
        return []


# A plain GET (no Upgrade) does not match a WebSocket rule; this twin of the route gives
# it the same answers (401, 404, then 400) instead of werkzeug's bare 400. Added through
# Flask's own add_url_rule so that the OpenAPI document lists the path once.
flask.Blueprint.add_url_rule(
    blp, "/<uuid:job_id>/ws", view_func=JobWebSocket.as_view("JobWebSocketPlain")
)
