"""prometheus_client's multiprocess mode, set up before the library is first imported.

Counters and histograms written by several processes (gunicorn workers, Celery pool
children, their replacements) live in memory-mapped files under one directory per
service process tree; a scrape sums them. prometheus_client picks its storage when it is
first imported, so the directory must be in the environment before then.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

log = logging.getLogger(__name__)
ENV = "PROMETHEUS_MULTIPROC_DIR"


def use_directory(path: Path, *, fresh: bool = True) -> Path:
    """Point this process (and the children it will start) at `path`. `fresh` empties it:
    counters of an earlier run must not be added to this one's."""
    if "prometheus_client" in sys.modules and os.environ.get(ENV) != str(path):
        log.warning(
            "prometheus_client was imported before its multiprocess folder was set: this "
            "process's metrics stay in memory; start workers with `diffq worker`, or set %s",
            ENV,
        )
    if fresh and path.exists():
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    os.environ[ENV] = str(path)
    return path


def enabled() -> bool:
    path = os.environ.get(ENV)
    return bool(path) and Path(path).is_dir()


def registry():
    """A registry that reads every process's files (multiprocess mode), else the default."""
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    if not enabled():
        return REGISTRY
    collected = CollectorRegistry()
    MultiProcessCollector(collected)
    return collected
