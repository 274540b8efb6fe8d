"""What a delivery decides for its message, and a batch's further messages settled so."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Verdict(StrEnum):
    ACK = "ack"  # done with this message: the row says what happened
    # Acked too, but the message ran nothing to an outcome here: its job was canceled,
    # had finished, or is another worker's. Monitors (Flower) see it revoked, not succeeded.
    DISCARD = "discard"
    # Acked at the hand-over to post-processing: the outcome comes later (the lease keeps
    # the job meanwhile) and is reported then (WorkerRuntime.report).
    HANDED_OVER = "handed_over"
    DEAD_LETTER = "dead_letter"  # reject without requeue: the DLQ keeps it for operators
    REQUEUE = "requeue"  # handed back unfinished (shutdown): another worker takes it


class HandBack(StrEnum):
    """Why a run went back to the queue unfinished, without spending an attempt: said in
    its log line, and in the manifest's entry for the run that resumed it (`reason`)."""

    SHUTDOWN = "shutdown"  # the worker stops: a deploy, a spot notice
    YIELD = "yield"  # asked to yield, heard by notification (why: the row's yield_reason)
    PAUSED = "paused"  # its model was paused `now` (app/jobs/pauses.py)
    PREEMPTED = "preempted"  # an urgent job waits (app/housekeeping/preemption.py)
    # Its delivery neared the broker's consumer_timeout (app/catalog.py hand_back_margin).
    CONSUMER_TIMEOUT = "consumer_timeout"
    # Its delivery's Celery soft limit came while its budget across deliveries was left.
    TIME_LIMIT = "time_limit"

    @property
    def said(self) -> str:
        return {
            HandBack.SHUTDOWN: "worker shutting down",
            HandBack.YIELD: "asked to yield",
            HandBack.PAUSED: "asked to yield: its model was paused now",
            HandBack.PREEMPTED: "asked to yield: an urgent job waits",
            HandBack.CONSUMER_TIMEOUT: "its delivery nears the broker's consumer_timeout",
            HandBack.TIME_LIMIT: "its delivery's time limit came with its budget left",
        }[self]


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    reason: str


class Permit(Protocol):
    """One message taken for a batch, unacked until its job's outcome is durable."""

    payload: Any
    redelivered: bool

    def ack(self) -> None: ...

    def reject(self, requeue: bool) -> None: ...

    def pass_back(self) -> None:
        """Return an unused message to its queue, as it came (not marked redelivered)."""


def settle(permit: Permit, outcome: Outcome) -> None:
    """Ack or reject a member's message for its job's outcome, as the task does.

    A broker that went away meanwhile has already handed the message back (redelivered):
    its next delivery finds the job's outcome in the row, so a failed ack is only logged.
    """
    try:
        if outcome.verdict in (Verdict.ACK, Verdict.DISCARD, Verdict.HANDED_OVER):
            permit.ack()
        else:
            permit.reject(requeue=outcome.verdict == Verdict.REQUEUE)
    except Exception as exc:  # noqa: BLE001 - see above
        log.warning("settling a batch member's message failed (%s); it comes back", exc)
