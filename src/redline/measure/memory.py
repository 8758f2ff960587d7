"""Memory over the run: host RSS of the training process and of its DataLoader workers, and on
CUDA the caching allocator's allocated and reserved bytes, sampled off the step path.

The CPU sampler's thread (:class:`redline.measure.cpu.CpuSampler`) already reads each process's
RSS at every sample; it hands them to :meth:`MemorySampler.add`, which also reads
``torch.cuda.memory_allocated`` / ``memory_reserved`` (the allocator's counters: no
synchronization, no device call) and the steps closed so far (one integer). Nothing runs in
the training step. :func:`memory_timeline` fits each curve's growth over the measured window
(:mod:`redline.measure.trend`) for the report; the ``memory_growth`` rule judges it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import psutil
import torch

from redline.core.measurements import MemoryCurve, MemoryTimeline
from redline.measure.trend import evenly, fit

SAMPLES_KEPT = 4096
"""Samples kept at most: past this many, every other one is dropped and from then on only
every 2nd, 4th, ... sample is kept (a uniform sample of the whole run, as the step records;
4,096 at 0.2 s is 14 minutes before the first thinning)."""

POINTS_REPORTED = 120
"""Points of each curve in the report (evenly spaced): enough for a sparkline and a chart."""

FIT_POINTS = 120
"""Samples each memory fit reads at most (evenly spaced): three fits per curve and up to 11
curves, so ~7,000 pairs a fit keeps the report's build well under a second."""

WORKERS_REPORTED = 8
"""Worker curves in the report at most, the longest-lived first."""

CudaReader = Callable[[], tuple[int, int]]
"""Returns (allocated, reserved) bytes of the device."""


def cuda_reader(device: torch.device) -> CudaReader:
    """The caching allocator's current allocated and reserved bytes of ``device``
    (``torch.cuda.memory_allocated`` / ``memory_reserved``: host-side counters, no sync)."""
    def read() -> tuple[int, int]:
        return int(torch.cuda.memory_allocated(device)), int(torch.cuda.memory_reserved(device))
    return read


class MemorySampler:
    """The memory samples of one watch; :meth:`add` runs on the CPU sampler's thread."""

    def __init__(self, steps: Callable[[], int], cuda: CudaReader | None = None,
                 keep: int = SAMPLES_KEPT) -> None:
        self._steps = steps
        self._cuda = cuda
        self._keep = keep
        self._lock = threading.Lock()
        self._seen = 0
        self.stride = 1
        """Samples each kept one stands for."""
        self.samples: list[tuple[float, int, int, int | None, int | None, dict[int, int]]] = []
        """(perf_counter s, steps closed, main RSS, CUDA allocated, CUDA reserved,
        {worker pid: RSS}) per kept sample."""
        self.cuda_error: str | None = None
        """Why the device's memory could not be read, if it could not."""

    def add(self, t: float, main_rss: int, children: dict[int, int]) -> None:
        seen = self._seen
        self._seen += 1
        if seen % self.stride:
            return
        alloc = reserved = None
        if self._cuda is not None:
            try:
                alloc, reserved = self._cuda()
            except Exception as e:  # a driver error on a sampler thread must not end the run
                self.cuda_error = f"{type(e).__name__}: {e}"
                self._cuda = None
        row = (t, self._steps(), main_rss, alloc, reserved, children)
        with self._lock:
            self.samples.append(row)
            if len(self.samples) >= self._keep:
                self.stride *= 2
                self.samples = self.samples[::2]

    def latest(self) -> tuple[float, int, int, int | None, int | None, dict[int, int]] | None:
        """The last sample (read by the metrics endpoint's thread)."""
        with self._lock:
            return self.samples[-1] if self.samples else None

    def snapshot(self) -> list[tuple[float, int, int, int | None, int | None, dict[int, int]]]:
        with self._lock:
            return list(self.samples)


def _cgroup_headroom(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """memory.max − memory.current of this process's cgroup (v2), None where unlimited or
    unreadable."""
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((root / "memory.current").read_text()))
    except (OSError, ValueError):
        return None


def host_headroom() -> tuple[int | None, str | None]:
    """Bytes of memory this job may still take, and where that came from: the host's
    ``MemAvailable`` (psutil), lowered by the cgroup's remaining ``memory.max``."""
    try:
        avail: int | None = int(psutil.virtual_memory().available)
        src = "MemAvailable"
    except (OSError, RuntimeError):
        avail, src = None, None
    cgroup_left = _cgroup_headroom()
    if cgroup_left is not None and (avail is None or cgroup_left < avail):
        return cgroup_left, "cgroup memory.max − memory.current"
    return avail, src


