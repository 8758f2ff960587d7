"""From two runs' samples to a verdict: the test, then the size against the minimum effect."""

from __future__ import annotations

import math

from redline.compare.model import (
    IMPROVEMENT,
    NO_CHANGE,
    REGRESSION,
    UNKNOWN,
    StepTest,
    Verdict,
)
from redline.compare.stats import (
    BATCH_MEANS,
    CORRELATED_BATCHES,
    STEPS,
    SUMMARY,
    Sample,
    WelchResult,
    ratio_interval,
    welch,
)

METRIC_WORDS = {"step_time": "step time", "time_per_sample": "time per sample"}


def describe(sample: Sample) -> str:
    r = sample.lag1_autocorrelation
    still = ("" if r is None or r <= CORRELATED_BATCHES else
             f", still correlated (lag-1 r = {r:.2f}): the run is short for its drift and the "
             "test optimistic")
    if sample.method == BATCH_MEANS:
        return (f"{sample.n} batch means of {sample.steps // sample.n} consecutive steps "
                f"({sample.steps} steps{still})")
    if sample.method == STEPS:
        return (f"{sample.steps} single steps (too few to batch: autocorrelation not "
                "accounted for)")
    if sample.method == SUMMARY:
        return (f"{sample.steps} steps known only by p50/p95 (σ ≈ (p95 − p50) ÷ 1.645, steps "
                "taken as independent: a weaker test)")
    return f"{sample.n} values"


def step_test(before: Sample, after: Sample, metric: str) -> StepTest:
    """Welch's t on the two samples, with the method said in words."""
    r = welch(before, after)
    method = before.method if before.method == after.method else (
        SUMMARY if SUMMARY in (before.method, after.method) else STEPS)
    detail = (f"Welch's t-test (Welch–Satterthwaite df) on before: {describe(before)}; "
              f"after: {describe(after)}")
    return _test(r, metric=metric, method=method, detail=detail, before=before, after=after)


def _test(r: WelchResult, *, metric: str, method: str, detail: str, before: Sample | None,
          after: Sample, before_mean_s: float | None = None) -> StepTest:
    b_mean = before.mean_s if before is not None else before_mean_s
    assert b_mean is not None
    return StepTest(
        metric=metric, method=method, method_detail=detail, before_mean_s=b_mean,
        after_mean_s=after.mean_s, difference_s=r.difference_s,
        difference_fraction=r.difference_s / b_mean if b_mean > 0 else 0.0,
        ci_low_s=r.ci_low_s, ci_high_s=r.ci_high_s, p_value=r.p_value, t=r.t, df=r.df,
        before_n=before.n if before is not None else 1, after_n=after.n,
        before_steps=before.steps if before is not None else 0, after_steps=after.steps,
        before_std_s=before.std_s if before is not None else None, after_std_s=after.std_s)


def projection_test(expected_s: float, after: Sample, r: WelchResult, metric: str) -> StepTest:
    """The one-sample test of a measured run against a projected value."""
    return _test(r, metric=metric, method="projection",
                 detail=f"Student's t-test of the measured mean ({describe(after)}) against "
                 "the projected value, taken as exact (a plan states no spread)",
                 before=None, after=after, before_mean_s=expected_s)


