"""GET /v1/jobs/{id}/ws: the job's events over a WebSocket, beside the SSE stream.

Same events and resume rule as /events (each message `{"id", "event", "data"}`, the id
being the job's version; resume with `?last_event_id=` or `Last-Event-ID`). The server
pings every DIFFQ_SSE_KEEPALIVE seconds and closes with a code for the terminal state.
Auth: `Authorization: Bearer <key>` on the handshake, or, for browsers (which cannot set
headers on a WebSocket), `?ticket=` from POST /v1/jobs/{id}/ws-ticket: signed, bound to
the tenant and the job, valid DIFFQ_WS_TICKET_TTL seconds; the key never enters a URL.

Each open socket holds one gunicorn thread (the event loop below) and one reader thread
(simple-websocket's, which also sends the pings); no database connection.
"""

from __future__ import annotations

import json
import uuid

import flask
from flask import Response, g, request, url_for
from flask.views import MethodView
from flask_smorest import Blueprint, abort
from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer
from simple_websocket import ConnectionClosed, Server

from app.jobs import service
from app.web.auth import CHALLENGE, current_tenant, require_api_key
from app.web.resources.jobs.events import job_events
from app.web.services import close_request_session, request_session, services

blp = Blueprint(
    "job_ws", __name__, url_prefix="/v1/jobs", description="Follow a job over a WebSocket."
)

# Close codes (4000-4999 are the application's): the job's terminal state.
CLOSE_CODES = {"succeeded": 4000, "failed": 4001, "canceled": 4002}
CLOSE_GONE = 4004  # the job disappeared while followed
MAX_TICKET_CHARS = 512
MAX_CLIENT_MESSAGE = 1024


def _tickets() -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(services().settings.secret_key, salt="diffq-ws-ticket")


def make_ticket(tenant_id: uuid.UUID, job_id: uuid.UUID) -> str:
    return _tickets().dumps({"t": str(tenant_id), "j": str(job_id)})


def _ticket_tenant(ticket: str, job_id: uuid.UUID) -> uuid.UUID | None:
    if len(ticket) > MAX_TICKET_CHARS:
        return None
    try:
        claims = _tickets().loads(ticket, max_age=services().settings.ws_ticket_ttl)
    except (SignatureExpired, BadSignature):
        return None
    if claims.get("j") != str(job_id):
        return None
    return uuid.UUID(claims["t"])


def _authenticate(job_id: uuid.UUID) -> None:
    """Sets g.tenant_id from the ticket, else from the Authorization header, else 401."""
    ticket = request.args.get("ticket")
    if ticket is None:
        require_api_key()
        return
    tenant_id = _ticket_tenant(ticket, job_id)
    if tenant_id is None:
        abort(401, message="Invalid or expired ticket.", headers=CHALLENGE)
    g.tenant_id = tenant_id


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
                "`expires_in` seconds; `url`: the WebSocket URL with it.",
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
            "401": {"description": "No or bad API key."},
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
            "401": {"description": "No or bad API key or ticket."},
            "404": {"description": "No such job (or not yours)."},
            "422": {"description": "`last_event_id` is not an integer."},
        },
    )
    def get(self, job_id: uuid.UUID):
        """Follow a job over a WebSocket"""
        _authenticate(job_id)
        tenant_id = current_tenant()
        job = service.get_job(request_session(), tenant_id, job_id)
        if job is None:
            abort(404, message="No such job.")
        last_seen = _last_event_id()
        if request.headers.get("Upgrade", "").lower() != "websocket":
            abort(400, message="Expected a WebSocket handshake (Upgrade: websocket).")
        close_request_session()  # no connection is held while the socket is open
        ws = Server.accept(
            request.environ,
            ping_interval=services().settings.sse_keepalive,
            receive_bytes=1024,
            max_message_size=MAX_CLIENT_MESSAGE,  # clients have nothing to say; bigger: closed
        )
        try:
            _follow(ws, job_id, tenant_id, last_seen)
        except ConnectionClosed:
            pass
        finally:
            if ws.connected:  # the job vanished, or the loop failed
                ws.close(reason=CLOSE_GONE, message="gone")
        return _Done(ws.mode)


def _follow(ws: Server, job_id: uuid.UUID, tenant_id: uuid.UUID, last_seen: int) -> None:
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
