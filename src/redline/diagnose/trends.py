"""Slow decay within a run: memory that grows steadily (``memory_growth``), a step time that
trends up (``step_time_drift``) or alternates between two levels (``step_time_bimodal``).

Which finding covers what: a stall every k-th step is ``periodic_stall``
(:mod:`redline.diagnose.loop`); two levels with no period between them are
``step_time_bimodal``; a step time that climbs, or shifts up once and stays, is
``step_time_drift``. The start-up steps are reported apart (``measurements.drift.startup``) and
left out of all three.
"""

from __future__ import annotations

from redline.core.findings import Evidence, Finding, ceiling_speedup, severity_for
from redline.core.measurements import Measurements, MemoryCurve
from redline.diagnose.thresholds import (
    BIMODAL_DELAY_SHARE,
    BIMODAL_INTERLEAVED,
    BIMODAL_MIN_FRACTION,
    BIMODAL_MIN_RATIO,
    BIMODAL_MIN_SEPARATION,
    BIMODAL_MIN_SHARE,
    CONTENTION_EXPLAINS_SHARE,
    DRIFT_MIN_RISE_FRACTION,
    DRIFT_MIN_Z,
    DRIFT_NOISE_FACTOR,
    MEMORY_GROWTH_MIN_BYTES,
    MEMORY_GROWTH_MIN_FRACTION,
    MEMORY_HIGH_HOURS,
    MEMORY_LATE_SLOPE_SHARE,
    MEMORY_MEDIUM_HOURS,
    MEMORY_NOISE_FACTOR,
    MEMORY_TREND_MIN_Z,
)

_WHAT = {"host_rss": "Host memory (RSS)", "cuda_allocated": "Device memory allocated",
         "cuda_reserved": "Device memory reserved"}


def _mib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if abs(b) >= 2**30 else f"{b / 2**20:.1f} MiB"


def _who(c: MemoryCurve) -> str:
    if c.kind != "host_rss":
        return "of the device"
    return (f"of the training process (pid {c.pid})" if c.process == "main"
            else f"of DataLoader worker pid {c.pid}")


def growth_bytes(c: MemoryCurve) -> float:
    """The fitted growth over the measured window."""
    return (c.slope_bytes_per_hour or 0.0) * c.window_s / 3600


def grows(c: MemoryCurve) -> bool:
    """Whether a curve grows steadily: a trend beyond the noise, material, and not a plateau
    (thresholds: ``MEMORY_*``)."""
    if c.trend_z is None or c.slope_bytes_per_hour is None or c.slope_bytes_per_hour <= 0:
        return False
    g = growth_bytes(c)
    return (c.trend_z >= MEMORY_TREND_MIN_Z
            and g >= max(MEMORY_GROWTH_MIN_BYTES, MEMORY_GROWTH_MIN_FRACTION * c.start_bytes)
            and g >= MEMORY_NOISE_FACTOR * (c.noise_bytes or 0.0)
            and (c.late_slope_bytes_per_hour or 0.0)
            >= MEMORY_LATE_SLOPE_SHARE * c.slope_bytes_per_hour)