def verdict_of(test: StepTest | None, *, min_effect_fraction: float, alpha: float,
               step_time_before_s: float | None, step_time_after_s: float | None,
               throughput_before: float | None, throughput_after: float | None,
               unknown_reason: str = "a side has no step time",
               contention: tuple[float, float] | None = None) -> Verdict:
    """Regression or improvement when the difference is significant at ``alpha`` *and* at
    least ``min_effect_fraction`` of the baseline; otherwise no significant change.

    ``contention`` is (before, after) share of each run's window its training thread waited for
    a CPU, given when they differ enough to move a run's wall time: a change that is not at
    least the minimum effect, in the same direction, once each side's wait is taken out is the
    host's load (no significant change)."""
    adjusted: float | None = None
    if test is None:
        verdict, reason = UNKNOWN, unknown_reason
    else:
        words = METRIC_WORDS.get(test.metric, test.metric)
        rel = test.difference_fraction
        size = (f"{words} over the steps tested {_ms(test.before_mean_s)} → "
                f"{_ms(test.after_mean_s)} "
                f"({rel:+.1%}, 95 % CI {_relative_interval(test)}, p = {test.p_value:.2g})"
                if test.before_mean_s > 0 else f"{words} {test.difference_s:+.3g} s")
        if test.p_value >= alpha:
            verdict = NO_CHANGE
            reason = f"{size}: within the runs' own spread (p ≥ {alpha:g})"
        elif abs(rel) < min_effect_fraction:
            verdict = NO_CHANGE
            reason = (f"{size}: significant but smaller than the minimum effect "
                      f"{min_effect_fraction:.0%}")
        else:
            verdict = REGRESSION if rel > 0 else IMPROVEMENT
            reason = f"{size}: {'slower' if rel > 0 else 'faster'} beyond the runs' spread"
        if contention is not None and test.before_mean_s > 0 and contention[0] < 1:
            wait_b, wait_a = contention
            adjusted = (test.after_mean_s * (1 - wait_a)) / (test.before_mean_s * (1 - wait_b)) - 1
            if verdict in (REGRESSION, IMPROVEMENT) and not (
                    abs(adjusted) >= min_effect_fraction and (adjusted > 0) == (rel > 0)):
                verdict = NO_CHANGE
                which = ("the other way" if adjusted != 0 and (adjusted > 0) != (rel > 0) else
                         f"within the minimum effect {min_effect_fraction:.0%}")
                reason = (f"{size}, but the runs waited for a CPU {wait_b:.0%} and {wait_a:.0%} "
                          f"of their time: without those waits the change is {adjusted:+.1%}, "
                          f"{which}: the host's load made the difference, not the code")
    delta_ms = (None if step_time_before_s is None or step_time_after_s is None
                else (step_time_after_s - step_time_before_s) * 1e3)
    return Verdict(
        verdict=verdict, reason=reason, min_effect_fraction=min_effect_fraction, alpha=alpha,
        step_time_before_ms=None if step_time_before_s is None else step_time_before_s * 1e3,
        step_time_after_ms=None if step_time_after_s is None else step_time_after_s * 1e3,
        step_time_delta_ms=delta_ms,
        step_time_delta_pct=(None if delta_ms is None or not step_time_before_s
                             else delta_ms / (step_time_before_s * 1e3) * 100),
        throughput_before_samples_per_s=throughput_before,
        throughput_after_samples_per_s=throughput_after,
        throughput_delta_pct=(None if throughput_before is None or throughput_after is None
                              or throughput_before <= 0
                              else (throughput_after / throughput_before - 1) * 100),
        test=test, contention_adjusted_delta_fraction=adjusted)


def _relative_interval(test: StepTest) -> str:
    """The relative change's 95 % interval in words: Fieller's for the ratio of the means
    (:func:`redline.compare.stats.ratio_interval`); a projection (a value without spread) or
    a test without spread has the difference's interval over the exact baseline."""
    if test.before_std_s is None:
        return (f"{test.ci_low_s / test.before_mean_s:+.1%} to "
                f"{test.ci_high_s / test.before_mean_s:+.1%}")
    ratio = ratio_interval(
        before_mean_s=test.before_mean_s, before_se_s=test.before_std_s / math.sqrt(test.before_n),
        after_mean_s=test.after_mean_s,
        after_se_s=(test.after_std_s or 0.0) / math.sqrt(test.after_n), df=test.df)
    if ratio is None:
        return "unbounded (the before run's spread is as wide as its mean: run more steps)"
    return f"{ratio[0] - 1:+.1%} to {ratio[1] - 1:+.1%}"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:,.3g} ms" if ms < 100 else f"{ms:,.1f} ms"
