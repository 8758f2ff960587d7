"""The time outside every timed phase, accounted for: split between the user's lines by the
stack sampler, GC pauses timed apart, and stalls that come back every k-th step.

The total outside the phases is exact (the step's wall time less its phases,
:attr:`redline.measure.step_record.StepRecord.other_s`); only its split between lines is sampled.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import TYPE_CHECKING

from redline.core.measurements import CodeSite, LoopWork, PeriodicStall
from redline.measure.stacks import CodeSampler, SiteKey, source_line
from redline.measure.stats import percentile
from redline.measure.step_record import PHASES, StepRecord

if TYPE_CHECKING:
    from redline.measure.recorder import Recorder

SITES_REPORTED = 10
"""Lines listed in the report, largest first."""

SLOW_STEP_RATIO = 2.0
"""A step is slow when it takes more than this many times the median step (and at least
:data:`SLOW_STEP_MIN_S` more): a stall that doubles a step is what a user sees in a step-time
plot."""

SLOW_STEP_MIN_S = 0.001
"""…and at least this many seconds more than the median (timer noise on sub-ms steps)."""

PERIOD_MIN_SLOW_STEPS = 4
"""Slow steps needed before a period is named."""

PERIOD_OFF_RATE = 0.25
"""Steps off the period may be slow at most a quarter as often as the steps on it."""

PERIOD_SPREAD = 0.5
"""The slow steps' extra times must agree: their median absolute deviation at most half their
median (one recurring piece of work, not chance stalls of every size)."""

PERIOD_AGREEMENT = 0.75
"""Share of the steps on the period's phase (step index mod k) that must be slow."""

PERIOD_MAX_STEPS = 64
"""Longest period looked for, in steps (the analysis reads the last 1,024 steps)."""


def _relative(path: str) -> str:
    if path.startswith("<"):
        return path
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return path if rel.startswith("..") else rel


def _site(key: SiteKey, fraction: float, samples: int) -> CodeSite:
    return CodeSite(file=_relative(key.file), line=key.line, function=key.function,
                    kind=key.kind, via=key.via, step_fraction=fraction, samples=samples,
                    text=source_line(key.file, key.line))


def loop_work(w: Recorder, steps: list[StepRecord]) -> LoopWork | None:
    """Where the measured steps' time outside the phases went; None without the sampler or
    measured time."""
    code, gcp = w.code, w.gc_pauses
    total = sum(step.step_s for step in steps)
    if code is None or total <= 0:
        return None
    other = sum(step.other_s for step in steps)
    # GC's own counters cover the whole measured window; the kept records may be a sample
    # of it (WatchConfig.steps_kept), each standing for `stride` steps.
    window_s = total * w.tracker.stride
    gc_out = gcp.outside_s / window_s if gcp is not None else 0.0
    rest = max(0.0, other / total - gc_out)  # outside the phases, GC pauses there apart
    sampled = code.outside_s
    # one row per line and kind: the library calls under it differ from sample to sample
    # (torch.save's _save, then its writer); the row keeps the one seen longest
    lines: dict[tuple[str, int, str, str], list[float]] = {}
    vias: dict[tuple[str, int, str, str], dict[str | None, float]] = {}
    for key, (sec, n_samples) in code.weights.items():
        row = (key.file, key.line, key.function, key.kind)
        acc = lines.setdefault(row, [0.0, 0.0])
        acc[0] += sec
        acc[1] += n_samples
        by_via = vias.setdefault(row, defaultdict(float))
        by_via[key.via] += sec
    sites: list[CodeSite] = []
    kinds: defaultdict[str, float] = defaultdict(float)
    for row, (sec, n_samples) in sorted(lines.items(), key=lambda kv: -kv[1][0]):
        frac = rest * sec / sampled if sampled > 0 else 0.0
        kinds[row[3]] += frac
        if len(sites) < SITES_REPORTED:
            via = max(vias[row].items(), key=lambda kv: kv[1])[0]
            sites.append(_site(SiteKey(*row, via), frac, int(n_samples)))
    if gc_out > 0:
        kinds["gc"] += gc_out
    full_sites: list[CodeSite] = []
    if gcp is not None:
        for (file, line, func), (sec, n_collections) in sorted(gcp.full_callers.items(),
                                                               key=lambda kv: -kv[1][0])[:SITES_REPORTED]:
            full_sites.append(_site(SiteKey(file, line, func, "gc", None), sec / window_s,
                                    int(n_collections)))
    return LoopWork(
        other_fraction=other / total,
        sampled_s=sampled,
        samples=sum(int(n_samples) for _, n_samples in code.weights.values()),
        interval_s=w.config.stack_sample_interval_s or 0.0,
        sites=sites,
        kind_fractions=dict(kinds),
        gc_pause_fraction=gcp.pause_s / window_s if gcp is not None else None,
        gc_collections=list(gcp.collections) if gcp is not None else [],
        gc_full_sites=full_sites,
        periodic=periodic_stall([step for step in w.tracker.recent if step.kind == "measured"], code),
    )


