"""Two doctor reports (``redline doctor --json``) compared: the verdict on their step times,
then phases, findings, host and device metrics, and how the runs differ otherwise.

Reports are read as the JSON documents they are (``redline/report/schema.json``), field by
field with ``.get``: a report of an older schema is compared on what it holds, and what it
lacks is said, never guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from redline.compare.model import (
    ALPHA,
    MIN_EFFECT_FRACTION,
    REPORTS,
    Comparison,
    Difference,
    FindingChange,
    MetricDelta,
    PhaseDelta,
)
from redline.compare.shape import check_report
from redline.compare.stats import Sample, batch_sample, summary_sample
from redline.compare.verdict import step_test, verdict_of
from redline.core.report import SCHEMA_VERSION

METRIC_CHANGE_FRACTION = 0.10
"""A host or device metric is listed when it moved by at least this share of its value."""
METRIC_MIN_CHANGE = {"_fraction": 0.01, "_pct": 1.0, "_cores": 0.05}
"""…and, for a share or a core count (by its name's unit), by at least this much: a share that
moved by less than 1 point is below the smallest share any rule acts on (1 %:
``WORKER_RESPAWN_MIN_FRACTION``, ``PAGEABLE_H2D_MIN_FRACTION`` in diagnose/thresholds.py), and
0.05 of a core is a fifth of the smallest core count one does (``OTHERS_MIN_CORES``, 0.25).
Without it a share of 0.0001 that read 0 in the other run was listed as −100 %."""
CEILING_CHANGE_FRACTION = 0.10
"""A finding present in both runs is 'changed' when its ceiling moved by this share."""
CONTENTION_CHANGE_FRACTION = 0.10
"""Runs whose training threads waited for a CPU (run delay) for shares of their windows this
far apart ran under different host load: the verdict's size is checked with the waits taken
out (Linux schedstat's run delay: time runnable but waiting on a run queue, kernel
Documentation/scheduler/sched-stats.rst)."""
BATCH_CHANGE_FRACTION = 0.01
"""Samples per step that differ by more than this are a different batch: tested per sample."""


def _num(v: Any) -> float | None:
    """A finite number as a float; anything else (null, text, NaN) is unknown."""
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _at(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTimes:
    """One report's step times as a test can use them."""

    sample: Sample | None
    source: str
    """Where they came from: 'step_times_s', 'timeline', 'p50/p95', or why there are none."""
    times_s: list[float] | None


def step_times(doc: dict[str, Any]) -> StepTimes:
    """The measured step times of a report: ``timing.step_times_s`` (the clock of the mean),
    else the timeline's measured steps (host clock), else the weaker p50/p95 summary."""
    timing = _at(doc, "measurements", "timing") or {}
    listed = timing.get("step_times_s")
    times: list[float] | None = None
    source = "step_times_s"
    if isinstance(listed, list) and len(listed) >= 2:
        times = [float(x) for x in listed if _num(x) is not None]
    else:
        rows = _at(doc, "timeline", "steps")
        if isinstance(rows, list):
            times = [float(r[2]) for r in rows
                     if isinstance(r, list) and len(r) > 3 and r[3] == "measured"
                     and _num(r[2]) is not None]
            source = "timeline"
    if times is not None and len(times) >= 2:
        return StepTimes(sample=batch_sample(times), source=source, times_s=times)
    mean, n = _num(timing.get("step_time_mean_s")), timing.get("steps_measured")
    if mean is not None and isinstance(n, int):
        sample = summary_sample(mean_s=mean, p50_s=_num(timing.get("step_time_p50_s")),
                                p95_s=_num(timing.get("step_time_p95_s")), steps=n)
        if sample is not None:
            return StepTimes(sample=sample, source="p50/p95", times_s=None)
    return StepTimes(sample=None, times_s=None,
                     source="no step times (fewer than 2 measured steps, or none recorded)")


def _scaled(sample: Sample, by: float) -> Sample:
    return Sample(mean_s=sample.mean_s / by, n=sample.n, std_s=sample.std_s / by,
                  steps=sample.steps, method=sample.method)


def world_size(doc: dict[str, Any]) -> int:
    ws = _at(doc, "ranks", "world_size")
    return ws if isinstance(ws, int) else 1


def compare_reports(before: dict[str, Any], after: dict[str, Any], *, before_source: str,
                    after_source: str, min_effect_fraction: float = MIN_EFFECT_FRACTION,
                    alpha: float = ALPHA) -> Comparison:
    """Compare two doctor reports (their JSON documents).

    Args:
        before: the baseline report.
        after: the report judged against it.
        before_source: what ``before`` was read from (a path), for the output.
        after_source: the same for ``after``.
        min_effect_fraction: the smallest relative change called a regression or improvement.
        alpha: significance level of the two-sided test.

    Returns:
        The comparison, its verdict first.

    Raises:
        CompareInputError: a report of a newer schema, or with a field that holds something
            else than a report's (cut short or edited), naming its source and the field.
    """
    check_report(before, before_source)
    check_report(after, after_source)
    notes: list[str] = []
    differences = context_differences(before, after)
    tb, ta = (_at(d, "measurements", "timing") or {} for d in (before, after))
    st_b, st_a = step_times(before), step_times(after)
    for side, st in (("before", st_b), ("after", st_a)):
        if st.source == "p50/p95":
            notes.append(f"{side}: the report lists no step times (written before "
                         "timing.step_times_s); its spread is estimated from p50 and p95, a "
                         "weaker test")
        elif st.source == "timeline":
            notes.append(f"{side}: step times read from the timeline (host clock), the report "
                         "has no timing.step_times_s")
    spb_b, spb_a = _num(tb.get("samples_per_step")), _num(ta.get("samples_per_step"))
    metric, sb, sa = "step_time", st_b.sample, st_a.sample
    if (spb_b and spb_a and abs(spb_a / spb_b - 1) > BATCH_CHANGE_FRACTION
            and sb is not None and sa is not None):
        metric, sb, sa = "time_per_sample", _scaled(sb, spb_b), _scaled(sa, spb_a)
        notes.append(f"the batches differ ({spb_b:g} → {spb_a:g} samples per step): the verdict "
                     "is on the time per sample (1 ÷ throughput), not the step time")
    test = step_test(sb, sa, metric) if sb is not None and sa is not None else None
    wait_b = _num(_at(before, "measurements", "host", "main_thread_run_delay_fraction"))
    wait_a = _num(_at(after, "measurements", "host", "main_thread_run_delay_fraction"))
    contention = None
    if (wait_b is not None and wait_a is not None
            and abs(wait_a - wait_b) >= CONTENTION_CHANGE_FRACTION):
        contention = (wait_b, wait_a)
        differences.append(Difference(
            field="host.main_thread_run_delay_fraction", before=f"{wait_b:.0%}",
            after=f"{wait_a:.0%}",
            consequence="the training thread waited for a CPU for different shares of the "
            "runs (other load on the host): part of any difference is the machine's; the "
            "verdict's size is checked with the waits taken out"))
    verdict = verdict_of(
        test, min_effect_fraction=min_effect_fraction, alpha=alpha,
        step_time_before_s=_num(tb.get("step_time_mean_s")),
        step_time_after_s=_num(ta.get("step_time_mean_s")),
        throughput_before=_num(tb.get("throughput_samples_per_s")),
        throughput_after=_num(ta.get("throughput_samples_per_s")),
        unknown_reason=f"no step times to test: before {st_b.source}; after {st_a.source}",
        contention=contention)
    return Comparison(kind=REPORTS, before_source=before_source, after_source=after_source,
                      verdict=verdict, differences=differences,
                      phases=phase_deltas(before, after), findings=finding_changes(before, after),
                      metrics=metric_deltas(before, after), notes=notes)


def _command(report: dict[str, Any]) -> str | None:
    """The command a report measured, as one line (None where it names none)."""
    command = report.get("command")
    if isinstance(command, list) and command:
        return " ".join(str(word) for word in command)
    return command if isinstance(command, str) and command else None


def context_differences(before: dict[str, Any], after: dict[str, Any]) -> list[Difference]:
    """What differs between the runs besides their speed, each with what it means here."""
    rows: list[tuple[str, Any, Any, str]] = [
        ("schema", before.get("schema"), after.get("schema"),
         f"fields one schema lacks are unknown on that side (this redline writes "
         f"{SCHEMA_VERSION})"),
        ("redline_version", before.get("redline_version"), after.get("redline_version"),
         "measured by different redline versions: definitions may have changed"),
        ("torch_version", before.get("torch_version"), after.get("torch_version"),
         "a different PyTorch: kernels and overheads can differ on their own"),
        ("device", _at(before, "measurements", "device", "type"),
         _at(after, "measurements", "device", "type"),
         "different devices: the difference is the hardware's as much as the code's"),
        ("device_name", _at(before, "measurements", "device", "name"),
         _at(after, "measurements", "device", "name"),
         "different device models: the difference is the hardware's as much as the code's"),
        ("world_size", world_size(before), world_size(after),
         "a different number of ranks: step times and throughput are rank 0's, per rank"),
        ("command", _command(before), _command(after),
         "a different command: the runs may train different programs or settings"),
        ("batch_size", _at(before, "measurements", "config", "batch_size"),
         _at(after, "measurements", "config", "batch_size"),
         "a different batch: the step does different work; compared per sample"
         if all(_at(d, "measurements", "config", "batch_size") is not None
                for d in (before, after))
         else "the batch is unknown on one side: compared per step, taken as the same work"),
        ("precision", _at(before, "measurements", "config", "precision"),
         _at(after, "measurements", "config", "precision"),
         "a different precision: numerics differ as well as speed"),
        ("torch_threads", _at(before, "measurements", "config", "torch_threads"),
         _at(after, "measurements", "config", "torch_threads"),
         "a different intra-op thread count"),
        ("cpus_available", _at(before, "measurements", "host", "cpus_available"),
         _at(after, "measurements", "host", "cpus_available"),
         "a different CPU allowance"),
        ("status", before.get("status"), after.get("status"),
         "the runs ended differently: a shortened run may not be representative"),
    ]
    lb = _at(before, "measurements", "config", "loader") or {}
    la = _at(after, "measurements", "config", "loader") or {}
    if isinstance(lb, dict) and isinstance(la, dict):
        for key in sorted(set(lb) | set(la)):
            rows.append((f"loader.{key}", lb.get(key), la.get(key),
                         "a different DataLoader setting"))
    return [Difference(field=name, before=None if b is None else str(b),
                       after=None if a is None else str(a), consequence=why)
            for name, b, a, why in rows if b != a]


def phase_deltas(before: dict[str, Any], after: dict[str, Any]) -> list[PhaseDelta]:
    """Each phase's mean ms per step and share, both sides (a phase either side measured)."""
    def by_phase(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
        rows = _at(doc, "measurements", "breakdown") or []
        return {r["phase"]: r for r in rows if isinstance(r, dict) and "phase" in r}

    pb, pa = by_phase(before), by_phase(after)
    out = []
    for phase in [*pb, *(p for p in pa if p not in pb)]:
        b, a = pb.get(phase, {}), pa.get(phase, {})
        bm, am = _num(b.get("mean_s")), _num(a.get("mean_s"))
        if not bm and not am:
            continue
        out.append(PhaseDelta(
            phase=phase, before_ms=None if bm is None else bm * 1e3,
            after_ms=None if am is None else am * 1e3,
            delta_ms=None if bm is None or am is None else (am - bm) * 1e3,
            before_fraction=_num(b.get("fraction")), after_fraction=_num(a.get("fraction"))))
    return out


def finding_changes(before: dict[str, Any], after: dict[str, Any]) -> list[FindingChange]:
    """Findings (by id and rank) that appeared, vanished, or changed severity or ceiling."""
    def by_key(doc: dict[str, Any]) -> dict[tuple[str, int | None], dict[str, Any]]:
        return {(f["id"], f.get("rank")): f for f in doc.get("findings") or []
                if isinstance(f, dict) and "id" in f}

    fb, fa = by_key(before), by_key(after)
    out = []
    for key in [*fa, *(k for k in fb if k not in fa)]:
        b, a = fb.get(key), fa.get(key)
        if b is not None and a is not None:
            cb, ca = _num(b.get("ceiling_speedup")), _num(a.get("ceiling_speedup"))
            moved = (cb is None) != (ca is None) or (
                cb is not None and ca is not None and cb > 0
                and abs(ca / cb - 1) >= CEILING_CHANGE_FRACTION)
            if b.get("severity") == a.get("severity") and not moved:
                continue
            change = "changed"
        else:
            change = "appeared" if a is not None else "vanished"
        ref = a if a is not None else b
        assert ref is not None
        out.append(FindingChange(
            id=key[0], change=change, title=str(ref.get("title", "")), rank=key[1],
            before_severity=None if b is None else b.get("severity"),
            after_severity=None if a is None else a.get("severity"),
            before_ceiling_speedup=None if b is None else _num(b.get("ceiling_speedup")),
            after_ceiling_speedup=None if a is None else _num(a.get("ceiling_speedup"))))
    return out


METRIC_SECTIONS = ("host", "device_metrics", "mfu", "nvml")
"""Sections of ``measurements`` whose numbers are compared (their numeric fields)."""
NOT_COMPARED = frozenset({"host.cpus_available", "host.torch_threads", "host.workers_seen",
                          "mfu.peak_flops_per_s", "nvml.samples"})
"""Numbers that describe the setup, not its behaviour (said as differences instead)."""


def metric_deltas(before: dict[str, Any], after: dict[str, Any],
                  min_change: float = METRIC_CHANGE_FRACTION) -> list[MetricDelta]:
    """Host, device, MFU and NVML numbers that moved by ≥ ``min_change`` of their value, or that
    only one side knows."""
    out = []
    for section in METRIC_SECTIONS:
        sb = _at(before, "measurements", section) or {}
        sa = _at(after, "measurements", section) or {}
        if not isinstance(sb, dict) or not isinstance(sa, dict):
            continue
        for key in [*sb, *(k for k in sa if k not in sb)]:
            name = f"{section}.{key}"
            b, a = _num(sb.get(key)), _num(sa.get(key))
            if name in NOT_COMPARED or (b is None and a is None):
                continue
            if b is not None and a is not None:
                rel = (a - b) / abs(b) if b else None
                if (rel is None and a == b) or (rel is not None and abs(rel) < min_change):
                    continue
                floor = next((v for unit, v in METRIC_MIN_CHANGE.items() if key.endswith(unit)),
                             0.0)
                if abs(a - b) < floor:
                    continue
                out.append(MetricDelta(name=name, before=b, after=a, delta=a - b,
                                       delta_fraction=rel))
            else:
                out.append(MetricDelta(name=name, before=b, after=a, delta=None,
                                       delta_fraction=None))
    return out
