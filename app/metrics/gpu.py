"""GPU memory and utilization, read through NVML at scrape time (never initialises CUDA,
so it is safe in a worker's main process before it forks). No NVML, no GPU metrics."""

from __future__ import annotations

import logging

from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)


class GpuCollector:
    def __init__(self, indexes: list[int]) -> None:
        self.indexes = indexes
        self._nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as exc:  # noqa: BLE001 - no driver, no library: no GPU metrics
            log.info("GPU metrics off: NVML unavailable (%s)", type(exc).__name__)

    def collect(self):
        if self._nvml is None:
            return
        nvml = self._nvml
        gpu = ["gpu"]
        used = GaugeMetricFamily("diffq_gpu_memory_used_bytes", "GPU memory in use", labels=gpu)
        total = GaugeMetricFamily("diffq_gpu_memory_total_bytes", "GPU memory in all", labels=gpu)
        util = GaugeMetricFamily(
            "diffq_gpu_utilization_ratio", "GPU busy fraction over NVML's last sample", labels=gpu
        )
        for index in self.indexes:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            except Exception as exc:  # noqa: BLE001
                log.warning("GPU %s metrics unavailable: %s", index, exc)
                continue
            used.add_metric([str(index)], memory.used)
            total.add_metric([str(index)], memory.total)
            util.add_metric([str(index)], rates.gpu / 100.0)
        yield from (used, total, util)
