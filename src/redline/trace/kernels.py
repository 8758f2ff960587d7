"""Per-kernel facts: top kernels, launch statistics, memcpy/memset bandwidth, host syncs,
and stragglers across ranks."""

from __future__ import annotations

import bisect
from collections import defaultdict

from redline.core.record import record
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


@record
class KernelStat:
    """One kernel name's launches on a rank: count, time, share of the busy time."""

    name: str
    count: int
    total_us: float
    mean_us: float
    share_of_busy: float
    """Share of the union of device time on this rank, 0..1."""


def top_kernels(device: list[Event], n: int = 10,
                busy: list[tuple[float, float]] | None = None) -> list[KernelStat]:
    """The ``n`` kernels of most total time; ``busy``: the union of ``device``'s intervals, when
    the caller has it."""
    busy = merge([(x.ts, x.end) for x in device]) if busy is None else busy
    busy_us = sum(e - s for s, e in busy) or 1.0
    durations_by_name: dict[str, list[float]] = defaultdict(list)
    for e in device:
        if e.cat == "kernel":
            durations_by_name[e.name].append(e.dur)
    # a trace holds thousands of kernel names: records for the n largest only
    totals = {name: sum(durs) for name, durs in durations_by_name.items()}
    top = sorted(totals, key=lambda name: -totals[name])[:n]
    return [KernelStat(name=name, count=len(durations_by_name[name]), total_us=totals[name],
                       mean_us=totals[name] / len(durations_by_name[name]),
                       share_of_busy=totals[name] / busy_us)
            for name in top]


@record
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
        """The median (statistics.median's definition: the mean of the two middle values of
        an even count), without importing statistics (and its decimal and fractions)."""
        if not xs:
            return None
        ordered = sorted(xs)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    return LaunchStats(
        launches=len(gpu), cpu_launch_us_median=med(cpu), gpu_kernel_us_median=med(gpu),
        launch_delay_us_median=med(delay), short_kernels=short, short_kernel_us=short_us,
        runtime_outliers=sum(1 for c in cpu if c > RUNTIME_CUTOFF_US),
        delay_outliers=sum(1 for d in delay if d > LAUNCH_DELAY_CUTOFF_US),
    )


@record
class CopyStat:
    """Memcpy or memset of one kind on a rank: count, time, bytes and bandwidth."""

    kind: str
    """'Memcpy HtoD', 'Memcpy DtoH', 'Memcpy DtoD', 'Memcpy PtoP', 'Memset'."""
    count: int
    total_us: float
    bytes: int | None
    gb_per_s: float | None
    pageable: int
    """Copies from or to pageable host memory (they block the host)."""


def copy_stats(device: list[Event]) -> list[CopyStat]:
    copies_by_kind: dict[str, list[Event]] = defaultdict(list)
    for e in device:
        if e.cat in ("gpu_memcpy", "gpu_memset"):
            kind = "Memset" if e.name.startswith("Memset") else e.name[:11]
            copies_by_kind[kind].append(e)
    out = []
    for kind, copies in sorted(copies_by_kind.items()):
        known = [e for e in copies if e.nbytes >= 0]
        nbytes = sum(e.nbytes for e in known) if known else None
        known_us = sum(e.dur for e in known)
        out.append(CopyStat(
            kind=kind, count=len(copies), total_us=sum(e.dur for e in copies), bytes=nbytes,
            gb_per_s=nbytes / known_us / 1e3 if nbytes and known_us > 0 else None,
            pageable=sum(1 for e in copies if "Pageable" in e.name)))
    return out


@record
class SyncStat:
    """Host synchronizations of one kind."""

    name: str
    count: int
    host_blocked_us: float
    device_idle_after_us: float
    """Host syncs: device idle time right after each returned, until the next device event
    starts (the host had drained the device and had to refill it). Device-side waits
    (``cuda_sync`` events): their own duration."""


def host_syncs(events: list[Event],
               busy: list[tuple[float, float]] | None = None) -> list[SyncStat]:
    """Host syncs and device-side waits; ``busy``: the union of the device events' intervals,
    when the caller has it."""
    starts = sorted(e.ts for e in events if e.stream != -1)
    ends_sorted = (merge([(e.ts, e.end) for e in events if e.stream != -1]) if busy is None
                   else busy)  # merged: sorted already
    def idle_after(t: float) -> float:
        # If the device is busy at t, no idle follows; else the gap to the next device start.
        k = bisect.bisect_right(ends_sorted, (t, float("inf"))) - 1
        if k >= 0 and ends_sorted[k][1] > t:
            return 0.0
        j = bisect.bisect_left(starts, t)
        return starts[j] - t if j < len(starts) else 0.0

    calls_by_name: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        if e.stream == -1 and e.name in SYNC_APIS:
            calls_by_name[e.name].append(e)
    # A copy to pageable host memory blocks its launching call even when it is "Async".
    pageable_d2h = {e.corr for e in events
                    if e.cat == "gpu_memcpy" and e.name.startswith("Memcpy DtoH") and "Pageable" in e.name}
    for e in events:
        if e.stream == -1 and e.corr in pageable_d2h and e.cat in ("cuda_runtime", "cuda_driver"):
            calls_by_name[f"{e.name} (device→pageable host, blocking)"].append(e)
    out = [SyncStat(name=name, count=len(calls), host_blocked_us=sum(e.dur for e in calls),
                    device_idle_after_us=sum(idle_after(e.end) for e in calls))
           for name, calls in calls_by_name.items()]
    # Device-side waits recorded by CUPTI (cuda_sync): no host time, but the device stalls.
    waits_by_name: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        if e.cat == "cuda_sync":
            waits_by_name[f"{e.name} (device)"].append(e)
    out += [SyncStat(name=name, count=len(waits), host_blocked_us=0.0,
                     device_idle_after_us=sum(e.dur for e in waits))
            for name, waits in waits_by_name.items()]
    return sorted(out, key=lambda s: -(s.host_blocked_us + s.device_idle_after_us))


@record
class Straggler:
    """How late one rank arrives at the collectives it shares with the others."""

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
    return [Straggler(rank=r, collectives=n, last_arrivals=last[r],
                      mean_lateness_us=late[r] / n if n else 0.0) for r in ranks]
