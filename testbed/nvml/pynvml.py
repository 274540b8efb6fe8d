"""A stand-in for NVML's Python binding, for a GPU worker on a machine without GPUs: put
this folder first on PYTHONPATH and the worker's GPU collector (app/metrics/gpu.py)
reads what the test wrote to $NVML_STANDIN_FILE (testbed.monitoring.NvmlStandIn), the
same figures for every GPU index, read again at every call."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace


def _reading() -> dict:
    with open(os.environ["NVML_STANDIN_FILE"]) as fh:
        return json.load(fh)


def nvmlInit() -> None:
    _reading()  # no file: NVML unavailable, as on a host without the driver


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return index


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    reading = _reading()
    return SimpleNamespace(used=reading["used"], total=reading["total"])


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    return SimpleNamespace(gpu=_reading()["gpu"], memory=0)