def _phase_s(s: StepRecord, phase: str) -> float:
    return s.other_s if phase == "other" else s.phases[PHASES.index(phase)]


def periodic_stall(steps: list[StepRecord], code: CodeSampler | None) -> PeriodicStall | None:
    """Every k-th step much slower (> :data:`SLOW_STEP_RATIO` × the median), over consecutive
    measured steps; None where no period holds."""
    if len(steps) < 4 * PERIOD_MIN_SLOW_STEPS:
        return None
    times = [step.step_s for step in steps]
    med = percentile(times, 50)
    bar = max(SLOW_STEP_RATIO * med, med + SLOW_STEP_MIN_S)
    # Every (period, residue) pair is tried: a step slowed by chance (a preempted host) lands
    # on any residue, a stall that comes back every k-th step on one. The pair kept is the one
    # whose slow steps add the most time (k = 5 beats k = 10, which holds half of them).
    # A chance slow step (preemption on a loaded host) is told apart three ways: the slow
    # steps of a period are most of the steps on it, rare elsewhere, and alike in size.
    all_slow = sum(1 for step in steps if step.step_s > bar)
    best: tuple[float, int, list[StepRecord]] | None = None
    for period in range(2, min(PERIOD_MAX_STEPS, len(steps) // PERIOD_MIN_SLOW_STEPS) + 1):
        groups: defaultdict[int, list[StepRecord]] = defaultdict(list)
        for step in steps:
            groups[step.index % period].append(step)
        for residue_steps in groups.values():
            slow = [step for step in residue_steps if step.step_s > bar]
            if len(slow) < PERIOD_MIN_SLOW_STEPS or len(slow) < PERIOD_AGREEMENT * len(residue_steps):
                continue
            off = len(steps) - len(residue_steps)
            if off and (all_slow - len(slow)) / off > PERIOD_OFF_RATE * len(slow) / len(residue_steps):
                continue
            extras = [step.step_s - med for step in slow]
            typical = percentile(extras, 50)
            spread = percentile([abs(e - typical) for e in extras], 50)
            if spread > PERIOD_SPREAD * typical:
                continue
            extra = sum(extras)
            if best is None or extra > best[0] * 1.01:
                best = (extra, period, slow)
    if best is None:
        return None
    _, period, slow = best
    slow_ids = {step.index for step in slow}
    normal = [step for step in steps if step.index not in slow_ids]
    extra = sum(step.step_s - med for step in slow)
    growth = {phase_name: (sum(_phase_s(step, phase_name) for step in slow) / len(slow)
                           - percentile([_phase_s(step, phase_name) for step in normal], 50))
              for phase_name in (*PHASES, "other")}
    phase = max(growth, key=growth.__getitem__)
    site = None
    if phase == "other" and code is not None:
        per: defaultdict[SiteKey, float] = defaultdict(float)
        for index, key, sec in code.per_step:
            if index in slow_ids:
                per[key] += sec
        if per:
            key, sec = max(per.items(), key=lambda kv: kv[1])
            share = sec / sum(times)
            site = _site(key, share, sum(1 for i, k, _ in code.per_step
                                         if k == key and i in slow_ids))
    return PeriodicStall(period_steps=period, slow_steps=len(slow),
                         extra_s_per_slow_step=extra / len(slow),
                         step_fraction=extra / sum(times), phase=phase, site=site)