def memory_growth(m: Measurements) -> list[Finding]:
    """Memory of a process (or the device) that grows steadily through the measured window,
    with its slope per 1,000 steps and per hour and the time left to its limit."""
    mt = m.memory
    if mt is None:
        return []
    growing = [c for c in mt.curves if grows(c)]
    if not growing:
        return []
    # the curve closest to its limit first; unknown limits after, fastest first
    growing.sort(key=lambda c: (c.hours_to_limit is None, c.hours_to_limit or 0.0,
                                -(c.slope_bytes_per_hour or 0.0)))
    c = growing[0]
    per_hour = c.slope_bytes_per_hour or 0.0
    per_k = c.slope_bytes_per_1k_steps
    hours = c.hours_to_limit
    ev: Evidence = {
        "kind": c.kind, "process": c.process, "pid": c.pid,
        "slope_mib_per_1k_steps": None if per_k is None else round(per_k / 2**20, 3),
        "slope_mib_per_hour": round(per_hour / 2**20, 3),
        "growth_mib": round(growth_bytes(c) / 2**20, 3),
        "window_s": round(c.window_s, 3),
        "start_mib": round(c.start_bytes / 2**20, 3), "end_mib": round(c.end_bytes / 2**20, 3),
        "trend_z": round(c.trend_z or 0.0, 2),
        "noise_mib": round((c.noise_bytes or 0.0) / 2**20, 3),
        "limit_mib": None if c.limit_bytes is None else round(c.limit_bytes / 2**20, 1),
        "limit_source": c.limit_source,
        "hours_to_limit": None if hours is None else round(hours, 3),
        "curves_growing": len(growing),
    }
    for i, o in enumerate(growing[1:3], 2):
        ev[f"also_{i}"] = f"{o.kind} {o.process} pid {o.pid}: {_mib(o.slope_bytes_per_hour or 0)}/h"
    rate = (f"{_mib(per_k)} per 1,000 steps ({_mib(per_hour)} per hour)" if per_k is not None
            else f"{_mib(per_hour)} per hour")
    until = ("" if hours is None else
             f"; at this rate it reaches the {_mib(c.limit_bytes or 0)} limit "
             f"({c.limit_source}) in {hours:.1f} h")
    severity = ("medium" if hours is None else "high" if hours < MEMORY_HIGH_HOURS
                else "medium" if hours < MEMORY_MEDIUM_HOURS else "low")
    device = c.kind != "host_rss"
    fix = ("Something keeps memory from every step. Look for tensors stored across steps: a "
           "loss or output appended to a list keeps its autograd graph (store loss.item() or "
           "loss.detach() every k steps instead), caches keyed by step, growing Python lists "
           "or dicts. ")
    if device:
        fix += ("Record the allocations (torch.cuda.memory._record_memory_history(), then "
                "torch.cuda.memory._dump_snapshot() and https://pytorch.org/memory_viz) to see "
                "which stack allocates the blocks that are never freed.")
    elif c.process == "worker":
        fix += ("In a DataLoader worker: a dataset that caches samples in a Python container "
                "grows every worker's copy (and copy-on-access touches the parent's pages); "
                "cache in shared memory or a file, or bound the cache.")
    else:
        fix += ("tracemalloc (tracemalloc.start(), then compare snapshots a few hundred steps "
                "apart) names the Python lines that allocate what stays.")
    return [Finding(
        id="memory_growth", severity=severity,
        title=f"{_WHAT[c.kind]} {_who(c)} grows {rate}, from {_mib(c.start_bytes)} to "
        f"{_mib(c.end_bytes)} over {c.window_s:.0f} s{until}",
        evidence=ev, ceiling_speedup=None, fix=fix)]


def step_time_drift(m: Measurements) -> list[Finding]:
    """The steady steps' time trends up beyond the run's noise."""
    d = m.drift
    t = d.trend if d is not None else None
    if t is None:
        return []
    rise = t.end_s - t.start_s
    if (t.trend_z < DRIFT_MIN_Z or t.rise_fraction < DRIFT_MIN_RISE_FRACTION
            or rise < DRIFT_NOISE_FACTOR * t.noise_s):
        return []
    if t.run_delay_rise_s is not None and t.run_delay_rise_s >= CONTENTION_EXPLAINS_SHARE * rise:
        return []  # the loop waits for a CPU more as the run goes on: the host's load rose
    ev: Evidence = {
        "slope_ms_per_1k_steps": round(t.slope_s_per_1k_steps * 1e3, 3),
        "slope_ms_per_hour": (None if t.slope_s_per_hour is None
                              else round(t.slope_s_per_hour * 1e3, 3)),
        "start_ms": round(t.start_s * 1e3, 3), "end_ms": round(t.end_s * 1e3, 3),
        "rise_fraction": round(t.rise_fraction, 4), "trend_z": round(t.trend_z, 2),
        "noise_ms": round(t.noise_s * 1e3, 3), "steps": t.steps,
        "phase": t.phase,
        "phase_slope_ms_per_1k_steps": round(t.phase_slope_s_per_1k_steps * 1e3, 3),
        "extra_fraction": round(t.extra_fraction, 4),
        "run_delay_rise_ms": (None if t.run_delay_rise_s is None
                              else round(t.run_delay_rise_s * 1e3, 3)),
    }
    where = ("outside the measured phases (the loop's own code)" if t.phase == "other"
             else f"in {t.phase}")
    return [Finding(
        id="step_time_drift", severity=severity_for(t.extra_fraction),
        title=f"Step time rises from {t.start_s * 1e3:.1f} ms to {t.end_s * 1e3:.1f} ms over "
        f"{t.steps} steps (+{t.slope_s_per_1k_steps * 1e3:.1f} ms per 1,000 steps), most of it "
        f"{where}",
        evidence=ev, ceiling_speedup=ceiling_speedup(t.extra_fraction),
        fix=f"Something in {t.phase} does more work every step: a list or cache that the step "
        "walks and that grows (a history of losses summed each step, a growing buffer "
        "concatenated to), an autograd graph kept from step to step (a tensor carried over "
        "without .detach()), or memory growth that slows the allocator (see memory_growth). "
        "Compare a profile of an early step and of a late one (redline doctor --trace).")]


