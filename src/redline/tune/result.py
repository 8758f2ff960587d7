"""What ``redline tune`` returns: the plan, before/after measured side by side, and the planned
job projected at each speed."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from redline.core.findings import Limit
from redline.tune.batch_finder import BatchSearch
from redline.tune.kernels import AttentionSite
from redline.tune.precision import NumericsCheck

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


@dataclass(slots=True, kw_only=True)
class TrialMetrics:
    """What one configuration measured (None = unknown, with the source saying why)."""

    label: str
    throughput_samples_per_s: float | None
    step_time_s: float | None
    """Median seconds per optimizer step (one effective batch)."""
    data_wait_fraction: float | None
    device_busy_fraction: float | None
    """CUDA: Σ device span ÷ Σ step time (an upper bound of busy); None off CUDA."""
    mfu: float | None
    peak_memory_bytes: int | None
    peak_memory_source: str
    energy_j_per_step: float | None
    energy_source: str
    steps: int
    wall_s: float
    step_times_s: list[float] = field(default_factory=list)
    """Each measured step's wall seconds (for the significance test of a comparison)."""
    device_busy_kernels_fraction: float | None = None
    """Union of kernel intervals ÷ the traced window (1 − HTA's idle share), read from a short
    device-only profiler trace: the exact device busy of docs/report.md. None when not traced."""
    device_busy_kernels_source: str = "not traced for this trial"


@dataclass(slots=True, kw_only=True)
class Projection:
    """The planned job at a measured speed."""

    run_steps: int
    job_time_s: float | None
    cost: float | None
    """Currency units at the configured price per device-hour; None without a price."""
    energy_kwh: float | None


@dataclass(slots=True, kw_only=True)
class TuneResult:
    """What :func:`redline.tune.tune` found: the plan, the measured before/after trials and their
    projections, and the batch search and numerics checks behind them."""

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
        after, before = self.after.throughput_samples_per_s, self.before.throughput_samples_per_s
        return after / before if after and before else None


def project(metrics: TrialMetrics, run_steps: int, price: float | None, devices: int = 1,
            samples_per_step: int | None = None) -> Projection:
    """Job time, cost and energy of ``run_steps`` optimizer steps at ``m``'s speed.

    The job's time is its samples at the measured throughput (``samples_per_step`` per
    optimizer step over the whole job: every rank's): the one speed the before/after table
    compares, so "× faster" is the throughput's ratio, not a second figure from another
    statistic (the median step, which leaves out what slow steps cost a whole job). Without
    ``samples_per_step``, or where throughput is unknown, the median step time × the steps.
    """
    if samples_per_step is not None and metrics.throughput_samples_per_s:
        job_s: float | None = run_steps * samples_per_step / metrics.throughput_samples_per_s
    else:
        job_s = metrics.step_time_s * run_steps if metrics.step_time_s else None
    cost = job_s / 3600 * price * devices if job_s is not None and price is not None else None
    e = metrics.energy_j_per_step * run_steps / 3.6e6 if metrics.energy_j_per_step is not None else None
    return Projection(run_steps=run_steps, job_time_s=job_s, cost=cost, energy_kwh=e)


