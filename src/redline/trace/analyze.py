"""Facade: analyse one or more rank traces and collect the numbers (findings are judged by
:func:`redline.diagnose.diagnose_trace`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from redline.core.record import field, record
from redline.trace.breakdown import (
    Temporal,
    comm_comp_overlap_pct,
    device_time,
    idle_by_stream,
    kernel_types,
    temporal,
)
from redline.trace.events import HOST_COLLECTIVE_PREFIX, Event, RankTrace, TraceError
from redline.trace.families import KernelFamilies, kernel_families
from redline.trace.kernels import (
    CopyStat,
    KernelStat,
    LaunchStats,
    Straggler,
    SyncStat,
    copy_stats,
    host_syncs,
    launch_stats,
    stragglers,
    top_kernels,
)
from redline.trace.load import load_trace, trace_files
from redline.trace.select import COMMUNICATION, filter_iterations, kernel_type


@record
class RankAnalysis:
    """One rank's trace, analysed: device idle time per stream, kernel time by type, overlap of
    communication with compute, and the top kernels, launches, copies and syncs."""

    rank: int
    path: str
    device_name: str | None
    device_events: int
    temporal: Temporal | None
    idle_by_stream: dict[int, dict[str, float]]
    kernel_types_us: dict[str, float]
    comm_comp_overlap_pct: float | None
    top_kernels: list[KernelStat] = field(default_factory=list)
    launches: LaunchStats | None = None
    copies: list[CopyStat] = field(default_factory=list)
    syncs: list[SyncStat] = field(default_factory=list)
    families: KernelFamilies = field(default_factory=KernelFamilies)
    compute_capability: float | None = None
    left_out: dict[str, int] = field(default_factory=dict)
    """Events with unusable numbers left out of every statistic, by reason."""

    @property
    def idle_sum_over_streams(self) -> dict[str, float]:
        out: Counter[str] = Counter()
        for cats in self.idle_by_stream.values():
            out.update(cats)
        return {k: out.get(k, 0.0) for k in ("host_wait", "kernel_wait", "other")}


@record
class TraceAnalysis:
    """Results for a set of rank traces (one job)."""

    ranks: list[RankAnalysis]
    hta_compat: bool
    warnings: list[str] = field(default_factory=list)
    stragglers: list[Straggler] = field(default_factory=list)
    stragglers_source: str | None = None
    """What the arrival skew was read from: "device" (collective kernels) or "host" (gloo's
    host-side collectives, on jobs without collective kernels); None with fewer than 2 ranks."""
    stragglers_window_us: float = 0.0
    """The longest rank's analysed window on the same side (device busy span, or host span):
    the denominator of the straggler's share."""

    @property
    def kernel_types_us(self) -> dict[str, float]:
        """Kernel-type breakdown summed over ranks (as HTA reports it)."""
        out: Counter[str] = Counter()
        for r in self.ranks:
            out.update(r.kernel_types_us)
        return dict(out)


def analyze_rank(t: RankTrace, hta_compat: bool = False,
                 events: list[Event] | None = None) -> RankAnalysis:
    """One rank's analyses over ``events`` (default: :func:`filter_iterations` of ``t``)."""
    events = filter_iterations(t) if events is None else events
    device = [e for e in events if e.stream != -1]
    merged = device_time(device)
    return RankAnalysis(
        rank=t.rank, path=t.path, device_name=t.device_name, device_events=len(device),
        temporal=temporal(device, merged),
        idle_by_stream=idle_by_stream(events, hta_compat=hta_compat),
        kernel_types_us=dict(kernel_types(device, merged)),
        comm_comp_overlap_pct=comm_comp_overlap_pct(device, merged),
        top_kernels=top_kernels(device, busy=merged.busy), launches=launch_stats(events),
        copies=copy_stats(device), syncs=host_syncs(events, busy=merged.busy),
        families=kernel_families(device, merged),
        compute_capability=t.compute_capability,
        left_out={why: n for why, (n, _) in t.left_out.items()},
    )


def analyze_paths(paths: list[str | Path], hta_compat: bool = False) -> TraceAnalysis:
    """Analyse trace files (or folders of per-rank files).

    Args:
        paths: Kineto trace files (``.json`` / ``.json.gz``) and folders of them, one file per
            rank.
        hta_compat: round event times as Holistic Trace Analysis does (see :func:`load_trace`).

    Returns:
        One :class:`TraceAnalysis`: each rank's analysis in rank order, stragglers across ranks
        (from device collectives, else gloo's host collectives), and warnings about events left
        out or ranks without GPU events.

    Raises:
        TraceError: a file is missing, unreadable or malformed; two files claim the same rank.
    """
    files = trace_files(paths)
    traces = [load_trace(f, hta_compat=hta_compat) for f in files]
    seen: dict[int, str] = {}
    for t in traces:
        if t.rank in seen:
            raise TraceError(f"{t.path} and {seen[t.rank]} both say they are rank {t.rank}; "
                             "analyse one job's traces at a time")
        seen[t.rank] = t.path
    ordered = sorted(traces, key=lambda t: t.rank)
    result = TraceAnalysis(ranks=[], hta_compat=hta_compat)
    # per rank, from one pass of iteration filtering: collective kernels, gloo's host-side
    # collectives (CPU jobs), and the host span they are measured against
    device_comm: dict[int, list[Event]] = {}
    host_comm: dict[int, list[Event]] = {}
    host_span_us = 0.0
    for t in ordered:
        events = filter_iterations(t)
        result.ranks.append(analyze_rank(t, hta_compat, events))
        device_comm[t.rank] = [e for e in events
                               if e.stream != -1 and kernel_type(e) == COMMUNICATION]
        host_comm[t.rank] = [e for e in events if e.stream == -1
                             and e.name.startswith(HOST_COLLECTIVE_PREFIX)]
        if events:
            host_span_us = max(host_span_us,
                               max(e.end for e in events) - min(e.ts for e in events))
    if len(ordered) > 1 and any(device_comm.values()):
        result.stragglers_source = "device"
        result.stragglers_window_us = max((r.temporal.window_us for r in result.ranks
                                           if r.temporal), default=0.0)
        result.stragglers = stragglers(device_comm)
    elif len(ordered) > 1 and any(host_comm.values()):
        result.stragglers_source = "host"
        result.stragglers_window_us = host_span_us
        result.stragglers = stragglers(host_comm)
    else:  # one rank, or no collective seen: per-rank rows with nothing compared
        result.stragglers = stragglers(device_comm)
    for t in ordered:
        for why, (n, example) in t.left_out.items():
            result.warnings.append(f"{t.path}: {n} event(s) with a {why} left out of every "
                                   f"statistic (first: {example})")
    for r in result.ranks:
        if r.temporal is None:
            result.warnings.append(f"{r.path}: no GPU events (kernels, memcpy, memset) in the "
                                   "trace: was it recorded with ProfilerActivity.CUDA on a GPU?")
    return result