def _curve(rows: list[tuple[float, int, int]], *, kind: str, process: str, pid: int | None,
           window_start: float | None, origin_s: float,
           limit: int | None, limit_source: str | None) -> MemoryCurve | None:
    """One curve from (t, steps, bytes) rows in time order."""
    if not rows:
        return None
    inside = [row for row in rows if window_start is None or row[0] >= window_start] or rows[-1:]
    by_t = fit([row[0] for row in inside], [float(row[2]) for row in inside], FIT_POINTS)
    by_step = fit([float(row[1]) for row in inside], [float(row[2]) for row in inside], FIT_POINTS)
    half = inside[len(inside) // 2:]
    late = fit([row[0] for row in half], [float(row[2]) for row in half], FIT_POINTS)
    end = rows[-1][2]
    per_hour = by_t.slope * 3600 if by_t is not None else None
    hours = None
    if limit is not None and per_hour is not None and per_hour > 0:
        hours = max(0.0, (limit - end) / per_hour)
    shown = [rows[i] for i in evenly(len(rows), POINTS_REPORTED)]
    return MemoryCurve(
        kind=kind, process=process, pid=pid,
        t_s=[round(row[0] - origin_s, 3) for row in shown], steps=[row[1] for row in shown],
        bytes=[row[2] for row in shown],
        start_bytes=inside[0][2], end_bytes=end, peak_bytes=max(row[2] for row in rows),
        window_s=inside[-1][0] - inside[0][0],
        window_samples=len(inside),
        slope_bytes_per_1k_steps=by_step.slope * 1000 if by_step is not None else None,
        slope_bytes_per_hour=per_hour,
        late_slope_bytes_per_hour=late.slope * 3600 if late is not None else None,
        trend_z=by_t.trend_z if by_t is not None else None,
        noise_bytes=by_t.noise if by_t is not None else None,
        limit_bytes=limit, limit_source=limit_source, hours_to_limit=hours)


def memory_timeline(sampler: MemorySampler, *, t_enter: float, window_start: float | None,
                    pid: int, interval_s: float,
                    device_total_bytes: int | None) -> MemoryTimeline | None:
    """Every curve ``sampler`` holds, fitted over the measured window (from ``window_start``;
    times reported from ``t_enter``); ``pid`` is the training process's. None without
    samples."""
    rows = sampler.snapshot()
    if not rows:
        return None
    headroom, src = host_headroom()
    origin_s, start = t_enter, window_start
    curves: list[MemoryCurve | None] = []

    def host_limit(end: int) -> int | None:
        return None if headroom is None else end + headroom

    main = [(row[0], row[1], row[2]) for row in rows]
    curves.append(_curve(main, kind="host_rss", process="main", pid=pid, window_start=start,
                         origin_s=origin_s, limit=host_limit(main[-1][2]), limit_source=src))
    workers: dict[int, list[tuple[float, int, int]]] = {}
    for row in rows:
        for pid, rss in row[5].items():
            workers.setdefault(pid, []).append((row[0], row[1], rss))
    longest = sorted(workers.items(), key=lambda kv: -len(kv[1]))[:WORKERS_REPORTED]
    for pid, pts in sorted(longest):
        curves.append(_curve(pts, kind="host_rss", process="worker", pid=pid,
                             window_start=start, origin_s=origin_s, limit=host_limit(pts[-1][2]),
                             limit_source=src))
    dev = [(row[0], row[1], row[3], row[4]) for row in rows if row[3] is not None and row[4] is not None]
    if dev:
        dsrc = "device total memory" if device_total_bytes is not None else None
        for kind, k in (("cuda_allocated", 2), ("cuda_reserved", 3)):
            pts = [(dev_row[0], dev_row[1], int(dev_row[k] or 0)) for dev_row in dev]
            curves.append(_curve(pts, kind=kind, process="main", pid=None, window_start=start,
                                 origin_s=origin_s, limit=device_total_bytes, limit_source=dsrc))
    return MemoryTimeline(interval_s=interval_s, samples=len(rows),
                          curves=[curve for curve in curves if curve is not None])
