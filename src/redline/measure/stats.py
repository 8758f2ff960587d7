"""Step-time statistics: percentiles, and which clock times a step.

Every statistic of step time in redline (the report, the tuner's trials and its rank test)
comes from here, so a step is timed one way everywhere.
"""

from __future__ import annotations

import math

from redline.measure.timeline import StepRecord


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    s = sorted(xs)
    k = max(0, math.ceil(q / 100 * len(s)) - 1)
    return s[k]


def step_times(steps: list[StepRecord]) -> list[float]:
    """Seconds per step, on whichever clock ran longer over each run of consecutive steps.

    Host step times are right while the host leads (data- or launch-bound loops). In a
    device-bound loop the host runs ahead, queueing kernels until CUDA's launch queue is full:
    over a window its host time can be shorter than the device's, and a throughput on the host
    clock would be the host's enqueue rate, not the device's speed (CUDA programming guide,
    "Asynchronous Concurrent Execution"). Where a run's device time (first work → last end)
    exceeds its host time, its steps are timed on the device's clock: from one step's first
    work to the next one's (the last: to its own end)."""
    out: list[float] = []
    run: list[StepRecord] = []
    for s in [*steps, None]:
        if s is not None and (not run or s.index == run[-1].index + 1):
            run.append(s)
            continue
        if run:
            host = [r.step_s for r in run]
            wins = [r.device_window_s for r in run]
            known = [w for w in wins if w is not None]
            if len(known) == len(wins) and known[-1][1] - known[0][0] > sum(host):
                ends = [w[0] for w in known[1:]] + [known[-1][1]]
                out += [e - w[0] for w, e in zip(known, ends, strict=True)]
            else:
                out += host
        run = [s] if s is not None else []
    return out


def wall_seconds(steps: list[StepRecord]) -> float:
    """The time ``steps`` took: Σ :func:`step_times`."""
    return sum(step_times(steps))


def span_fraction(steps: list[StepRecord]) -> float | None:
    """Σ device span ÷ :func:`wall_seconds` of the same steps; segments never overlap in
    stream order, so the fraction is at most 1 (a ratio over host time can exceed 1 when the
    host queues work ahead)."""
    total = wall_seconds(steps)
    return sum(s.device_s or 0.0 for s in steps) / total if total > 0 else None
