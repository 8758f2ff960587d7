"""no_mixed_precision on a CPU with AMX bf16 units: said as a lever only where the step's
counted FLOPs show large matrix products make most of it, measured against this CPU's own
product rates (probed once, after the loop, without touching the user's random stream)."""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import nn

from factories import measurements
from redline.core.findings import Finding, rank
from redline.core.measurements import Measurements, MfuResult
from redline.diagnose import diagnose
from redline.diagnose.device import no_mixed_precision
from redline.measure import summary
from redline.measure.cpu_gemm import GemmRates, measure_gemm_rates

FP32, BF16 = 350e9, 2.1e12
"""A 2-thread Sapphire Rapids CPU's rates for the probe's product (FLOP/s)."""


def amx(share: float | None, *, flags: tuple[str, ...] = ("amx_bf16",),
        fp32: float = FP32, bf16: float = BF16) -> Measurements:
    """A CPU step (forward+backward+optimizer 90 % of it) whose counted FLOPs run at
    ``share`` × the CPU's fp32 product rate (None: FLOPs not counted, nothing probed)."""
    m = measurements(host={"cpu_flags": list(flags),
                           "gemm_fp32_flops_per_s": None if share is None else fp32,
                           "gemm_bf16_flops_per_s": None if share is None else bf16})
    achieved = None if share is None else share * fp32
    return replace(m, mfu=MfuResult(
        flops_per_step=None if achieved is None else achieved * 0.1,
        achieved_flops_per_s=achieved, peak_flops_per_s=None, compute_dtype="fp32", mfu=None,
        peak_source=None, reason="no peak-FLOPs entry for CPU devices"))


def test_a_step_of_large_products_is_told_with_its_amdahl_ceiling() -> None:
    (f,) = no_mixed_precision(amx(0.69))
    assert f.severity == "high"
    assert f.ceiling_speedup == pytest.approx(1 / (1 - 0.69 * (1 - FP32 / BF16)))
    assert f.evidence["matmul_fraction"] == 0.69
    assert f.evidence["measured_fp32_over_bf16"] == round(FP32 / BF16, 4)
    assert "torch.autocast('cpu', dtype=torch.bfloat16)" in f.fix
    assert "unknown" not in f.fix


def test_a_step_of_small_products_is_not_told() -> None:
    # 10 % of the step in products: at most 1.09x, less than autocast's casts cost
    assert no_mixed_precision(amx(0.10)) == []


def test_a_middling_share_is_said_at_low_severity_with_no_ceiling() -> None:
    (f,) = no_mixed_precision(amx(0.43))
    # the probe's large-product gain is not what small products get: no Amdahl bound to rank
    # by, so a measured finding ranks above it
    assert f.severity == "low" and f.ceiling_speedup is None
    assert f.evidence["matmul_fraction"] == 0.43
    assert "43% of this CPU's fp32 rate" in f.fix and "time a few steps both ways" in f.fix
    (small,) = no_mixed_precision(amx(0.22))
    assert small.severity == "low" and small.ceiling_speedup is None
    data = measurements(phases={"data_wait": 0.06, "forward": 0.4, "backward": 0.4})
    found = diagnose(replace(amx(0.22), breakdown=data.breakdown))
    assert [f.id for f in found][-1] == "no_mixed_precision"
    assert small.evidence["gain_unknown"] is True
    # after another low finding without a ceiling too: a lever to time, not a measured waste
    waste = Finding(id="unused_parameter_search", severity="low", title="t", evidence={},
                    ceiling_speedup=None, fix="f")
    assert [f.id for f in rank([small, waste])] == ["unused_parameter_search",
                                                     "no_mixed_precision"]


def test_counted_flops_with_no_products_are_not_told() -> None:
    m = amx(0.5)
    assert no_mixed_precision(replace(m, mfu=replace(m.mfu, flops_per_step=0.0,
                                                     achieved_flops_per_s=0.0))) == []


def test_rates_not_measured_are_said_as_such() -> None:
    m = amx(0.6)
    m = replace(m, host=replace(m.host, gemm_fp32_flops_per_s=None, gemm_bf16_flops_per_s=None))
    (f,) = no_mixed_precision(m)
    assert f.severity == "low" and f.ceiling_speedup is None
    assert "rates were not measured" in f.fix and "did not count" not in f.fix