def merge_trials(trials: list[TrialMetrics]) -> TrialMetrics:
    """One row from alternating trials of one configuration: throughput over all measured
    steps, medians of step times, means of fractions; memory, MFU and energy from the trials
    that measured them."""

    def mean(values: list[float | None]) -> float | None:
        known = [value for value in values if value is not None]
        return statistics.fmean(known) if known else None

    steps = sum(metrics.steps for metrics in trials)
    throughputs = [(metrics.throughput_samples_per_s, metrics.steps) for metrics in trials
                   if metrics.throughput_samples_per_s]
    first = trials[0]
    return TrialMetrics(
        label=first.label,
        throughput_samples_per_s=(sum(throughput * steps_n for throughput, steps_n in throughputs)
                                  / sum(steps_n for _, steps_n in throughputs)
                                  if throughputs else None),
        step_time_s=mean([metrics.step_time_s for metrics in trials]),
        data_wait_fraction=mean([metrics.data_wait_fraction for metrics in trials]),
        device_busy_fraction=mean([metrics.device_busy_fraction for metrics in trials]),
        mfu=mean([metrics.mfu for metrics in trials]),
        peak_memory_bytes=next((metrics.peak_memory_bytes for metrics in trials
                                if metrics.peak_memory_bytes is not None), None),
        peak_memory_source=first.peak_memory_source,
        energy_j_per_step=mean([metrics.energy_j_per_step for metrics in trials]),
        energy_source=first.energy_source, steps=steps,
        wall_s=sum(metrics.wall_s for metrics in trials),
        step_times_s=[step_s for metrics in trials for step_s in metrics.step_times_s],
        device_busy_kernels_fraction=next((metrics.device_busy_kernels_fraction for metrics in trials
                                           if metrics.device_busy_kernels_fraction is not None), None),
        device_busy_kernels_source=next((metrics.device_busy_kernels_source for metrics in trials
                                         if metrics.device_busy_kernels_fraction is not None),
                                        first.device_busy_kernels_source))


def merge_ranks(rows: list[tuple[str, TrialMetrics]]) -> TrialMetrics:
    """The job's row from every rank's ``(host, metrics)`` of one trial, in rank order.

    Throughput adds up (each rank trains its own shard); a step lasts as long as the slowest
    rank's (the collectives hold the others), per step and in the median; data wait and peak
    memory are the worst rank's, since that rank is what the job waits for or what must fit;
    device busy and MFU are the ranks' mean. Energy adds up per device (NVML) but once per host
    for RAPL, whose counters cover the host's CPU packages that all its ranks share."""
    trials = [metrics for _, metrics in rows]
    if len(trials) == 1:
        return trials[0]

    def known(values: list[float | None]) -> list[float] | None:
        present = [value for value in values if value is not None]
        return present if len(present) == len(values) else None

    tps = known([metrics.throughput_samples_per_s for metrics in trials])
    steps = known([metrics.step_time_s for metrics in trials])
    waits = known([metrics.data_wait_fraction for metrics in trials])
    busy = known([metrics.device_busy_fraction for metrics in trials])
    mfu = known([metrics.mfu for metrics in trials])
    kbusy = known([metrics.device_busy_kernels_fraction for metrics in trials])
    peaks = [metrics.peak_memory_bytes for metrics in trials]
    steps_n = min(len(metrics.step_times_s) for metrics in trials)
    per_host = trials[0].energy_source.startswith("RAPL")
    first_on_host: dict[str, TrialMetrics] = {}
    for host, metrics in rows:
        first_on_host.setdefault(host, metrics)  # the host's lowest rank reads its counters
    energy_rows = list(first_on_host.values()) if per_host else trials
    energy = known([metrics.energy_j_per_step for metrics in energy_rows])
    first = trials[0]
    return TrialMetrics(
        label=first.label, throughput_samples_per_s=sum(tps) if tps else None,
        step_time_s=max(steps) if steps else None,
        data_wait_fraction=max(waits) if waits else None,
        device_busy_fraction=statistics.fmean(busy) if busy else None,
        mfu=statistics.fmean(mfu) if mfu else None,
        peak_memory_bytes=(max(peak for peak in peaks if peak is not None)
                           if all(peak is not None for peak in peaks) else None),
        peak_memory_source=f"{first.peak_memory_source} (the largest of {len(trials)} ranks)",
        energy_j_per_step=sum(energy) if energy else None,
        energy_source=(f"{first.energy_source}, summed over {len(energy_rows)} "
                       f"{'hosts' if per_host else 'ranks'}") if energy else first.energy_source,
        steps=min(metrics.steps for metrics in trials),
        wall_s=max(metrics.wall_s for metrics in trials),
        step_times_s=[max(metrics.step_times_s[i] for metrics in trials) for i in range(steps_n)],
        device_busy_kernels_fraction=statistics.fmean(kbusy) if kbusy else None,
        device_busy_kernels_source=(f"{first.device_busy_kernels_source} (mean of {len(trials)} "
                                    "ranks)" if kbusy else first.device_busy_kernels_source))
