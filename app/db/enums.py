"""The values the schema stores for a job: its status (the `job_status` type), its
priority (`job_priority`) and the AMQP priority it is published at. They live with the
schema so that persistence imports nothing of the domain; app/jobs/states.py, the
lifecycle, re-exports them beside its error codes (tests/unit/test_structure.py keeps
`app.db` below `app.jobs`).
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED})


class Priority(StrEnum):
    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"

    @property
    def amqp(self) -> int:
        """The AMQP message priority (queues declare x-max-priority=MAX_AMQP_PRIORITY)."""
        return {"low": 1, "normal": 5, "high": 9}[self.value]


MAX_AMQP_PRIORITY = 9
