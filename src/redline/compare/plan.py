"""A plan's projection (``redline plan --json``) against a measured doctor report: did the run
reach the step time the plan projected for its chosen layout, and where did the time go that
the plan did not model.

A plan states one number per term, with no spread, so the test is Student's one-sample t of the
measured run's batch means against the projected value (the projection taken as exact): the
verdict says whether the run is slower than planned beyond its own spread, by at least the
minimum effect.
"""

from __future__ import annotations

import math
from typing import Any

from redline.compare.model import (
    ALPHA,
    MIN_EFFECT_FRACTION,
    PLAN,
    Comparison,
    Difference,
    PhaseDelta,
)
from redline.compare.reports import BATCH_CHANGE_FRACTION, step_times, world_size
from redline.compare.shape import PLAN_SCHEMA_READ, check_plan, check_report
from redline.compare.stats import Sample, one_sample
from redline.compare.verdict import projection_test, verdict_of

PLAN_SCHEMA_PREFIX = PLAN_SCHEMA_READ.rsplit("/", 1)[0] + "/"
"""Any version of the schema of ``redline plan --json``."""

COMPUTE_PHASES = ("forward", "backward", "optimizer")
"""Measured phases that the plan's compute term projects."""


def _num(v: Any) -> float | None:
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _phase_means_s(report: dict[str, Any]) -> dict[str, float]:
    rows = (report.get("measurements") or {}).get("breakdown") or []
    return {r["phase"]: float(r["mean_s"]) for r in rows
            if isinstance(r, dict) and _num(r.get("mean_s")) is not None and "phase" in r}


def compare_plan(plan: dict[str, Any], report: dict[str, Any], *, plan_source: str,
                 report_source: str, min_effect_fraction: float = MIN_EFFECT_FRACTION,
                 alpha: float = ALPHA) -> Comparison:
    """Compare a measured report with the projection of a plan's chosen layout.

    Args:
        plan: the document of ``redline plan --json``.
        report: the document of ``redline doctor --json`` of the run that followed the plan.
        plan_source: what ``plan`` was read from, for the output.
        report_source: what ``report`` was read from.
        min_effect_fraction: the smallest relative shortfall called a regression.
        alpha: significance level of the two-sided test.

    Returns:
        The comparison (before = the projection, after = the measured run).

    Raises:
        CompareInputError: a plan or report of a newer schema, or with a field that holds
            something else than theirs (cut short or edited), naming its source and the field.
    """
    check_plan(plan, plan_source)
    check_report(report, report_source)
    chosen = plan.get("chosen") or {}
    time = chosen.get("time") or {}
    step_s = _num(time.get("step_s"))
    training, cluster = plan.get("training") or {}, plan.get("cluster") or {}
    dp = chosen.get("dp") if isinstance(chosen.get("dp"), int) else None
    batch = _num(training.get("global_batch"))
    per_rank = batch / dp if batch is not None and dp else None
    timing = (report.get("measurements") or {}).get("timing") or {}
    measured_spb = _num(timing.get("samples_per_step"))
    notes: list[str] = []
    differences: list[Difference] = []
    st = step_times(report)
    sample, expected, metric = st.sample, step_s, "step_time"
    if (per_rank and measured_spb and abs(measured_spb / per_rank - 1) > BATCH_CHANGE_FRACTION
            and sample is not None and step_s is not None):
        metric, expected = "time_per_sample", step_s / per_rank
        sample = Sample(mean_s=sample.mean_s / measured_spb, n=sample.n,
                        std_s=sample.std_s / measured_spb, steps=sample.steps,
                        method=sample.method)
        notes.append(f"the measured run's {measured_spb:g} samples per step differ from the "
                     f"plan's {per_rank:g} per rank: the verdict is on the time per sample")
    if measured_spb is not None and per_rank is not None and measured_spb != per_rank:
        differences.append(Difference(
            field="samples_per_step", before=f"{per_rank:g}", after=f"{measured_spb:g}",
            consequence="the run's batch per rank and step is not the plan's"))
    gpus = cluster.get("gpus")
    if isinstance(gpus, int) and gpus != world_size(report):
        differences.append(Difference(
            field="world_size", before=str(gpus), after=str(world_size(report)),
            consequence="the run used a different number of GPUs than the plan: per-rank "
            "numbers are compared"))
    dev = (report.get("measurements") or {}).get("device") or {}
    if cluster.get("gpu_name") and cluster.get("gpu_name") != dev.get("name"):
        differences.append(Difference(
            field="device_name", before=str(cluster.get("gpu_name")), after=str(dev.get("name")),
            consequence="the run's device is not the one planned for: the projection's peak "
            "and bandwidths are another device's"))
    precision = ((report.get("measurements") or {}).get("config") or {}).get("precision")
    if training.get("precision") and precision and training["precision"] not in precision:
        differences.append(Difference(
            field="precision", before=str(training["precision"]), after=str(precision),
            consequence="the run's precision is not the planned one"))
    test = None
    if sample is not None and expected is not None:
        test = projection_test(expected, sample, one_sample(sample, expected), metric)
    if step_s is None:
        reason = "the plan has no chosen layout (nothing fit): nothing was projected"
    else:
        reason = f"the measured run has {st.source}"
    verdict = verdict_of(
        test, min_effect_fraction=min_effect_fraction, alpha=alpha,
        step_time_before_s=step_s, step_time_after_s=_num(timing.get("step_time_mean_s")),
        throughput_before=per_rank / step_s if per_rank and step_s else None,
        throughput_after=_num(timing.get("throughput_samples_per_s")), unknown_reason=reason)
    phases: list[PhaseDelta] = []
    if step_s:
        means = _phase_means_s(report)
        total = sum(means.values())
        comm_plan = sum(_num(time.get(k)) or 0.0 for k in
                        ("dp_exposed_s", "pp_exposed_s", "tp_comm_s", "offload_s"))
        compute_m = sum(means.get(p, 0.0) for p in COMPUTE_PHASES)
        comm_m = means.get("comm", 0.0)
        rest_m = total - compute_m - comm_m
        for name, planned, measured in (
                ("compute (forward + backward + optimizer)", _num(time.get("compute_s")),
                 compute_m),
                ("exposed communication", comm_plan, comm_m),
                ("not modelled by the plan (data wait, copies, other)", 0.0, rest_m)):
            phases.append(PhaseDelta(
                phase=name, before_ms=None if planned is None else planned * 1e3,
                after_ms=measured * 1e3 if means else None,
                delta_ms=(None if planned is None or not means
                          else (measured - planned) * 1e3),
                before_fraction=None if planned is None else planned / step_s,
                after_fraction=measured / total if total > 0 else None))
        notes.append("the plan's step is one optimizer step of the job; the measured phases "
                     "are rank 0's host times per step")
    return Comparison(kind=PLAN, before_source=plan_source, after_source=report_source,
                      verdict=verdict, differences=differences, phases=phases, notes=notes)
