"""Two sets of profiler (Kineto) traces compared: the verdict on their profiler steps, then the
kernels and operators behind the change, as Holistic Trace Analysis's trace diff lists them
(``hta/trace_diff.py``: each CPU operator and GPU kernel by name, its count and cumulative
duration in the control and the test traces, and which were added or removed), with each one's
share of its kind's time and the trace-level breakdowns (idle, compute) beside them.

Kernels come from redline's trace reader (the events after HTA's iteration filter: the last,
incomplete profiler step dropped). Operators (``cpu_op`` events, which the reader skips) are
read in a second pass of the same files over the same window.
"""

from __future__ import annotations

import gzip
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from redline.compare.model import (
    ALPHA,
    MIN_EFFECT_FRACTION,
    TRACES,
    Comparison,
    Difference,
    MetricDelta,
    OpDelta,
)
from redline.compare.stats import batch_sample
from redline.compare.verdict import step_test, verdict_of
from redline.trace.analyze import analyze_rank
from redline.trace.events import RankTrace
from redline.trace.load import STREAM_MIN_BYTES, load_trace, trace_files
from redline.trace.select import filter_iterations

OP_CHANGE_FRACTION = 0.10
"""A kernel or operator is 'slower' or 'faster' when its time moved by this share of its own
time *and* by :data:`OP_MIN_SHARE` of its kind's total: a 2× change of a 1 µs kernel is noise."""
OP_MIN_SHARE = 0.01
OPERATORS_MAX_BYTES = STREAM_MIN_BYTES
"""Operators are read from files below this size (larger ones are read for kernels only, by
the streaming reader, and the comparison says their operators were not read)."""


@dataclass(slots=True, kw_only=True)
class TraceSide:
    """What one set of traces holds for a comparison."""

    source: str
    ranks: list[int]
    devices: list[str | None]
    world_size: int | None = None
    """The job's number of ranks as its first trace declares it (``distributedInfo``); None
    where it does not say."""
    steps: int
    """Profiler steps analysed on the first rank (the last, incomplete one dropped)."""
    step_times_s: list[float]
    """The first rank's analysed ProfilerStep durations (host clock), in order."""
    kernels: dict[str, list[float]] = field(default_factory=dict)
    """Name → [count, total µs], summed over ranks."""
    operators: dict[str, list[float]] | None = None
    """Name → [count, total µs] of top-level and nested ``cpu_op`` events; None when not read."""
    metrics: dict[str, float | None] = field(default_factory=dict)


def _raw_events(path: Path) -> list[Any] | None:
    if path.stat().st_size >= OPERATORS_MAX_BYTES:
        return None
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = orjson.loads(raw)
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    return events if isinstance(events, list) else None


def _marks(events: list[tuple[str, str, float, float]]) -> list[tuple[float, float]]:
    """(start, duration) of each distinct host ProfilerStep annotation, in time order."""
    marks: dict[str, tuple[float, float]] = {}
    for name, cat, ts, dur in events:
        if cat == "user_annotation" and name.startswith("ProfilerStep"):
            marks.setdefault(name, (ts, dur))
    return sorted(marks.values())


def _step_times(events: list[tuple[str, str, float, float]]) -> list[float]:
    """The analysed steps' durations in seconds: every ProfilerStep but the last (incomplete)
    one, as the iteration filter keeps them; none with fewer than two."""
    marks = _marks(events)
    return [dur / 1e6 for _, dur in marks[:-1]] if len(marks) >= 2 else []


def _ops(raw: list[Any]) -> dict[str, list[float]]:
    """Operators (``cpu_op``) by name, [count, total µs], that start before the last profiler
    step (the window the iteration filter keeps)."""
    marks = _marks([(str(e.get("name", "")), str(e.get("cat")), float(e["ts"]), float(e["dur"]))
                    for e in raw if isinstance(e, dict) and e.get("ph") == "X"
                    and isinstance(e.get("ts"), int | float)
                    and isinstance(e.get("dur"), int | float)
                    and str(e.get("name", "")).startswith("ProfilerStep")])
    cutoff = marks[-1][0] if len(marks) >= 2 else float("inf")
    ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in raw:
        if isinstance(e, dict) and e.get("cat") == "cpu_op" and e.get("ph") == "X":
            ts, dur = e.get("ts"), e.get("dur")
            if isinstance(ts, int | float) and isinstance(dur, int | float) and ts < cutoff:
                entry = ops[str(e.get("name", ""))]
                entry[0] += 1
                entry[1] += float(dur)
    return dict(ops)


