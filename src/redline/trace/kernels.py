"""Per-kernel facts: top kernels, launch statistics, memcpy/memset bandwidth, host syncs,
and stragglers across ranks."""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from dataclasses import dataclass

from redline.trace.breakdown import merge
from redline.trace.events import Event

LAUNCH_APIS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cuLaunchKernel",
    "cuLaunchKernelEx", "cudaGraphLaunch", "hipLaunchKernel", "hipExtModuleLaunchKernel",
    "hipModuleLaunchKernel", "hipGraphLaunch", "hipExtLaunchKernel",
})
"""Runtime calls that launch device work (CUDA and ROCm; HTA 0.5.0 matches only cuda*)."""

SYNC_APIS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
    "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize",
    "cudaMemcpy", "hipMemcpy",  # blocking copies
})
"""Runtime calls that block the host until the device catches up."""

RUNTIME_CUTOFF_US = 50.0
"""A launch call slower than this is an outlier (HTA ``runtime_cutoff``)."""
LAUNCH_DELAY_CUTOFF_US = 100.0
"""Device start − launch call end beyond this is an outlier (HTA ``launch_delay_cutoff``)."""


@dataclass(slots=True)
class KernelStat:
    name: str
    count: int
    total_us: float
    mean_us: float
    share_of_busy: float
    """Share of the union of device time on this rank, 0..1."""


def top_kernels(device: list[Event], n: int = 10) -> list[KernelStat]:
    busy = sum(e - s for s, e in merge([(x.ts, x.end) for x in device])) or 1.0
    by: dict[str, list[float]] = defaultdict(list)
    for e in device:
        if e.cat == "kernel":
            by[e.name].append(e.dur)
    stats = [KernelStat(k, len(v), sum(v), sum(v) / len(v), sum(v) / busy) for k, v in by.items()]
    return sorted(stats, key=lambda s: -s.total_us)[:n]


@dataclass(slots=True)
class LaunchStats:
    """Kernel launches matched to their runtime call (correlation id)."""

    launches: int
    cpu_launch_us_median: float | None
    gpu_kernel_us_median: float | None
    launch_delay_us_median: float | None
    """Device start − end of the launch call."""
    short_kernels: int
    """Kernels shorter than the CPU call that launched them (HTA's 'short GPU kernels')."""
    short_kernel_us: float
    runtime_outliers: int
    delay_outliers: int


def launch_stats(events: list[Event]) -> LaunchStats:
    launch = {e.corr: e for e in events if e.stream == -1 and e.name in LAUNCH_APIS and e.corr >= 0}
    cpu, gpu, delay = [], [], []
    short = 0
    short_us = 0.0
    for k in events:
        if k.stream == -1 or k.cat != "kernel":
            continue
        r = launch.get(k.corr)
        if r is None:
            continue
        cpu.append(r.dur)
        gpu.append(k.dur)
        delay.append(k.ts - r.end)
        if k.dur < r.dur:
            short += 1
            short_us += k.dur

    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    return LaunchStats(
        launches=len(gpu), cpu_launch_us_median=med(cpu), gpu_kernel_us_median=med(gpu),
        launch_delay_us_median=med(delay), short_kernels=short, short_kernel_us=short_us,
        runtime_outliers=sum(1 for c in cpu if c > RUNTIME_CUTOFF_US),
        delay_outliers=sum(1 for d in delay if d > LAUNCH_DELAY_CUTOFF_US),
    )


@dataclass(slots=True)
class CopyStat:
    kind: str
    """'Memcpy HtoD', 'Memcpy DtoH', 'Memcpy DtoD', 'Memcpy PtoP', 'Memset'."""
    count: int
    total_us: float
    bytes: int | None
    gb_per_s: float | None
    pageable: int
    """Copies from or to pageable host memory (they block the host)."""


