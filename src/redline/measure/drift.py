"""How the step time moves within a run: the start-up steps told apart from the steady state,
a trend through the steady steps, and their split in two levels (docs/report.md, Definitions:
"start-up", "step-time drift", "two step-time levels").

Numbers only; the ``step_time_drift`` and ``step_time_bimodal`` rules judge them
(:mod:`redline.diagnose.trends`). A stall every k-th step is ``periodic_stall``'s
(:mod:`redline.measure.loop_work`), read from the same records.
"""

from __future__ import annotations

from collections.abc import Callable

from redline.core.measurements import StartupCost, StepModes, StepTrend
from redline.measure.stats import step_times
from redline.measure.step_record import EVALUATION, PHASES, StepRecord
from redline.measure.trend import fit, median, robust_sigma, two_levels

STARTUP_MIN_STEPS = 20
"""Steps (warm-up included) before the start-up is told apart: the steady level is the median
of the second half, which needs enough steps to be one."""

STARTUP_STEADY_RUN = 5
"""The steady state begins at the first step at the steady level of which the median of it and
the next 4 is at that level too."""

STARTUP_EXCESS = 0.5
"""A step is above the steady level when it takes > 1.5× the steady step time and more than
4 robust σ of the steady steps above it: a start-up step (compilation, cuDNN autotuning, a
cold cache) costs a multiple of a step, a loaded host's jitter a fraction of one."""

STARTUP_SIGMAS = 4.0

STARTUP_DELAY_SHARE = 0.5
"""Slow first steps are start-up, and left out of the statistics, only where the training
thread waited for a CPU for less than half their extra time: on a shared host a burst of other
processes' work slows the first steps as much as a compilation does, and its steps are the
job's steady state on that host."""

STARTUP_MATERIAL_SHARE = 0.01
"""Measured start-up steps are left out only where their time above the steady level is at
least 1 % of the measured steps' time: less moves the mean step time by under 1 %, and
leaving them out would drop what else those steps hold (an evaluation every k steps, a
stall's period) for no gain. Sub-millisecond steps on a loaded host stay above 1.5× their
level for dozens of steps at a few hundred µs each."""

TREND_MIN_STEPS = 30
"""Steady steps needed for a trend and two levels."""

PHASE_FIT_POINTS = 100
"""Points each phase's slope is fitted over (the step's own over 300)."""


def _phase_times(steps: list[StepRecord], phase: str) -> list[float]:
    if phase == "other":
        return [step.other_s for step in steps]
    k = PHASES.index(phase)
    return [step.phases[k] for step in steps]


