"""The A/B decision policy: faster by the threshold and above the noise, with a measuring
function of known speeds."""

from __future__ import annotations

import pytest

from factories import plan_key as _key
from redline.core.loader import LoaderSettings
from redline.tune.config import TuneConfig
from redline.tune.decide import ABPolicy, MeasureFn
from redline.tune.knobs import TunePlan
from redline.tune.knobs.compile import COMPILE_RECORD
from redline.tune.knobs.loader import LOADER_RECORD
from redline.tune.knobs.precision import PRECISION_RECORD
from redline.tune.result import TrialMetrics


def test_rank_test_matches_scipy_and_knows_when_samples_are_too_few() -> None:
    from redline.tune.rank_test import p_smaller, smallest_p

    a = [1.00, 1.02, 0.98, 1.05, 1.01, 0.99, 1.03, 1.00]
    b = [0.97, 0.99, 0.95, 1.00, 0.96, 0.98, 0.94, 0.99]
    # scipy 1.17.1: mannwhitneyu(b, a, alternative='less', method='asymptotic').pvalue
    assert p_smaller(a, b) == pytest.approx(0.00410784960068024, rel=1e-9)
    assert p_smaller(b, a) > 0.99  # the other direction: not faster
    assert p_smaller(a, a) > 0.4  # identical samples: no evidence
    assert smallest_p(2, 2) == pytest.approx(1 / 6)  # 2+2 steps can never reach p < 0.05
    assert smallest_p(6, 6) < 0.01


def _fixed(times: dict[int, list[float]]) -> MeasureFn:
    """A measuring function with known per-step times: plan → its times (one sample each)."""
    def measure(plan: TunePlan, label: str, step_only: bool) -> TrialMetrics:
        t = times[id(plan)]
        return TrialMetrics(label=label, throughput_samples_per_s=len(t) / sum(t),
                            step_time_s=sorted(t)[len(t) // 2], data_wait_fraction=None,
                            device_busy_fraction=None, mfu=None,
                            peak_memory_bytes=None, peak_memory_source="", energy_j_per_step=None,
                            energy_source="", steps=len(t), wall_s=sum(t), step_times_s=list(t))
    return measure


def test_a_gain_inside_the_noise_is_not_kept() -> None:
    """Same throughput ratio, different spread: 6 % faster on average but the per-step times
    overlap completely → not kept; the same ratio from consistent steps → kept."""
    noisy_a = [1.0, 0.7, 1.3, 0.8, 1.2, 1.0]
    noisy_b = [0.75, 1.25, 0.9, 1.05, 0.85, 0.85]
    steady_a = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]
    steady_b = [t / 1.06 for t in steady_a]
    for (a, b), kept in (((noisy_a, noisy_b), False), ((steady_a, steady_b), True)):
        assert sum(a) / sum(b) > 1.05  # both clear the 5 % threshold on the mean
        base = TunePlan(key=_key(), effective_batch=8, micro_batch=8)
        cand = TunePlan(key=_key(), effective_batch=8, micro_batch=8, precision="bf16")
        policy = ABPolicy(TuneConfig(rounds=2), _fixed({id(base): a, id(cand): b}))
        out = policy.decide(base, cand, PRECISION_RECORD.decision(reason="", value="bf16"))
        assert (out is cand) is kept
        d = out.decisions[-1]
        assert d.kept is kept and d.measured == "step alone" and d.p_value is not None
        assert ("not above the noise" in d.reason) is not kept
        assert d.samples_per_s_after == pytest.approx(len(b) / sum(b))
        assert policy.current_tp == pytest.approx(len(b) / sum(b) if kept else len(a) / sum(a))
    # End to end (loader), per-step times are bursty by nature: the throughput alone decides.
    base = TunePlan(key=_key(), effective_batch=8, micro_batch=8)
    cand = TunePlan(key=_key(), effective_batch=8, micro_batch=8,
                    loader=LoaderSettings(num_workers=2))
    policy = ABPolicy(TuneConfig(), _fixed({id(base): noisy_a, id(cand): noisy_b}))
    out = policy.decide(base, cand, LOADER_RECORD.decision(reason=""), step_only=False)
    assert out is cand and "threshold only" in out.decisions[-1].reason
    assert out.decisions[-1].p_value is None


def test_a_knob_that_cannot_run_is_refused_with_the_error() -> None:
    base = TunePlan(key=_key(), effective_batch=8, micro_batch=8)
    cand = TunePlan(key=_key(), effective_batch=8, micro_batch=8, compile=True)

    def broken(plan: TunePlan, label: str, step_only: bool) -> TrialMetrics:
        raise RuntimeError("no C compiler")

    out = ABPolicy(TuneConfig(), broken).decide(base, cand, COMPILE_RECORD.decision(reason=""))
    assert out is base and not out.decisions[-1].kept
    assert out.decisions[-1].reason == "failed: RuntimeError: no C compiler"
