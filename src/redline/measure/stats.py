"""Step-time statistics: percentiles, and which clock times a step.

Every statistic of step time in redline (the report, the tuner's trials and its rank test)
comes from here, so a step is timed one way everywhere.
"""

from __future__ import annotations

import math

from redline.measure.step_record import StepRecord


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list.

    Args:
        xs: the values (non-empty; any unit).
        q: the percentile, 0..100.

    Returns:
        The smallest value with at least q % of the values at or below it, in ``xs``'s unit.
    """
    ordered = sorted(xs)
    k = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[k]


def step_times(steps: list[StepRecord]) -> list[float]:
    """Seconds per step, on whichever clock ran longer over each run of consecutive steps.

    Host step times are right while the host leads (data- or launch-bound loops). In a
    device-bound loop the host runs ahead, queueing kernels until CUDA's launch queue is full:
    over a window its host time can be shorter than the device's, and a throughput on the host
    clock would be the host's enqueue rate, not the device's speed (CUDA programming guide,
    "Asynchronous Concurrent Execution"). Where a run's device time (first work → last end)
    exceeds its host time, its steps are timed on the device's clock: from one step's first
    work to the next one's (the last: to its own end).

    Args:
        steps: the step records, in order; a gap in their indices starts a new run.

    Returns:
        One time per step, seconds, in the order of ``steps``.
    """
    out: list[float] = []
    run: list[StepRecord] = []
    for step in [*steps, None]:
        if step is not None and (not run or step.index == run[-1].index + 1):
            run.append(step)
            continue
        if run:
            host = [run_step.step_s for run_step in run]
            wins = [run_step.device_window_s for run_step in run]
            known = [window for window in wins if window is not None]
            if len(known) == len(wins) and known[-1][1] - known[0][0] > sum(host):
                ends = [window[0] for window in known[1:]] + [known[-1][1]]
                out += [e - window[0] for window, e in zip(known, ends, strict=True)]
            else:
                out += host
        run = [step] if step is not None else []
    return out


def wall_seconds(steps: list[StepRecord]) -> float:
    """The time ``steps`` took: Σ :func:`step_times`.

    Args:
        steps: the step records.

    Returns:
        Seconds (0.0 for no steps).
    """
    return sum(step_times(steps))


def span_fraction(steps: list[StepRecord]) -> float | None:
    """Σ device span ÷ :func:`wall_seconds` of the same steps; segments never overlap in
    stream order, so the fraction is at most 1 (a ratio over host time can exceed 1 when the
    host queues work ahead).

    Args:
        steps: the step records (a step without a device span counts 0 s of it).

    Returns:
        The fraction, 0..1; None when the steps took no time.
    """
    total = wall_seconds(steps)
    return sum(step.device_s or 0.0 for step in steps) / total if total > 0 else None