def copy_stats(device: list[Event]) -> list[CopyStat]:
    by: dict[str, list[Event]] = defaultdict(list)
    for e in device:
        if e.cat in ("gpu_memcpy", "gpu_memset"):
            kind = "Memset" if e.name.startswith("Memset") else e.name[:11]
            by[kind].append(e)
    out = []
    for kind, evs in sorted(by.items()):
        t = sum(e.dur for e in evs)
        known = [e for e in evs if e.nbytes >= 0]
        nbytes = sum(e.nbytes for e in known) if known else None
        t_known = sum(e.dur for e in known)
        out.append(CopyStat(kind, len(evs), t,
                            nbytes, nbytes / t_known / 1e3 if nbytes and t_known > 0 else None,
                            sum(1 for e in evs if "Pageable" in e.name)))
    return out


@dataclass(slots=True)
class SyncStat:
    """Host synchronizations of one kind."""

    name: str
    count: int
    host_blocked_us: float
    device_idle_after_us: float
    """Host syncs: device idle time right after each returned, until the next device event
    starts (the host had drained the device and had to refill it). Device-side waits
    (``cuda_sync`` events): their own duration."""


def host_syncs(events: list[Event]) -> list[SyncStat]:
    starts = sorted(e.ts for e in events if e.stream != -1)
    ends_sorted = sorted(merge([(e.ts, e.end) for e in events if e.stream != -1]))
    def idle_after(t: float) -> float:
        # If the device is busy at t, no idle follows; else the gap to the next device start.
        k = bisect.bisect_right(ends_sorted, (t, float("inf"))) - 1
        if k >= 0 and ends_sorted[k][1] > t:
            return 0.0
        j = bisect.bisect_left(starts, t)
        return starts[j] - t if j < len(starts) else 0.0

    by: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        if e.stream == -1 and e.name in SYNC_APIS:
            by[e.name].append(e)
    # A copy to pageable host memory blocks its launching call even when it is "Async".
    pageable_d2h = {e.corr for e in events
                    if e.cat == "gpu_memcpy" and e.name.startswith("Memcpy DtoH") and "Pageable" in e.name}
    for e in events:
        if e.stream == -1 and e.corr in pageable_d2h and e.cat in ("cuda_runtime", "cuda_driver"):
            by[f"{e.name} (device→pageable host, blocking)"].append(e)
    out = [SyncStat(n, len(v), sum(e.dur for e in v), sum(idle_after(e.end) for e in v))
           for n, v in by.items()]
    # Device-side waits recorded by CUPTI (cuda_sync): no host time, but the device stalls.
    dev: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        if e.cat == "cuda_sync":
            dev[f"{e.name} (device)"].append(e)
    out += [SyncStat(n, len(v), 0.0, sum(e.dur for e in v)) for n, v in dev.items()]
    return sorted(out, key=lambda s: -(s.host_blocked_us + s.device_idle_after_us))


@dataclass(slots=True)
class Straggler:
    rank: int
    collectives: int
    last_arrivals: int
    """Collectives in which this rank arrived last (its kernel was the shortest: everyone else
    was already waiting in theirs)."""
    mean_lateness_us: float
    """Mean of (longest duration − this rank's duration) over collectives: how much later than
    the first rank it arrived (all leave together, so arrival = end − duration)."""


def stragglers(comm_by_rank: dict[int, list[Event]]) -> list[Straggler]:
    """Arrival skew at collectives, clock-independent.

    The n-th collective kernel of every rank is the same collective (NCCL issues them in order).
    All ranks leave it together, so the rank that arrived last spent the least time in it;
    per-rank step times are equal under DDP and hide this.
    """
    ranks = sorted(comm_by_rank)
    if len(ranks) < 2:
        return []
    seqs = {r: sorted(comm_by_rank[r], key=lambda e: e.ts) for r in ranks}
    n = min(len(s) for s in seqs.values())
    last = dict.fromkeys(ranks, 0)
    late: dict[int, float] = dict.fromkeys(ranks, 0.0)
    for i in range(n):
        durs = {r: seqs[r][i].dur for r in ranks}
        longest = max(durs.values())
        last[min(durs, key=lambda r: durs[r])] += 1
        for r in ranks:
            late[r] += longest - durs[r]
    return [Straggler(r, n, last[r], late[r] / n if n else 0.0) for r in ranks]
