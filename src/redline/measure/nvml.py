"""NVML sampler thread (optional extra ``redline[nvml]``, package ``nvidia-ml-py``).

What each number means, from the NVML API reference (``nvmlDeviceGetUtilizationRates`` and
neighbours):
* ``util_gpu``: % of the sample period (1/6 s to 1 s) with at least one kernel running. A single
  tiny kernel running all the time reads 100 %: a duty cycle, never efficiency.
* ``power_w``: board power; a 1 s average on Ampere (not GA100) and newer.
* energy: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since driver load, Volta+) delta over the
  window; updated every 20–100 ms, so very short windows read coarse.
* clock-event reasons: bitmask OR-ed over the window (``nvmlClocksEventReasons``).
* GPM SM-active / tensor-active (Hopper+), where the driver lets this process read them.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from types import ModuleType
from typing import Any

from redline.core.measurements import NvmlSummary

CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
"""``nvmlClocksEventReasons`` bits (NVML API docs)."""


def import_pynvml() -> tuple[ModuleType | None, str | None]:
    """The ``pynvml`` module from nvidia-ml-py, or None with the reason and the install hint."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install 'redline[nvml]')"
    return pynvml, None


SERIES_MAX = 100_000
"""Samples kept for the timeline (the most recent ones): 5.5 h at the default 0.2 s period."""


class NvmlSampler:
    """Samples one GPU in a daemon thread.

    Args:
        index: NVML device index (CUDA ordinal under the default CUDA_DEVICE_ORDER caveat).
        interval_s: sampling period.
        nvml: the pynvml module (injectable for tests).
    """

    def __init__(self, index: int, interval_s: float, nvml: ModuleType) -> None:
        self._nv = nvml
        self._interval = interval_s
        nvml.nvmlInit()
        self._h = nvml.nvmlDeviceGetHandleByIndex(index)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.series: collections.deque[tuple[float, float | None, float | None, float | None,
                                             float | None]] = collections.deque(
            maxlen=SERIES_MAX)
        """(host perf_counter s, util %, power W, memory used bytes, SM clock MHz) per sample,
        warm-up included (for the timeline export); None where a reading failed."""
        self._reset()
        self._gpm_reason: str | None = None
        self._gpm_supported = self._probe_gpm()

    def _reset(self) -> None:
        self._n = 0
        self._util: list[float] = []
        self._mem_util: list[float] = []
        self._power: list[float] = []
        self._clock: list[float] = []
        self._mem_peak: int | None = None
        self._reasons = 0
        self._energy0 = self._energy()
        self._gpm0: Any = None
        self._gpm_vals: dict[str, list[float]] = {"sm": [], "tensor": []}

    def _energy(self) -> float | None:
        try:
            return float(self._nv.nvmlDeviceGetTotalEnergyConsumption(self._h)) / 1e3
        except Exception:
            return None

    def _probe_gpm(self) -> bool:
        nvml_lib = self._nv
        if not hasattr(nvml_lib, "nvmlGpmQueryDeviceSupport"):
            self._gpm_reason = "this nvidia-ml-py has no GPM API"
            return False
        try:
            sup = nvml_lib.nvmlGpmQueryDeviceSupport(self._h)
            if not getattr(sup, "isSupportedDevice", 0):
                self._gpm_reason = "GPM not supported on this GPU (Hopper and newer only)"
                return False
        except Exception as e:
            self._gpm_reason = f"GPM query failed: {e}"
            return False
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="redline-nvml", daemon=True)
        self._thread.start()

    def mark(self) -> None:
        with self._lock:
            self._reset()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def sample(self) -> None:
        nvml_lib, handle = self._nv, self._h
        util = power = clock = used = None
        with self._lock:
            self._n += 1
            try:
                rates = nvml_lib.nvmlDeviceGetUtilizationRates(handle)
                util = float(rates.gpu)
                self._util.append(util)
                self._mem_util.append(float(rates.memory))
            except Exception:
                pass
            with contextlib.suppress(Exception):
                power = nvml_lib.nvmlDeviceGetPowerUsage(handle) / 1e3
                self._power.append(power)
            with contextlib.suppress(Exception):
                clock = float(nvml_lib.nvmlDeviceGetClockInfo(handle, nvml_lib.NVML_CLOCK_SM))
                self._clock.append(clock)
            try:
                used = int(nvml_lib.nvmlDeviceGetMemoryInfo(handle).used)
                self._mem_peak = max(self._mem_peak or 0, used)
            except Exception:
                pass
            self.series.append((time.perf_counter(), util, power,
                                None if used is None else float(used), clock))
            with contextlib.suppress(Exception):
                self._reasons |= int(nvml_lib.nvmlDeviceGetCurrentClocksEventReasons(handle))
            if self._gpm_supported:
                self._sample_gpm()

    def _sample_gpm(self) -> None:
        nvml_lib = self._nv
        try:
            gpm_sample = nvml_lib.nvmlGpmSampleAlloc()
            nvml_lib.nvmlGpmSampleGet(self._h, gpm_sample)
            if self._gpm0 is not None:
                metrics_get = nvml_lib.c_nvmlGpmMetricsGet_t()
                metrics_get.version = nvml_lib.NVML_GPM_METRICS_GET_VERSION
                metrics_get.numMetrics = 2
                metrics_get.sample1, metrics_get.sample2 = self._gpm0, gpm_sample
                metrics_get.metrics[0].metricId = nvml_lib.NVML_GPM_METRIC_SM_UTIL
                metrics_get.metrics[1].metricId = nvml_lib.NVML_GPM_METRIC_ANY_TENSOR_UTIL
                nvml_lib.nvmlGpmMetricsGet(metrics_get)
                self._gpm_vals["sm"].append(float(metrics_get.metrics[0].value))
                self._gpm_vals["tensor"].append(float(metrics_get.metrics[1].value))
                nvml_lib.nvmlGpmSampleFree(self._gpm0)
            self._gpm0 = gpm_sample
        except Exception as e:
            self._gpm_supported = False
            self._gpm_reason = f"GPM sampling failed (permissions?): {type(e).__name__}: {e}"

    def summary(self) -> NvmlSummary:
        self.sample()
        with self._lock:
            energy_now = self._energy()
            energy = (energy_now - self._energy0
                      if energy_now is not None and self._energy0 is not None else None)
            return NvmlSummary(
                samples=self._n,
                util_gpu_pct=_mean(self._util),
                util_memory_pct=_mean(self._mem_util),
                memory_used_peak_bytes=self._mem_peak,
                power_w=_mean(self._power),
                energy_j=energy,
                sm_clock_mhz=_mean(self._clock),
                clock_event_reasons=[reason for bit, reason in CLOCK_EVENT_REASONS.items()
                                     if self._reasons & bit],
                gpm_sm_active_pct=_mean(self._gpm_vals["sm"]),
                gpm_tensor_active_pct=_mean(self._gpm_vals["tensor"]),
                gpm_reason=self._gpm_reason,
            )


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
