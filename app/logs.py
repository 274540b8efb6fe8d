"""Logging for every diffq process: text or JSON lines (DIFFQ_LOG_FORMAT), and the job a
line is about (`job_id`, `tenant`, `attempt`) added to every line logged while a worker
runs that job, so that one grep or one log query follows a job through its attempts."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from app.broker.payload import GENERATE_TASK

JOB_FIELDS = ("job_id", "tenant", "attempt")
# transformers says once per image processor class that, without torchvision, it falls
# back to the class's PIL version; diffq needs no torchvision (no image processor runs
# unless a model keeps its safety checker, and the PIL version serves it).
TORCHVISION_FALLBACK = "requires torchvision (not installed); falling back to"
TORCHVISION_FALLBACK_LOGGER = "transformers.utils.import_utils"
# diffusers warns on `.to(dtype)` that a model's float32 modules may drift even when it
# has none ("... kept in float32: []"): nothing to act on (video models' transformers).
NO_FP32_MODULES = "that should be kept in float32: []"
NO_FP32_MODULES_LOGGER = "diffusers.models.modeling_utils"
_job: ContextVar[dict[str, Any] | None] = ContextVar("diffq_job", default=None)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@contextmanager
def job_context(**fields: Any) -> Iterator[None]:
    """Every record logged inside carries these fields (unless it sets its own)."""
    token = _job.set({k: str(v) for k, v in fields.items() if v is not None})
    try:
        yield
    finally:
        _job.reset(token)


class JobContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in (_job.get() or {}).items():
            if not hasattr(record, name):
                setattr(record, name, value)
        # Celery's own lines about a task ("received", "succeeded in") carry its id, which
        # is the job id: name it so, without logging the task's arguments.
        args = record.args
        if (
            not hasattr(record, "job_id")
            and isinstance(args, dict)
            and args.get("name") == GENERATE_TASK
            and args.get("id")
        ):
            record.job_id = str(args["id"])
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, process, message, job fields,
    Celery's task id and name where present, and the exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "process": record.processName,
            "pid": record.process,
            "message": record.getMessage(),
        }
        for name in (*JOB_FIELDS, "task_id", "task_name"):
            value = getattr(record, name, None)
            if value not in (None, "", "???"):
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class DropMessages(logging.Filter):
    """Drops the records whose message contains `text`."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def quiet_libraries(level: str) -> None:
    """Libraries' start-up chatter off every diffq process's output: alembic's INFO lines
    (its plugins set up on import, a migration context per readiness check) below
    DEBUG; transformers' torchvision fallback notices and diffusers' float32 warning about
    no modules at all, always. `diffq db upgrade`
    shows its migrations itself (cli/admin.py)."""
    alembic = logging.getLogger("alembic")
    alembic.setLevel(logging.NOTSET if str(level).upper() == "DEBUG" else logging.WARNING)
    for name, text in (
        (TORCHVISION_FALLBACK_LOGGER, TORCHVISION_FALLBACK),
        (NO_FP32_MODULES_LOGGER, NO_FP32_MODULES),
    ):
        source = logging.getLogger(name)
        if not any(isinstance(f, DropMessages) for f in source.filters):
            source.addFilter(DropMessages(text))


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def apply(logger: logging.Logger, log_format: str, *, keep_text: bool = False) -> None:
    """Give `logger`'s handlers the job filter, and the JSON format when asked (with
    `keep_text`, a text formatter already there, such as Celery's, is left alone)."""
    for handler in logger.handlers:
        if not any(isinstance(f, JobContextFilter) for f in handler.filters):
            handler.addFilter(JobContextFilter())
        if log_format == "json" or not keep_text:
            handler.setFormatter(formatter(log_format))


def configure(level: str, log_format: str) -> None:
    """The root logger of a diffq process that is not a Celery worker (a host that
    configured logging already, such as a test runner, keeps its handlers)."""
    quiet_libraries(level)
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(formatter(log_format))
        handler.addFilter(JobContextFilter())
        root.addHandler(handler)
    root.setLevel(level)
