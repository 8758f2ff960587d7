"""What a comparison of two runs says: the verdict and its test first, then what changed.

``before`` is the baseline (BEFORE, a plan's projection), ``after`` the run under judgement;
every delta is ``after − before``, so a positive step-time delta is a slower run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from redline.core.errors import RedlineError


class CompareInputError(RedlineError, ValueError):
    """An input ``redline compare`` cannot use, or a pair it cannot compare: the message says
    what was received and what is expected."""


REGRESSION = "regression"
IMPROVEMENT = "improvement"
NO_CHANGE = "no significant change"
UNKNOWN = "unknown"
VERDICTS = (REGRESSION, IMPROVEMENT, NO_CHANGE, UNKNOWN)
"""What a comparison concludes; ``unknown`` when a side has no step time to test."""

REPORTS = "reports"
TRACES = "traces"
PLAN = "plan_vs_report"
KINDS = (REPORTS, TRACES, PLAN)
"""Two doctor reports, two sets of profiler traces, or a plan's projection against a report."""

MIN_EFFECT_FRACTION = 0.05
"""Default smallest relative change of the tested time that a verdict calls a change: below it a
difference, however certain, is "no significant change" (a 5 % step time is about what a
loaded host's neighbours move a run by; pass a larger one on noisier machines)."""
ALPHA = 0.05
"""Significance level of the test (two-sided)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTest:
    """The test of the tested time (per step, or per sample when the batches differ)."""

    metric: str
    """'step_time' (seconds per step) or 'time_per_sample' (seconds per sample)."""
    method: str
    """'batch_means', 'steps' or 'summary' (:mod:`redline.compare.stats`), 'projection' for a
    one-sample test against a plan's value."""
    method_detail: str
    """The test in words: batches, steps, and what it assumes."""
    before_mean_s: float
    after_mean_s: float
    difference_s: float
    difference_fraction: float
    """``difference_s ÷ before_mean_s``."""
    ci_low_s: float
    ci_high_s: float
    """95 % confidence interval of the difference."""
    p_value: float
    """Two-sided p-value of Welch's t (Student's t for a projection)."""
    t: float | None
    df: float | None
    before_n: int
    after_n: int
    """Independent values each side contributed (batches, or steps)."""
    before_steps: int
    after_steps: int
    before_std_s: float | None
    after_std_s: float | None
    """Standard deviation of those values (None for a projection: no spread)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The conclusion and its size."""

    verdict: str
    """One of :data:`VERDICTS`."""
    reason: str
    """Why, in one sentence with its numbers."""
    min_effect_fraction: float
    alpha: float
    step_time_before_ms: float | None
    step_time_after_ms: float | None
    step_time_delta_ms: float | None
    step_time_delta_pct: float | None
    throughput_before_samples_per_s: float | None
    throughput_after_samples_per_s: float | None
    throughput_delta_pct: float | None
    test: StepTest | None
    """None when a side has no step time (the verdict is then ``unknown``)."""
    contention_adjusted_delta_fraction: float | None = None
    """The relative change of the tested time with each run's wait for a CPU taken out
    (× (1 − ``host.main_thread_run_delay_fraction``)); set only when the two runs' waits differ
    by ≥ 10 points of their window, where a change within the minimum effect once adjusted is
    the host's load, not the code's (the verdict is then no significant change)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Difference:
    """A way the two runs differ besides their speed, and what it does to the comparison."""

    field: str
    before: str | None
    after: str | None
    consequence: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseDelta:
    """One phase's mean time per step and share of the step, before and after."""

    phase: str
    before_ms: float | None
    after_ms: float | None
    delta_ms: float | None
    before_fraction: float | None
    after_fraction: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FindingChange:
    """A finding that appeared, vanished or changed between the runs."""

    id: str
    change: str
    """'appeared', 'vanished' or 'changed' (severity, or its ceiling by ≥ 10 %)."""
    title: str
    rank: int | None
    before_severity: str | None
    after_severity: str | None
    before_ceiling_speedup: float | None
    after_ceiling_speedup: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricDelta:
    """A measured number that changed (host, device, trace-level), with its unit in its name."""

    name: str
    before: float | None
    after: float | None
    delta: float | None
    delta_fraction: float | None
    """``delta ÷ |before|``; None when before is unknown or zero."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OpDelta:
    """A kernel or an operator of two traces: how often it ran and how long, per step when both
    traces have steps (``Comparison.per``), as Holistic Trace Analysis's trace diff counts them
    (``hta/trace_diff.py``: ops and kernels by name, counts and cumulative duration)."""

    name: str
    kind: str
    """'kernel' (device) or 'operator' (host, Kineto ``cpu_op``)."""
    change: str
    """'added', 'removed', 'slower', 'faster', or 'unchanged' (time within 10 % and within 1 %
    of the busy time of its kind)."""
    before_count: float
    after_count: float
    before_us: float
    after_us: float
    delta_us: float
    before_share: float | None
    after_share: float | None
    """Share of the summed time of its kind (all kernels, or all operators) on that side."""


@dataclass(slots=True, kw_only=True)
class Comparison:
    """Everything ``redline compare`` says, before any presentation."""

    kind: str
    """One of :data:`KINDS`."""
    before_source: str
    after_source: str
    verdict: Verdict
    differences: list[Difference] = field(default_factory=list)
    phases: list[PhaseDelta] = field(default_factory=list)
    findings: list[FindingChange] = field(default_factory=list)
    metrics: list[MetricDelta] = field(default_factory=list)
    kernels: list[OpDelta] = field(default_factory=list)
    operators: list[OpDelta] = field(default_factory=list)
    per: str | None = None
    """For traces: 'step' when kernel and operator numbers are per profiler step, 'trace' when
    they are totals of the analysed window (a side without steps)."""
    notes: list[str] = field(default_factory=list)
