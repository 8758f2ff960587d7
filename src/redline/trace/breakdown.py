"""Temporal, idle-time and kernel-type breakdowns and communication/computation overlap.

Definitions follow Holistic Trace Analysis (HTA, ``hta/analyzers/breakdown_analysis.py``) and are
checked against its 0.5.0 numbers on real traces (tests/test_trace_parity.py):

* temporal: within the window from the first device event's start to the last one's end (all
  streams merged), idle = window − union of device events; compute = union of COMPUTATION
  events; non-compute = the rest.
* idle breakdown, per stream: the gap before each event is *host wait* when its launch began
  after the previous event ended (the host was late), *kernel wait* when shorter than
  ``kernel_wait_us`` (back-to-back launch latency), else *other*.
* kernel types: the union of each type's events, split where types overlap.
* overlap: share of communication time during which computation runs.
"""

from __future__ import annotations

from collections import defaultdict

from redline.core.record import record
from redline.trace.events import Event
from redline.trace.select import (
    COMMUNICATION,
    COMPUTATION,
    KERNEL_TYPES,
    kernel_type,
    runtime_launch_ts,
)

Interval = tuple[float, float]

KERNEL_WAIT_US = 30.0
"""HTA's ``consecutive_kernel_delay`` default. Documented as 30 ns, applied in trace units (µs)
by HTA (``hta/analyzers/breakdown_analysis.py``); kept in µs for parity."""


def merge(intervals: list[Interval]) -> list[Interval]:
    """Union of intervals, sorted and non-overlapping."""
    if not intervals:
        return []
    ordered = sorted(intervals)  # device events come nearly in order: timsort's best case
    out: list[Interval] = []
    start, end = ordered[0]
    for s, e in ordered:
        if s <= end:
            if e > end:
                end = e
        else:
            out.append((start, end))
            start, end = s, e
    out.append((start, end))
    return out


def total(intervals: list[Interval]) -> float:
    return sum(e - s for s, e in intervals)


def intersection(a: list[Interval], b: list[Interval]) -> float:
    """Total length of the intersection of two merged interval lists."""
    i = j = 0
    inter = 0.0
    na, nb = len(a), len(b)
    while i < na and j < nb:
        # comparisons rather than max()/min() calls: this loop runs once per interval of
        # both lists (thousands per rank) and the calls were most of its time
        a_start, a_end = a[i]
        b_start, b_end = b[j]
        lo = a_start if a_start > b_start else b_start
        hi = a_end if a_end < b_end else b_end
        if hi > lo:
            inter += hi - lo
        if a_end < b_end:
            i += 1
        else:
            j += 1
    return inter


@record
class Temporal:
    """Temporal breakdown of one rank, µs."""

    window_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float

    def pct(self, part: float) -> float:
        return 100.0 * part / self.window_us if self.window_us else 0.0


@record
class DeviceTime:
    """One rank's device intervals, merged once for every analysis that needs them."""

    busy: list[Interval]
    """The union of all device events."""
    by_type: dict[str, list[Interval]]
    """The union of each kernel type's events (:func:`~redline.trace.select.kernel_type`)."""

    def of(self, kind: str) -> list[Interval]:
        return self.by_type.get(kind, [])


def device_time(device: list[Event]) -> DeviceTime:
    """Merge ``device``'s intervals: all of them, and per kernel type (one pass)."""
    intervals: dict[str, list[Interval]] = defaultdict(list)
    everything: list[Interval] = []
    for e in device:
        span = (e.ts, e.end)
        everything.append(span)
        intervals[kernel_type(e)].append(span)
    return DeviceTime(busy=merge(everything),
                      by_type={kind: merge(spans) for kind, spans in intervals.items()})


def temporal(device: list[Event], merged: DeviceTime | None = None) -> Temporal | None:
    if not device:
        return None
    merged = device_time(device) if merged is None else merged
    busy = merged.busy
    window_us = busy[-1][1] - busy[0][0]
    idle_us = window_us - total(busy)
    compute_us = total(merged.of(COMPUTATION))
    return Temporal(window_us=window_us, idle_us=idle_us, compute_us=compute_us,
                    non_compute_us=window_us - idle_us - compute_us)


def kernel_types(device: list[Event], merged: DeviceTime | None = None) -> dict[str, float]:
    """µs per kernel type and per overlap of types ('COMPUTATION overlapping COMMUNICATION')."""
    merged = device_time(device) if merged is None else merged
    points: list[tuple[float, int]] = []
    for bit, kind in enumerate(KERNEL_TYPES):
        for s, e in merged.of(kind):
            points.append((s, 1 << bit))
            points.append((e, -(1 << bit)))
    points.sort(key=lambda p: p[0])
    # the label of each set of types running, named once (not once per interval boundary)
    labels = [" overlapping ".join(n for b, n in enumerate(KERNEL_TYPES) if running & (1 << b))
              for running in range(1 << len(KERNEL_TYPES))]
    out: dict[str, float] = defaultdict(float)
    running = 0
    for k, (t, delta) in enumerate(points):
        running += delta
        if running > 0 and k + 1 < len(points):
            out[labels[running]] += points[k + 1][0] - t
    return dict(out)


IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")


def idle_by_stream(events: list[Event], kernel_wait_us: float = KERNEL_WAIT_US,
                   hta_compat: bool = False) -> dict[int, dict[str, float]]:
    """Idle time per stream split into host wait / kernel wait / other (µs).

    Device-side synchronization events are left out (HTA 0.5.0 does the same here). HTA measures
    each gap from the end of the *previous* event, which goes negative when events on a stream
    overlap; redline measures from the latest end so far, unless ``hta_compat``.
    """
    launch = runtime_launch_ts(events)
    by_stream: dict[int, list[Event]] = defaultdict(list)
    for e in events:
        if e.stream != -1 and e.cat != "cuda_sync":
            by_stream[e.stream].append(e)
    out: dict[int, dict[str, float]] = {}
    for stream, evs in sorted(by_stream.items()):
        evs.sort(key=lambda e: e.ts)
        res: dict[str, float] = {c: 0.0 for c in IDLE_CATEGORIES}
        prev_end = evs[0].end
        for e in evs[1:]:
            gap = e.ts - prev_end
            if not hta_compat and gap < 0:
                gap = 0.0
            launched = launch.get(e.corr)
            if launched is not None and launched > prev_end:
                res["host_wait"] += gap
            elif gap < kernel_wait_us:
                res["kernel_wait"] += gap
            else:
                res["other"] += gap
            prev_end = e.end if hta_compat else max(prev_end, e.end)
        out[stream] = res
    return out


def comm_comp_overlap_pct(device: list[Event],
                          merged: DeviceTime | None = None) -> float | None:
    """% of communication time overlapped by computation; None without communication."""
    merged = device_time(device) if merged is None else merged
    comm = merged.of(COMMUNICATION)
    if not comm:
        return None
    comp = merged.of(COMPUTATION)
    span = total(comm)
    # zero-length communication kernels only (durations below the trace's resolution)
    return 100.0 * intersection(comm, comp) / span if span > 0 else None