def _declared_world_size(trace: RankTrace) -> int | None:
    info = trace.metadata.get("distributedInfo")
    ws = info.get("world_size") if isinstance(info, dict) else None
    return ws if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0 else None


def read_side(paths: list[str], source: str) -> TraceSide:
    """Read a set of traces (files or folders, one job's ranks) for comparison.

    Raises:
        TraceError: a file is missing, unreadable or malformed.
    """
    files = trace_files(list(paths))
    traces = sorted((load_trace(f) for f in files), key=lambda t: t.rank)
    side = TraceSide(source=source, ranks=[t.rank for t in traces],
                     devices=[t.device_name for t in traces], steps=0, step_times_s=[],
                     world_size=next((ws for ws in map(_declared_world_size, traces)
                                      if ws is not None), None))
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    operators: dict[str, list[float]] | None = defaultdict(lambda: [0.0, 0.0])
    for i, t in enumerate(traces):
        events = filter_iterations(t)
        for e in events:
            if e.stream != -1:
                entry = kernels[e.name]
                entry[0] += 1
                entry[1] += e.dur
        if i == 0:
            side.step_times_s = _step_times([(e.name, e.cat, e.ts, e.dur) for e in t.events])
            side.steps = len(side.step_times_s)
        raw = _raw_events(Path(t.path))
        if raw is None:
            operators = None
        else:
            ops = _ops(raw)
            if operators is not None:
                for name, (count, us) in ops.items():
                    operators[name][0] += count
                    operators[name][1] += us
        if i == 0:
            ra = analyze_rank(t, events=events)
            tb = ra.temporal
            per = side.steps or 1
            side.metrics = {
                "idle_pct": None if tb is None else tb.pct(tb.idle_us),
                "compute_pct": None if tb is None else tb.pct(tb.compute_us),
                "non_compute_pct": None if tb is None else tb.pct(tb.non_compute_us),
                "window_us_per_step": None if tb is None else tb.window_us / per,
                **{f"idle_{k}_us_per_step": v / per
                   for k, v in ra.idle_sum_over_streams.items()},
                **{f"kernel_type_{k}_us_per_step": v / per
                   for k, v in ra.kernel_types_us.items()},
                "comm_comp_overlap_pct": ra.comm_comp_overlap_pct,
            }
    side.kernels = dict(kernels)
    side.operators = dict(operators) if operators is not None else None
    return side


def _op_deltas(before: dict[str, list[float]], after: dict[str, list[float]], kind: str,
               scale_b: float, scale_a: float) -> list[OpDelta]:
    total_b = sum(v[1] for v in before.values()) * scale_b
    total_a = sum(v[1] for v in after.values()) * scale_a
    out = []
    for name in {*before, *after}:
        cb, ub = (x * scale_b for x in before.get(name, [0.0, 0.0]))
        ca, ua = (x * scale_a for x in after.get(name, [0.0, 0.0]))
        if cb == 0:
            change = "added"
        elif ca == 0:
            change = "removed"
        elif (abs(ua - ub) >= OP_CHANGE_FRACTION * ub
              and abs(ua - ub) >= OP_MIN_SHARE * max(total_b, total_a)):
            change = "slower" if ua > ub else "faster"
        else:
            change = "unchanged"
        out.append(OpDelta(name=name, kind=kind, change=change, before_count=cb,
                           after_count=ca, before_us=ub, after_us=ua, delta_us=ua - ub,
                           before_share=ub / total_b if total_b else None,
                           after_share=ua / total_a if total_a else None))
    return sorted(out, key=lambda d: (-abs(d.delta_us), d.name))


def _text(v: int | None) -> str | None:
    return None if v is None else str(v)


