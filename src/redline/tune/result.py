"""What ``redline tune`` returns: the plan, before/after measured side by side, and the planned
job projected at each speed."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from redline.core.findings import Limit
from redline.tune.batch_finder import BatchSearch
from redline.tune.kernels import AttentionSite
from redline.tune.plan import TunePlan
from redline.tune.precision import NumericsCheck
from redline.tune.trial import TrialMetrics


@dataclass(slots=True)
class Projection:
    """The planned job at a measured speed."""

    run_steps: int
    job_time_s: float | None
    cost: float | None
    """Currency units at the configured price per device-hour; None without a price."""
    energy_kwh: float | None


@dataclass(slots=True)
class TuneResult:
    plan: TunePlan
    before: TrialMetrics
    after: TrialMetrics
    before_projection: Projection
    after_projection: Projection
    run_steps_source: str
    price_per_device_hour: float | None
    batch_search: BatchSearch | None = None
    numerics: list[NumericsCheck] = field(default_factory=list)
    attention_sites: list[AttentionSite] = field(default_factory=list)
    reused_plan: str | None = None
    """Path of the remembered plan that was reused, if one was."""
    plan_path: str | None = None
    seconds: float = 0.0
    limits: list[Limit] = field(default_factory=list)
    """What still limits the tuned step (:func:`redline.diagnose.remaining_limits`)."""

    @property
    def speedup(self) -> float | None:
        a, b = self.after.throughput_samples_per_s, self.before.throughput_samples_per_s
        return a / b if a and b else None


def project(m: TrialMetrics, run_steps: int, price: float | None, devices: int = 1,
            samples_per_step: int | None = None) -> Projection:
    """Job time, cost and energy of ``run_steps`` optimizer steps at ``m``'s speed.

    The job's time is its samples at the measured throughput (``samples_per_step`` per
    optimizer step over the whole job: every rank's): the one speed the before/after table
    compares, so "× faster" is the throughput's ratio, not a second figure from another
    statistic (the median step, which leaves out what slow steps cost a whole job). Without
    ``samples_per_step``, or where throughput is unknown, the median step time × the steps.
    """
    if samples_per_step is not None and m.throughput_samples_per_s:
        t: float | None = run_steps * samples_per_step / m.throughput_samples_per_s
    else:
        t = m.step_time_s * run_steps if m.step_time_s else None
    cost = t / 3600 * price * devices if t is not None and price is not None else None
    e = m.energy_j_per_step * run_steps / 3.6e6 if m.energy_j_per_step is not None else None
    return Projection(run_steps, t, cost, e)


def merge_trials(ms: list[TrialMetrics]) -> TrialMetrics:
    """One row from alternating trials of one configuration: throughput over all measured
    steps, medians of step times, means of fractions; memory, MFU and energy from the trials
    that measured them."""

    def mean(xs: list[float | None]) -> float | None:
        v = [x for x in xs if x is not None]
        return statistics.fmean(v) if v else None

    steps = sum(m.steps for m in ms)
    tp = [(m.throughput_samples_per_s, m.steps) for m in ms if m.throughput_samples_per_s]
    first = ms[0]
    return TrialMetrics(
        first.label,
        sum(t * n for t, n in tp) / sum(n for _, n in tp) if tp else None,
        mean([m.step_time_s for m in ms]),
        mean([m.data_wait_fraction for m in ms]),
        mean([m.device_busy_fraction for m in ms]),
        mean([m.mfu for m in ms]),
        next((m.peak_memory_bytes for m in ms if m.peak_memory_bytes is not None), None),
        first.peak_memory_source,
        mean([m.energy_j_per_step for m in ms]),
        first.energy_source, steps, sum(m.wall_s for m in ms),
        step_times_s=[t for m in ms for t in m.step_times_s],
        device_busy_kernels_fraction=next((m.device_busy_kernels_fraction for m in ms
                                           if m.device_busy_kernels_fraction is not None), None),
        device_busy_kernels_source=next((m.device_busy_kernels_source for m in ms
                                         if m.device_busy_kernels_fraction is not None),
                                        first.device_busy_kernels_source))


def merge_ranks(rows: list[tuple[str, TrialMetrics]]) -> TrialMetrics:
    """The job's row from every rank's ``(host, metrics)`` of one trial, in rank order.

    Throughput adds up (each rank trains its own shard); a step lasts as long as the slowest
    rank's (the collectives hold the others), per step and in the median; data wait and peak
    memory are the worst rank's, since that rank is what the job waits for or what must fit;
    device busy and MFU are the ranks' mean. Energy adds up per device (NVML) but once per host
    for RAPL, whose counters cover the host's CPU packages that all its ranks share."""
    ms = [m for _, m in rows]
    if len(ms) == 1:
        return ms[0]

    def known(xs: list[float | None]) -> list[float] | None:
        v = [x for x in xs if x is not None]
        return v if len(v) == len(xs) else None

    tps = known([m.throughput_samples_per_s for m in ms])
    steps = known([m.step_time_s for m in ms])
    waits = known([m.data_wait_fraction for m in ms])
    busy = known([m.device_busy_fraction for m in ms])
    mfu = known([m.mfu for m in ms])
    kbusy = known([m.device_busy_kernels_fraction for m in ms])
    peaks = [m.peak_memory_bytes for m in ms]
    n = min(len(m.step_times_s) for m in ms)
    per_host = ms[0].energy_source.startswith("RAPL")
    first_on_host: dict[str, TrialMetrics] = {}
    for h, m in rows:
        first_on_host.setdefault(h, m)  # the host's lowest rank reads its counters
    energy_rows = list(first_on_host.values()) if per_host else ms
    energy = known([m.energy_j_per_step for m in energy_rows])
    first = ms[0]
    return TrialMetrics(
        first.label, sum(tps) if tps else None, max(steps) if steps else None,
        max(waits) if waits else None, statistics.fmean(busy) if busy else None,
        statistics.fmean(mfu) if mfu else None,
        max(p for p in peaks if p is not None) if all(p is not None for p in peaks) else None,
        f"{first.peak_memory_source} (the largest of {len(ms)} ranks)",
        sum(energy) if energy else None,
        (f"{first.energy_source}, summed over {len(energy_rows)} "
         f"{'hosts' if per_host else 'ranks'}") if energy else first.energy_source,
        min(m.steps for m in ms), max(m.wall_s for m in ms),
        step_times_s=[max(m.step_times_s[i] for m in ms) for i in range(n)],
        device_busy_kernels_fraction=statistics.fmean(kbusy) if kbusy else None,
        device_busy_kernels_source=(f"{first.device_busy_kernels_source} (mean of {len(ms)} "
                                    "ranks)" if kbusy else first.device_busy_kernels_source))
