"""The job lifecycle, its error codes and priorities.

queued -> running -> succeeded | failed | canceled; queued -> failed | canceled.
"""

from __future__ import annotations

from enum import StrEnum

from app.db.enums import MAX_AMQP_PRIORITY, TERMINAL, JobStatus, Priority

__all__ = ["MAX_AMQP_PRIORITY", "TERMINAL", "ErrorCode", "JobStatus", "Priority"]


class ErrorCode(StrEnum):
    INVALID_INPUT = "invalid_input"
    INVALID_MESSAGE = "invalid_message"
    MODEL_UNAVAILABLE = "model_unavailable"
    GPU_OOM = "gpu_oom"
    TIMEOUT = "timeout"
    STORAGE_UNAVAILABLE = "storage_unavailable"
    DEAD_LETTERED = "dead_lettered"
    INTERNAL = "internal_error"
    CONTENT_FILTERED = "content_filtered"  # the model's safety checker blacked every image
    # The database refused the outcome's content (a value it cannot store): never retried.
    OUTCOME_REFUSED = "outcome_refused"
    # Why a job ended canceled:
    CANCELED = "canceled"  # the client asked
    DEADLINE = "deadline"  # not started before its cancel_after
    EXPIRED = "expired"  # not started within its batch's completion window