def compare_sides(before: TraceSide, after: TraceSide, *,
                  min_effect_fraction: float = MIN_EFFECT_FRACTION,
                  alpha: float = ALPHA) -> Comparison:
    """Compare two read sets of traces (:func:`read_side`)."""
    notes: list[str] = []
    per_step = before.steps > 0 and after.steps > 0
    sb_scale = 1 / before.steps if per_step else 1.0
    sa_scale = 1 / after.steps if per_step else 1.0
    if not per_step:
        notes.append("a side has no complete profiler step: kernels and operators are the "
                     "totals of each analysed window, not per step")
    test = None
    if len(before.step_times_s) >= 2 and len(after.step_times_s) >= 2:
        test = step_test(batch_sample(before.step_times_s), batch_sample(after.step_times_s),
                         "step_time")
    mean_b = (sum(before.step_times_s) / len(before.step_times_s)
              if before.step_times_s else None)
    mean_a = sum(after.step_times_s) / len(after.step_times_s) if after.step_times_s else None
    verdict = verdict_of(
        test, min_effect_fraction=min_effect_fraction, alpha=alpha,
        step_time_before_s=mean_b, step_time_after_s=mean_a, throughput_before=None,
        throughput_after=None,
        unknown_reason=(f"fewer than 2 analysed profiler steps (before {before.steps}, after "
                        f"{after.steps}): no step times to test; the kernels below still show "
                        "what changed"))
    notes.append("step times are the first rank's ProfilerStep annotations (host clock); "
                 "the batch size is not in a trace: throughput is unknown")
    differences = []
    if before.world_size != after.world_size:
        differences.append(Difference(
            field="world_size", before=_text(before.world_size), after=_text(after.world_size),
            consequence="jobs of different numbers of ranks (as their traces declare): each "
            "rank's share of the work, its collectives and their waits differ with it"))
    if len(before.ranks) != len(after.ranks):
        differences.append(Difference(
            field="ranks_given", before=str(len(before.ranks)), after=str(len(after.ranks)),
            consequence="traces of different numbers of ranks: kernel and operator numbers are "
            "summed over each side's ranks"))
    for name, side in (("before", before), ("after", after)):
        if side.world_size is not None and len(side.ranks) < side.world_size:
            notes.append(f"{name}: traces of {len(side.ranks)} of the job's {side.world_size} "
                         "ranks given: its kernels and operators are those ranks' only")
    if before.devices[:1] != after.devices[:1]:
        differences.append(Difference(
            field="device_name", before=str(before.devices[0]), after=str(after.devices[0]),
            consequence="different devices: the difference is the hardware's as much as the "
            "code's"))
    if before.steps != after.steps:
        differences.append(Difference(
            field="profiler_steps", before=str(before.steps), after=str(after.steps),
            consequence="numbers are per step" if per_step else "totals over windows of "
            "different length"))
    operators: list[OpDelta] = []
    if before.operators is not None and after.operators is not None:
        operators = _op_deltas(before.operators, after.operators, "operator", sb_scale,
                               sa_scale)
    else:
        notes.append(f"operators not read: a trace file is ≥ {OPERATORS_MAX_BYTES >> 20} MiB "
                     "(kernels are compared)")
    metrics = []
    for name in [*before.metrics, *(k for k in after.metrics if k not in before.metrics)]:
        b, a = before.metrics.get(name), after.metrics.get(name)
        if b is None and a is None:
            continue
        delta = None if b is None or a is None else a - b
        metrics.append(MetricDelta(name=name, before=b, after=a, delta=delta,
                                   delta_fraction=(None if delta is None or not b
                                                   else delta / abs(b))))
    return Comparison(
        kind=TRACES, before_source=before.source, after_source=after.source, verdict=verdict,
        differences=differences, metrics=metrics,
        kernels=_op_deltas(before.kernels, after.kernels, "kernel", sb_scale, sa_scale),
        operators=operators, per="step" if per_step else "trace", notes=notes)


def compare_traces(before: list[str], after: list[str], *,
                   min_effect_fraction: float = MIN_EFFECT_FRACTION,
                   alpha: float = ALPHA) -> Comparison:
    """Compare two sets of traces (files or folders, each one job's ranks).

    Args:
        before: the baseline traces.
        after: the traces judged against them.
        min_effect_fraction: the smallest relative change called a regression or improvement.
        alpha: significance level of the two-sided test.

    Returns:
        The comparison, its verdict first, the kernels and operators by |Δ time|.

    Raises:
        TraceError: a file is missing, unreadable or malformed.
    """
    return compare_sides(read_side(before, " ".join(before)), read_side(after, " ".join(after)),
                         min_effect_fraction=min_effect_fraction, alpha=alpha)