def test_without_counted_flops_it_is_low_and_says_why() -> None:
    (f,) = no_mixed_precision(amx(None))
    assert f.severity == "low" and f.ceiling_speedup is None
    assert "did not count the step's FLOPs" in f.fix


def test_no_amx_or_no_faster_bf16_is_quiet() -> None:
    assert no_mixed_precision(amx(0.9, flags=("avx512_bf16",))) == []
    # a torch build whose bf16 products run no faster than fp32: nothing to gain
    assert no_mixed_precision(amx(0.9, bf16=FP32 * 0.9)) == []


def test_the_probe_times_both_dtypes_and_leaves_the_users_state_alone() -> None:
    torch.manual_seed(3)
    before = torch.get_rng_state()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rates = measure_gemm_rates(shape=(32, 64, 64), repeats=2)
        assert torch.is_autocast_enabled("cpu")
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.is_grad_enabled()
    assert rates.fp32_flops_per_s > 0 and rates.bf16_flops_per_s > 0
    assert rates.threads == torch.get_num_threads()


def _watched_run(**kw: Any) -> Any:
    import redline

    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with redline.watch(warmup_steps=1, **kw) as w:
            for _ in range(6):
                loss = model(torch.randn(16, 64)).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
    return w


def _amx_probe(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """Make the report see an AMX CPU and probe with a stub; returns the thread counts the
    stub was called with."""
    calls: list[int | None] = []

    def probe(threads: int | None = None) -> GemmRates:
        calls.append(threads)
        return GemmRates(fp32_flops_per_s=FP32, bf16_flops_per_s=BF16, threads=threads or 2)

    monkeypatch.setattr(summary, "measure_gemm_rates", probe)
    monkeypatch.setattr(summary, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    return calls


def test_the_report_probes_once_where_the_rule_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _amx_probe(monkeypatch)
    w = _watched_run()
    first = w.report(show=False).measurements
    again = w.report(show=False).measurements
    assert calls == [torch.get_num_threads()]  # a report built again reads the first's rates
    for m in (first, again):
        assert (m.host.gemm_fp32_flops_per_s, m.host.gemm_bf16_flops_per_s) == (FP32, BF16)
        assert "256×1024×1024" in m.sources["gemm_rates"]
    # not probed where the rule cannot use it: FLOPs not counted, or no AMX
    assert _watched_run(count_flops=False).report(show=False).measurements.host \
        .gemm_fp32_flops_per_s is None
    monkeypatch.setattr(summary, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert _watched_run().report(show=False).measurements.host.gemm_fp32_flops_per_s is None
    assert len(calls) == 1


def test_a_probe_that_fails_leaves_the_rates_unknown_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def probe(threads: int | None = None) -> GemmRates:
        raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'BFloat16'")

    monkeypatch.setattr(summary, "measure_gemm_rates", probe)
    monkeypatch.setattr(summary, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    m = _watched_run().report(show=False).measurements
    assert m.host.gemm_fp32_flops_per_s is None and "gemm_rates" not in m.sources
    assert any("could not be measured" in n and "BFloat16" in n for n in m.notes)


def test_ranks_sharing_the_host_do_not_probe_against_each_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from redline.measure.ranks import RankInfo

    calls: list[int] = []
    monkeypatch.setattr(summary, "measure_gemm_rates", lambda **kw: calls.append(1))
    monkeypatch.setattr(summary, "cpu_flags", lambda: frozenset({"amx_bf16"}))
    w = _watched_run()
    info = w.rank
    w.rank = RankInfo(**{**{f: getattr(info, f) for f in info.__dataclass_fields__},
                         "world_size": 2, "local_world_size": 2})
    from redline.measure.summary import build_measurements
    m = build_measurements(w)
    assert calls == [] and m.host.gemm_fp32_flops_per_s is None
    assert any("2 ranks share this host" in n for n in m.notes)


def test_the_probe_runs_on_the_loops_threads_and_gives_them_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    other = 1 if before > 1 else 2
    try:
        rates = measure_gemm_rates(shape=(32, 64, 64), repeats=1, threads=other)
        assert rates.threads == other and torch.get_num_threads() == before
        # a program that changes its threads after the loop: the report keeps the loop's
        calls = _amx_probe(monkeypatch)
        w = _watched_run()
        torch.set_num_threads(other)
        m = w.report(show=False).measurements
        assert calls == [before] and m.config.torch_threads == before
        assert m.host.torch_threads == before
    finally:
        torch.set_num_threads(before)