def step_time_bimodal(m: Measurements) -> list[Finding]:
    """The steady steps alternate between two step-time levels, with no period between them
    (a period is ``periodic_stall``'s) and no single shift (``step_time_drift``'s)."""
    d = m.drift
    md = d.modes if d is not None else None
    if md is None:
        return []
    lo, hi = BIMODAL_INTERLEAVED
    if (md.slow_s < BIMODAL_MIN_RATIO * md.fast_s
            or (md.separation is not None and md.separation < BIMODAL_MIN_SEPARATION)
            or not BIMODAL_MIN_SHARE <= md.slow_share <= 1 - BIMODAL_MIN_SHARE
            or md.extra_fraction < BIMODAL_MIN_FRACTION
            or not lo <= md.slow_first_half_share <= hi
            or (md.run_delay_fraction is not None
                and md.run_delay_fraction >= BIMODAL_DELAY_SHARE * md.extra_fraction)):
        return []  # (the last: the loop waited for a CPU as long as the slow level cost)
    if step_time_drift(m):
        return []  # a rising step time splits into an early and a late level: the drift's
    p = m.loop.periodic if m.loop is not None else None
    steps = d.trend.steps if d is not None and d.trend is not None else 0
    if p is not None and steps and p.slow_steps >= 0.5 * md.slow_share * steps:
        return []  # the slow steps come at a period: periodic_stall names it
    ev: Evidence = {
        "fast_ms": round(md.fast_s * 1e3, 3), "slow_ms": round(md.slow_s * 1e3, 3),
        "slow_share": round(md.slow_share, 4),
        "separation": None if md.separation is None else round(md.separation, 2),
        "slow_first_half_share": round(md.slow_first_half_share, 3),
        "extra_fraction": round(md.extra_fraction, 4), "phase": md.phase,
        "run_delay_fraction": (None if md.run_delay_fraction is None
                               else round(md.run_delay_fraction, 4)),
    }
    where = ("outside the measured phases" if md.phase == "other" else f"in {md.phase}")
    return [Finding(
        id="step_time_bimodal", severity=severity_for(md.extra_fraction),
        title=f"Steps take either {md.fast_s * 1e3:.1f} ms or {md.slow_s * 1e3:.1f} ms "
        f"({md.slow_share:.0%} slow, at no period), the difference {where}: "
        f"{md.extra_fraction:.0%} of the time",
        evidence=ev, ceiling_speedup=ceiling_speedup(md.extra_fraction),
        fix=f"Find what differs between fast and slow steps in {md.phase}: inputs of two sizes "
        "(variable-length batches: bucket them by length, or pad to a few fixed shapes), a "
        "branch taken on some steps, a cache that misses on some (a cold sample read from "
        "storage), or recompilation for a second shape (torch.compile's dynamic=True, or "
        "mark_dynamic). A profile of one slow and one fast step shows which.")]