def startup_cost(steps: list[StepRecord], stride: int,
                 delay_between: Callable[[float, float], float | None]) -> StartupCost | None:
    """The steps before the step time first settles at its steady level
    (:data:`STARTUP_STEADY_RUN`), over ``steps`` (every step not excluded, warm-up
    included, in order) timed without their evaluation phase, with the training thread's run
    delay over them
    (``delay_between(t0, t1)``); None with too few steps, thinned records, or no steady run in
    the first half."""
    if stride > 1 or len(steps) < STARTUP_MIN_STEPS:
        return None
    # an evaluation every k steps is the loop's own work, timed as its phase (evaluation_in_loop
    # judges it): a start-up that spans one would count its whole cost as start-up
    wall = step_times(steps)
    times = [max(0.0, step_s - step.phases[EVALUATION])
             for step, step_s in zip(steps, wall, strict=True)]
    n_steps = len(times)
    tail = times[n_steps // 2:]
    steady = median(tail)
    bar = max(steady * (1 + STARTUP_EXCESS), steady + STARTUP_SIGMAS * robust_sigma(tail))
    # the first step at the steady level with most of the next ones there too: a loaded
    # host's spikes in the steady state do not prolong the start-up
    first = next((j for j in range(n_steps // 2 + 1) if times[j] <= bar
                  and median(times[j:j + STARTUP_STEADY_RUN]) <= bar), None)
    if first is None:
        return None
    head = times[:first]
    extra = sum(max(0.0, step_s - steady) for step_s in head)
    delay = delay_between(steps[0].start_s, steps[first - 1].end_s) if first else 0.0
    # what leaving out is judged on: the start-up steps after the warm-up alone (the warm-up's
    # first step, holding compilation or the script's imports, would outweigh them)
    after = [j for j in range(first) if steps[j].kind == "measured"]
    extra_after = sum(max(0.0, times[j] - steady) for j in after)
    delay_after = (delay_between(steps[after[0]].start_s, steps[after[-1]].end_s) if after
                   else 0.0)
    measured_s = sum(step_s for step, step_s in zip(steps, wall, strict=True)
                     if step.kind == "measured")
    kept_because = (None if not after else
                    "delay_unknown" if delay_after is None else
                    "loaded_host" if delay_after >= STARTUP_DELAY_SHARE * extra_after else
                    "immaterial" if extra_after < STARTUP_MATERIAL_SHARE * measured_s else None)
    return StartupCost(
        steps=first, seconds=sum(head), extra_s=extra, steady_step_s=steady,
        first_step_s=times[0], steps_after_warmup=len(after),
        extra_after_warmup_s=extra_after, run_delay_s=delay,
        run_delay_after_warmup_s=delay_after, left_out=bool(after) and kept_because is None,
        kept_because=kept_because)


def _delay_per_step(steps: list[StepRecord],
                    delay_between: Callable[[float, float], float | None]) -> float | None:
    delay_s = delay_between(steps[0].start_s, steps[-1].end_s)
    return None if delay_s is None else delay_s / len(steps)


def step_trend(steps: list[StepRecord],
               delay_between: Callable[[float, float], float | None]) -> StepTrend | None:
    """The Theil–Sen line of the steady steps' times against their index, with the change of
    the training thread's run delay per step from the first third to the last; None with fewer
    than :data:`TREND_MIN_STEPS`."""
    if len(steps) < TREND_MIN_STEPS:
        return None
    times = step_times(steps)
    indices = [float(step.index) for step in steps]
    line = fit(indices, times)
    if line is None:
        return None
    mean_t = sum(times) / len(times)
    start = line.intercept + line.slope * indices[0]
    end = line.intercept + line.slope * indices[-1]
    mean_x = sum(indices) / len(indices)
    extra = max(0.0, line.slope * (mean_x - indices[0])) / mean_t if mean_t > 0 else 0.0
    slopes: dict[str, float] = {}
    for phase_name in (*PHASES, "other"):
        phase_line = fit(indices, _phase_times(steps, phase_name), PHASE_FIT_POINTS)
        slopes[phase_name] = phase_line.slope if phase_line is not None else 0.0
    phase = max(slopes, key=slopes.__getitem__)
    med = median(times)
    third = len(steps) // 3
    early_delay_s = _delay_per_step(steps[:third], delay_between)
    late_delay_s = _delay_per_step(steps[-third:], delay_between)
    return StepTrend(
        steps=len(steps), slope_s_per_1k_steps=line.slope * 1000,
        slope_s_per_hour=line.slope * 3600 / mean_t if mean_t > 0 else None,
        trend_z=line.trend_z, start_s=start, end_s=end, noise_s=line.noise,
        rise_fraction=(end - start) / med if med > 0 else 0.0, extra_fraction=min(1.0, extra),
        phase=phase, phase_slope_s_per_1k_steps=slopes[phase] * 1000,
        run_delay_rise_s=(None if early_delay_s is None or late_delay_s is None
                          else late_delay_s - early_delay_s))


def step_modes(steps: list[StepRecord],
               delay_between: Callable[[float, float], float | None]) -> StepModes | None:
    """The steady steps' times split in a fast and a slow level, with the training thread's
    run delay over them; None with fewer than :data:`TREND_MIN_STEPS` or all alike."""
    if len(steps) < TREND_MIN_STEPS:
        return None
    times = step_times(steps)
    split = two_levels(times)
    if split is None:
        return None
    fast = [times[i] for i in split.low]
    slow = [times[i] for i in split.high]
    fast_s = median(fast)
    fast_steps = [steps[i] for i in split.low]
    slow_steps = [steps[i] for i in split.high]
    diffs = {phase_name: (median(_phase_times(slow_steps, phase_name))
                          - median(_phase_times(fast_steps, phase_name)))
             for phase_name in (*PHASES, "other")}
    n_steps = len(times)
    total = sum(times)
    delay = delay_between(steps[0].start_s, steps[-1].end_s)
    return StepModes(
        fast_s=fast_s, slow_s=median(slow), slow_share=len(slow) / n_steps,
        separation=split.separation if split.separation != float("inf") else None,
        slow_first_half_share=sum(1 for i in split.high if i < n_steps / 2) / len(split.high),
        extra_fraction=sum(step_s - fast_s for step_s in slow) / total if total > 0 else 0.0,
        phase=max(diffs, key=diffs.__getitem__),
        run_delay_fraction=(None if delay is None or total <= 0
                            else min(1.0, delay / max(total, steps[-1].end_s - steps[0].start_s))))
