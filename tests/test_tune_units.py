"""Batch finder, numerics guard, plan store, kernel knobs, RAPL — unit level."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from redline.measure.rapl import RaplMeter
from redline.tune.batch_finder import BatchDoesNotFitError, find_batch_size
from redline.tune.kernels import find_unfused_attention, has_conv2d, optimizer_impls
from redline.tune.memory_budget import MemoryBudget
from redline.tune.plan import PlanKey, PlanStore, TunePlan, load_plan, save_plan
from redline.tune.precision import NonFiniteLossError, check_numerics
from redline.tune.runtime import rebuild_optimizer
from redline.tune.trial import state_tensors


def _mlp(width: int = 256, depth: int = 3) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(32, width)]
    for _ in range(depth):
        layers += [nn.GELU(), nn.LayerNorm(width)]
    layers.append(nn.Linear(width, 10))
    m = nn.Sequential(*layers)
    return m, torch.optim.Adam(m.parameters())


def _step(m: nn.Module, opt: torch.optim.Optimizer) -> Callable[[int], None]:
    def step(b: int) -> None:
        x, y = torch.randn(b, 32), torch.randint(0, 10, (b,))
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def _fits(b: int, limit: int) -> bool:
    """Fresh model, two steps (the second with optimizer state) under the budget."""
    m, opt = _mlp()
    st = _step(m, opt)
    try:
        with MemoryBudget(limit, existing=state_tensors(m, opt)):
            st(b)
            st(b)
    except torch.OutOfMemoryError:
        return False
    return True


def _true_max(limit: int, hi: int = 1 << 14) -> int:
    lo = 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(mid, limit) else (lo, mid)
    return lo


@pytest.mark.parametrize("limit_mib", [6, 20])
def test_finder_predicts_the_true_max_in_few_trials_without_oom(limit_mib: int) -> None:
    limit = limit_mib * 2**20
    truth = _true_max(limit)
    assert truth > 8
    m, opt = _mlp()
    r = find_batch_size(_step(m, opt), state=lambda: state_tensors(m, opt),
                        max_batch=1 << 14, limit_bytes=limit)
    assert r.ooms == 0
    assert r.trials <= 4
    assert truth * 0.98 <= r.batch <= truth
    assert r.fit == "per-allocation"
    assert r.probes[0].batch == 1 and r.probes[-1].role == "verify"
    assert r.allocator_overhead == 0.0 and "simulated" in r.overhead_source


def test_finder_stops_at_the_effective_batch() -> None:
    m, opt = _mlp()
    r = find_batch_size(_step(m, opt), state=lambda: state_tensors(m, opt), max_batch=24,
                        limit_bytes=64 * 2**20)
    assert r.batch == 24 and r.ooms == 0 and r.trials == 2


def test_finder_without_limit_verifies_the_cap_once() -> None:
    m, opt = _mlp()
    r = find_batch_size(_step(m, opt), state=lambda: state_tensors(m, opt), max_batch=16,
                        limit_bytes=None)
    assert (r.batch, r.trials, r.fit) == (16, 1, "none")


def test_batch_one_not_fitting_names_the_options() -> None:
    m, opt = _mlp(width=1024)
    with pytest.raises(BatchDoesNotFitError) as e:
        find_batch_size(_step(m, opt), state=lambda: state_tensors(m, opt), max_batch=64,
                        limit_bytes=2**20)
    msg = str(e.value)
    for option in ("precision", "checkpointing", "FSDP"):
        assert option in msg


class _Offset(nn.Module):
    """Outputs near 1000 carrying a small signal: bf16 (8 mantissa bits, spacing 8 at 1000)
    rounds the signal away, fp32 keeps it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lin(x) + 1000.0
        return out


def _batches(n: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)) for _ in range(n)]


def test_numerics_guard_passes_bf16_on_a_normal_model() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    w0 = [p.detach().clone() for p in m.parameters()]
    chk = check_numerics(m, opt, _batches(), 8,
                         lambda mm, b: nn.functional.mse_loss(mm(b[0]), b[1]), "bf16",
                         torch.device("cpu"))
    assert chk.passed, chk.reason
    assert chk.max_loss_rel < 0.05 and chk.overflow_steps == 0
    assert len(chk.loss_fp32) == 4
    for p, q in zip(m.parameters(), w0, strict=True):  # the model is left as it was
        assert torch.equal(p.detach(), q)


def test_numerics_guard_refuses_bf16_that_loses_the_signal() -> None:
    torch.manual_seed(0)
    m = _Offset()
    opt = torch.optim.SGD(m.parameters(), lr=1e-4)
    chk = check_numerics(m, opt, _batches(), 16,
                         lambda mm, b: nn.functional.mse_loss(mm(b[0]) - 1000.0, b[1]),
                         "bf16", torch.device("cpu"))
    assert not chk.passed
    assert chk.reason.startswith("bf16 refused") and "loss differs" in chk.reason


def test_nan_in_fp32_is_reported_as_not_a_precision_problem() -> None:
    m = nn.Linear(8, 4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    bad = [(torch.full((4, 8), math.nan), torch.zeros(4, 4))]
    with pytest.raises(NonFiniteLossError, match="not a precision problem"):
        check_numerics(m, opt, bad, 4, lambda mm, b: nn.functional.mse_loss(mm(b[0]), b[1]),
                       "bf16", torch.device("cpu"))


def _key(sig: str = "abc") -> PlanKey:
    return PlanKey(sig, "m.Net", "cpu:x86_64", "fp32", "(8,):float32")


def test_plan_roundtrip_store_and_bad_files(tmp_path: Path) -> None:
    plan = TunePlan(key=_key(), effective_batch=64, micro_batch=24, precision="bf16",
                    num_workers=2, prefetch_factor=2, decisions=[{"step": "x", "kept": True}])
    assert plan.accumulation_steps == 3
    save_plan(plan, tmp_path / "p.json")
    assert load_plan(tmp_path / "p.json") == plan
    store = PlanStore(tmp_path / "store")
    assert store.get(plan.key) is None
    store.put(plan)
    assert store.get(plan.key) == plan
    assert store.get(_key("other")) is None
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        load_plan(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"schema": "redline.report/1"}')
    with pytest.raises(ValueError, match="not a redline plan"):
        load_plan(tmp_path / "other.json")
    with pytest.raises(FileNotFoundError, match="redline tune"):
        load_plan(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="micro_batch"):
        TunePlan(key=_key(), effective_batch=8, micro_batch=16)


def test_kernel_candidates_and_attention_location() -> None:
    from redline.workloads.lm import LMConfig, build_lm

    w = build_lm(LMConfig(sequences=16, seq_len=16, batch_size=2))
    batch = next(iter(w.loader))
    sites = find_unfused_attention(w.model, batch, lambda m, b: w.loss_fn(m, b, w.device))
    assert len(sites) == 1
    assert sites[0].location.endswith(("lm.py:" + str(_softmax_line()),))
    assert sites[0].calls_per_forward == 2  # two blocks
    assert not has_conv2d(w.model)
    assert optimizer_impls(w.optimizer) == ["fused", "foreach"]
    fused = rebuild_optimizer(w.optimizer, "fused")
    assert fused.defaults["fused"] is True
    assert fused.param_groups[0]["lr"] == w.optimizer.param_groups[0]["lr"]
    sdpa = nn.Sequential(nn.Linear(8, 8))
    assert find_unfused_attention(sdpa, torch.randn(2, 8), lambda m, b: m(b).sum()) == []


def _softmax_line() -> int:
    import inspect

    from redline.workloads import lm

    src, start = inspect.getsourcelines(lm.Attention.forward)
    return start + next(i for i, line in enumerate(src) if "softmax" in line)


def test_rapl_reads_packages_and_wraps(tmp_path: Path) -> None:
    for pkg, e in (("intel-rapl:0", 999_000_000), ("intel-rapl:1", 5_000_000)):
        d = tmp_path / pkg
        d.mkdir()
        (d / "energy_uj").write_text(str(e))
        (d / "max_energy_range_uj").write_text("1000000000")
    (tmp_path / "intel-rapl:0:0").mkdir()  # a sub-domain: must not be double counted
    meter = RaplMeter(str(tmp_path))
    assert meter.start()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("1000000")  # wrapped: +2 J
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("8000000")  # +3 J
    assert meter.joules() == pytest.approx(5.0)
    missing = RaplMeter(str(tmp_path / "none"))
    assert not missing.start() and missing.joules() is None
    assert "no RAPL domains" in (missing.reason or "")


def test_compile_is_kept_only_when_amortized_over_the_run() -> None:
    from redline.tune.path import compile_pays

    # 30 s to compile, 0.20 → 0.15 s/step: pays after 600 steps (+5 % margin), not before.
    assert compile_pays(30, 0.20, 0.15, 10_000, 0.05)[0]
    assert not compile_pays(30, 0.20, 0.15, 500, 0.05)[0]
    keep, eager, comp = compile_pays(30, 0.20, 0.15, 1000, 0.05)
    assert (eager, comp) == (200.0, 180.0) and keep


def test_probe_batches_are_built_from_the_largest_sample() -> None:
    from torch.utils.data import DataLoader

    from redline.tune.setup import TrainSetup
    from redline.tune.trial import probe_batch

    lengths = [5, 9, 40, 7, 12]
    data = [torch.ones(n) for n in lengths]

    def pad(items: list[torch.Tensor]) -> torch.Tensor:
        return nn.utils.rnn.pad_sequence(items, batch_first=True)

    m = nn.Linear(1, 1)
    s = TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                   loader=DataLoader(data, batch_size=2, collate_fn=pad),  # type: ignore[arg-type]
                   loss_fn=lambda mm, b: b.sum())
    make, how = probe_batch(s, torch.device("cpu"))
    assert make(3).shape == (3, 40)
    assert "index 2" in how and "5 samples" in how


class _SlowData(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each sample costs 4 ms to 'load'."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        import time

        time.sleep(0.004)
        return torch.full((8,), float(i)), torch.tensor(i % 2)


def test_step_only_trials_time_the_step_without_the_input() -> None:
    """Compute knobs are judged on the step alone: the same plan measured end to end waits on
    the slow dataset; step-only it does not, and both count samples."""
    from torch.utils.data import DataLoader

    from redline.tune.setup import TrainSetup
    from redline.tune.trial import measure

    def factory() -> TrainSetup:
        torch.manual_seed(0)
        m = nn.Linear(8, 2)
        return TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                          loader=DataLoader(_SlowData(), batch_size=4),
                          loss_fn=lambda mm, b: nn.functional.cross_entropy(mm(b[0]), b[1]),
                          accumulation_steps=2)

    plan = TunePlan(key=_key(), effective_batch=8, micro_batch=4)
    e2e = measure(factory, plan, "e2e", steps=3, warmup=1)
    alone = measure(factory, plan, "alone", steps=3, warmup=1, step_only=True)
    assert e2e.data_wait_fraction is not None and e2e.data_wait_fraction > 0.5
    assert alone.data_wait_fraction is not None and alone.data_wait_fraction < 0.2
    assert e2e.throughput_samples_per_s and alone.throughput_samples_per_s
    assert alone.throughput_samples_per_s > e2e.throughput_samples_per_s
    assert alone.steps == e2e.steps == 3


def test_rank_test_matches_scipy_and_knows_when_samples_are_too_few() -> None:
    from redline.tune.stats import p_smaller, smallest_p

    a = [1.00, 1.02, 0.98, 1.05, 1.01, 0.99, 1.03, 1.00]
    b = [0.97, 0.99, 0.95, 1.00, 0.96, 0.98, 0.94, 0.99]
    # scipy 1.17.1: mannwhitneyu(b, a, alternative='less', method='asymptotic').pvalue
    assert p_smaller(a, b) == pytest.approx(0.00410784960068024, rel=1e-9)
    assert p_smaller(b, a) > 0.99  # the other direction: not faster
    assert p_smaller(a, a) > 0.4  # identical samples: no evidence
    assert smallest_p(2, 2) == pytest.approx(1 / 6)  # 2+2 steps can never reach p < 0.05
    assert smallest_p(6, 6) < 0.01


def test_a_gain_inside_the_noise_is_not_kept() -> None:
    """Same throughput ratio, different spread: 6 % faster on average but the per-step times
    overlap completely → not kept; the same ratio from consistent steps → kept."""
    from redline.tune.path import TuneConfig, _Path

    class P(_Path):
        def __init__(self, t_cur: list[float], t_new: list[float]) -> None:
            self.cfg, self.log, self.current_tp = TuneConfig(), lambda s: None, None
            self._t = (t_cur, t_new)

        def ab(self, plan: TunePlan, candidate: TunePlan, what: str, step_only: bool
               ) -> tuple[float, float, list[float], list[float]]:
            a, b = self._t
            return len(a) / sum(a), len(b) / sum(b), a, b

    noisy_a = [1.0, 0.7, 1.3, 0.8, 1.2, 1.0] * 2
    noisy_b = [0.75, 1.25, 0.9, 1.05, 0.85, 0.85] * 2
    steady_a = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98] * 2
    steady_b = [t / 1.06 for t in steady_a]
    base = TunePlan(key=_key(), effective_batch=8, micro_batch=8, decisions=[])
    for (a, b), kept in (((noisy_a, noisy_b), False), ((steady_a, steady_b), True)):
        assert sum(a) / sum(b) > 1.05  # both clear the 5 % threshold on the mean
        cand = TunePlan(key=_key(), effective_batch=8, micro_batch=8, precision="bf16",
                        decisions=[])
        out = P(a, b).decide(base, cand, "precision bf16")
        assert (out is cand) is kept
        assert out.decisions[-1]["kept"] is kept
        assert ("not above the noise" in out.decisions[-1]["reason"]) is not kept
    # End to end (loader), per-step times are bursty by nature: the throughput alone decides.
    cand = TunePlan(key=_key(), effective_batch=8, micro_batch=8, num_workers=2, decisions=[])
    out = P(noisy_a, noisy_b).decide(base, cand, "data pipeline", step_only=False)
    assert out is cand and "threshold only" in out.decisions[-1]["reason"]


def test_batch_is_searched_again_after_a_16_bit_precision_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a budget where fp32 fits micro-batch 29 of the effective 32, bf16 activations fit
    all 32: once bf16 is kept, the path looks at the batch again. (Speed decisions are faked
    here — this tests the order of the path, not this machine's timings.)"""
    import dataclasses

    from redline.tune.path import TuneConfig, _Path, tune

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "scripts"))
    import tune_tiny

    def faster(self: _Path, plan: TunePlan, cand: TunePlan, what: str, step_only: bool,
               ) -> tuple[float, float, list[float], list[float]]:
        return 1.0, 2.0, [1.0] * 12, [0.5] * 12

    def bf16(self: _Path, plan: TunePlan) -> tuple[TunePlan, list[Any]]:
        return dataclasses.replace(plan, precision="bf16"), []

    monkeypatch.setattr(_Path, "ab", faster)
    monkeypatch.setattr(_Path, "precision", bf16)
    cfg = TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, tune_loader=False,
                     tune_kernels=False, reuse=False, store_dir=str(tmp_path))
    res = tune(lambda: tune_tiny.redline_setup(limit=200_000, width=256), cfg)
    steps = {d["step"]: d for d in res.plan.decisions}
    assert steps["batch size"]["kept"] and steps["batch size"]["micro_batch"] == 29
    assert steps["batch size (again)"]["kept"] and steps["batch size (again)"]["micro_batch"] == 32
    assert res.plan.micro_batch == 32 and res.plan.accumulation_steps == 1
    assert res.plan.precision == "bf16"

    # bf16 kept only in the kernels step (precision_again, with channels_last): the batch is
    # looked at again there, once.
    def fp32(self: _Path, plan: TunePlan) -> tuple[TunePlan, list[Any]]:
        return plan, []

    def kernels_bf16(self: _Path, plan: TunePlan) -> tuple[TunePlan, list[Any]]:
        return dataclasses.replace(plan, precision="bf16"), []

    monkeypatch.setattr(_Path, "precision", fp32)
    monkeypatch.setattr(_Path, "kernels", kernels_bf16)
    cfg = dataclasses.replace(cfg, tune_kernels=True, try_compile=False)
    res = tune(lambda: tune_tiny.redline_setup(limit=200_000, width=256), cfg)
    again = [d for d in res.plan.decisions if d["step"] == "batch size (again)"]
    assert len(again) == 1 and again[0]["kept"] and res.plan.micro_batch == 32


@pytest.mark.slow
def test_compile_is_measured_against_the_eager_step_and_amortized(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole compile knob on the CPU (inductor): a real compiled trial, the eager side
    measured on the step alone like it, and the decision from compile_pays over run_steps."""
    from redline.tune.path import TuneConfig, tune

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "scripts"))
    import tune_tiny

    cfg = TuneConfig(steps_per_trial=3, rounds=1, warmup_steps=1, tune_loader=False,
                     tune_batch=False, tune_precision=False, reuse=False,
                     store_dir=str(tmp_path))
    res = tune(lambda: tune_tiny.redline_setup(limit=None), cfg)
    d = next(x for x in res.plan.decisions if x["step"] == "torch.compile")
    assert "failed" not in d["reason"], d["reason"]
    assert d["compile_s"] >= 0 and d["samples_per_s_before"] > 0 and d["samples_per_s_after"] > 0
    assert "over 500 steps" in d["reason"]  # the factory's run_steps
    assert res.plan.compile is d["kept"]


def test_traced_trial_keeps_its_measured_steps_and_says_why_busy_is_unknown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial with ``trace=True`` records its profiler steps on top of the measured ones
    (excluded from the statistics), removes its trace folder, and on a CPU says why the
    kernel-union busy is unknown instead of guessing."""
    import tempfile

    from torch.utils.data import DataLoader, TensorDataset

    from redline.tune.setup import TrainSetup
    from redline.tune.trial import TRACE_STEPS, measure

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def factory() -> TrainSetup:
        torch.manual_seed(0)
        m = nn.Linear(8, 2)
        data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        return TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                          loader=DataLoader(data, batch_size=4),
                          loss_fn=lambda mm, b: nn.functional.cross_entropy(mm(b[0]), b[1]))

    plan = TunePlan(key=_key(), effective_batch=4, micro_batch=4)
    traced = measure(factory, plan, "traced", steps=4, warmup=1, trace=True)
    plain = measure(factory, plan, "plain", steps=4, warmup=1)
    assert traced.steps == plain.steps == 4
    assert TRACE_STEPS >= 3
    assert traced.device_busy_kernels_fraction is None
    assert traced.device_busy_kernels_source.startswith("unknown: CPU-only trace")
    assert plain.device_busy_kernels_source == "not traced for this trial"
    assert not list(tmp_path.glob("redline-tune-trace-*"))  # the trace folder is gone

    calls = [0]

    def failing() -> TrainSetup:
        s = factory()

        def loss(mm: nn.Module, b: Any) -> torch.Tensor:
            calls[0] += 1
            if calls[0] == 4:
                raise RuntimeError("the user's loss failed")
            return nn.functional.cross_entropy(mm(b[0]), b[1])

        s.loss_fn = loss
        return s

    with pytest.raises(RuntimeError, match="loss failed"):
        measure(failing, plan, "failing", steps=4, warmup=1, trace=True)
    assert not list(tmp_path.glob("redline-tune-trace-*"))  # gone when the trial fails too


def test_device_only_trace_gives_the_kernel_union_busy(tmp_path: Path) -> None:
    """``redline tune`` traces CUDA activity only (no host operators, so a host-bound loop
    is not slowed by the profiler): no ProfilerStep marks, no cpu_op. The kernel union is read
    over every kernel then. Kernels of the fixture: [10,30] [35,55] [40,70] [90,100] [110,130]
    [160,180] [260,270] → busy 20+35+10+20+20+10 = 115 µs of a 260 µs window."""
    from redline.trace import analyze_paths
    from trace_fixtures import synthetic_events, write_trace

    device_only = [e for e in synthetic_events()
                   if e["cat"] in ("kernel", "gpu_memcpy", "cuda_runtime", "ac2g")]
    (r,) = analyze_paths([write_trace(tmp_path / "t.json.gz", device_only)]).ranks
    assert r.temporal is not None
    assert r.temporal.window_us == pytest.approx(260.0)
    assert 1 - r.temporal.pct(r.temporal.idle_us) / 100 == pytest.approx(115 / 260)


def _after(wait: float | None, kernels: float | None, span: float | None) -> Any:
    from redline.tune.trial import TrialMetrics

    return TrialMetrics("after", 1000.0, 0.01, wait, span, None, None, "", None, "", 10, 1.0,
                        device_busy_kernels_fraction=kernels)


def test_remaining_limits_say_which_bottleneck_is_left() -> None:
    from redline.tune.limits import remaining_limits

    def ids(wait: float | None, kernels: float | None, span: float | None) -> list[str]:
        return [lim.id for lim in remaining_limits(_after(wait, kernels, span))]

    # the H200 vision demo's shape: no data wait left, the span near 90 %, kernels far below
    host = remaining_limits(_after(0.022, 0.40, 0.856))
    assert [lim.id for lim in host] == ["host_bound"]
    assert "40%" in host[0].evidence and "86%" in host[0].evidence
    assert "reduce-overhead" in host[0].next_step
    assert ids(0.01, 0.95, 0.97) == ["device_bound"]
    assert ids(0.60, 0.35, 0.40) == ["data_bound"]  # waiting for data explains the idle device
    # the H200's tuned ResNet-50: some data wait, but most of the idle is the host launching
    both = remaining_limits(_after(0.068, 0.316, 0.942))
    assert [lim.id for lim in both] == ["host_bound", "data_bound"]
    assert both[0].step_fraction == pytest.approx(0.616)
    assert "62% of the step not explained by the data wait" in both[0].evidence
    assert ids(0.30, 0.35, 0.40) == ["host_bound", "data_bound"]  # 35 % idle left unexplained
    assert ids(0.01, 0.60, 0.62) == ["host_bound"]  # idle between the step's device work
    assert ids(0.01, 0.85, 0.88) == []  # nothing clear enough to name
    assert ids(0.01, None, None) == []  # CPU: nothing is guessed about a device
    assert ids(0.20, None, None) == ["data_bound"]
    assert ids(None, None, None) == []


def test_tune_table_prints_what_still_limits() -> None:
    import io

    from rich.console import Console

    from redline.report.tune_render import render
    from redline.tune.limits import remaining_limits
    from redline.tune.path import Projection, TuneResult

    after = _after(0.022, 0.40, 0.856)
    proj = Projection(10_000, 100.0, None, None)
    res = TuneResult(TunePlan(key=_key(), effective_batch=64, micro_batch=64),
                     _after(0.86, 0.10, 0.13), after, proj, proj, "default", None,
                     limits=remaining_limits(after))
    buf = io.StringIO()
    render(res, console=Console(file=buf, width=200))
    text = buf.getvalue()
    assert "still limited: host_bound" in text
    assert "device busy (kernels)" in text and "40.0%" in text


class _SlowFetch(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Each sample takes 10 ms to fetch (sleeping, as storage does): a batch of 4 is 40 ms per
    worker, so 2 workers make 200 samples/s."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        import time

        time.sleep(0.01)
        return torch.ones(8), torch.tensor(i % 2)


def test_end_to_end_trials_are_not_served_from_a_full_queue() -> None:
    """The first steps of a trial are slow (lazy init, allocator, cuDNN); the workers fill
    their queues meanwhile, and steps timed right after them ran at the step's own speed (the
    H200 read 16,700 samples/s from 6 workers that make ~3,000). The measured window starts
    at a fresh epoch and spans three queue-lengths, or whole epochs when they are short."""
    import time

    from torch.utils.data import DataLoader

    from redline.tune.setup import TrainSetup
    from redline.tune.trial import measure, measured_window

    def factory(n: int) -> Any:
        def make() -> TrainSetup:
            torch.manual_seed(0)
            m = nn.Linear(8, 2)
            calls = [0]

            def loss(mm: nn.Module, b: Any) -> torch.Tensor:
                calls[0] += 1
                if calls[0] <= 2:
                    time.sleep(0.4)  # slow first steps: the workers fill their queues
                return nn.functional.cross_entropy(mm(b[0]), b[1])

            return TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                              loader=DataLoader(_SlowFetch(n), batch_size=4), loss_fn=loss)
        return make

    plan = TunePlan(key=_key(), effective_batch=4, micro_batch=4, num_workers=2,
                    prefetch_factor=2, persistent_workers=True)
    assert measured_window(plan, 1000, 6) == (12, True)  # 3 × (2 workers × prefetch 2)
    assert measured_window(plan, 16, 6) == (16, True)  # a short epoch: timed whole
    no_workers = TunePlan(key=_key(), effective_batch=4, micro_batch=4)
    assert measured_window(no_workers, 16, 6) == (6, False)
    # warm-up 3: the two slow steps, then the step in which the new epoch begins
    long = measure(factory(4000), plan, "long epochs", steps=6, warmup=3)
    assert long.steps == 12
    assert long.throughput_samples_per_s == pytest.approx(200, rel=0.3)
    short = measure(factory(64), plan, "16-batch epochs", steps=6, warmup=3)
    assert short.steps == 16
    # one epoch start per 16 batches: 8 rounds of 40 ms, the first waited for → ~200 samples/s
    assert short.throughput_samples_per_s == pytest.approx(200, rel=0.3)


def _tiny_conv_setup() -> Any:
    """A conv net small enough for path tests with faked speeds (a fresh TrainSetup)."""
    from torch.utils.data import DataLoader, TensorDataset

    from redline.tune.setup import TrainSetup

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    data = TensorDataset(torch.randn(64, 3, 8, 8), torch.randint(0, 2, (64,)))
    return TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.01),
                      loader=DataLoader(data, batch_size=8),
                      loss_fn=lambda mm, b: nn.functional.cross_entropy(mm(b[0]), b[1]))


def test_bf16_is_tried_again_once_channels_last_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The H200 measured bf16 on ResNet-50 at +8.8 % in NCHW (refused) before channels_last
    was kept; cuDNN's fast 16-bit convolutions are NHWC. A precision that passed the numerics
    guard is tried once more after channels_last. (Speeds faked: this tests the path.)"""

    from redline.tune.path import TuneConfig, _Path, tune

    factory = _tiny_conv_setup

    def ab(self: _Path, plan: TunePlan, cand: TunePlan, what: str, step_only: bool,
           ) -> tuple[float, float, list[float], list[float]]:
        fast = what == "channels_last" or (cand.precision == "bf16" and cand.channels_last)
        return (1.0, 2.0, [1.0] * 12, [0.5] * 12) if fast else (1.0, 1.0, [1.0] * 12, [1.0] * 12)

    monkeypatch.setattr(_Path, "ab", ab)
    cfg = TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, tune_loader=False,
                     tune_batch=False, try_compile=False, reuse=False, store_dir=str(tmp_path))
    res = tune(factory, cfg)
    steps = {d["step"]: d for d in res.plan.decisions}
    assert not steps["precision bf16"]["kept"]
    assert steps["channels_last"]["kept"]
    again = steps["precision bf16 (again, channels_last)"]
    assert again["kept"] and "matches fp32" in again["numerics"]
    assert res.plan.precision == "bf16" and res.plan.channels_last


def test_cudnn_benchmark_is_a_measured_knob_for_conv_nets_on_cuda(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cudnn.benchmark is tried only where cuDNN runs the convolutions (a conv net on CUDA),
    kept when measured faster, and the tuned loop sets it only while it runs. (The CUDA check
    is patched and the speeds faked: this tests the path and the runtime on CPU.)"""

    from redline.tune import path as path_mod
    from redline.tune.kernels import cudnn_benchmark_applies
    from redline.tune.path import TuneConfig, _Path, tune
    from redline.tune.runtime import TunedLoop

    assert not cudnn_benchmark_applies(True, torch.device("cpu"))
    assert cudnn_benchmark_applies(True, torch.device("cuda"))
    assert not cudnn_benchmark_applies(False, torch.device("cuda"))

    factory = _tiny_conv_setup

    tried: list[str] = []

    def ab(self: _Path, plan: TunePlan, cand: TunePlan, what: str, step_only: bool,
           ) -> tuple[float, float, list[float], list[float]]:
        tried.append(what)
        fast = cand.cudnn_benchmark and not plan.cudnn_benchmark
        return (1.0, 1.5, [1.0] * 12, [0.66] * 12) if fast else (1.0, 1.0, [1.0] * 12, [1.0] * 12)

    monkeypatch.setattr(_Path, "ab", ab)
    cfg = TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, tune_loader=False,
                     tune_batch=False, tune_precision=False, try_compile=False, reuse=False,
                     store_dir=str(tmp_path))
    assert "cudnn.benchmark" not in {d["step"] for d in tune(factory, cfg).plan.decisions}
    monkeypatch.setattr(path_mod, "cudnn_benchmark_applies", lambda conv, dev: conv)
    res = tune(factory, cfg)
    steps = {d["step"]: d for d in res.plan.decisions}
    assert steps["cudnn.benchmark"]["kept"] and res.plan.cudnn_benchmark
    assert tried.count("cudnn.benchmark") == 1
    assert TunePlan.from_dict(res.plan.to_dict()).cudnn_benchmark

    s = factory()
    before = torch.backends.cudnn.benchmark
    with TunedLoop(res.plan, s.model, s.optimizer, s.loader, s.loss_fn,
                   torch.device("cpu")):
        assert torch.backends.cudnn.benchmark
    assert torch.backends.cudnn.benchmark == before


def test_before_is_the_users_loader_not_a_worker_less_stand_in(tmp_path: Path) -> None:
    """A script that already loads with workers is measured "before" with them: a baseline
    of 0 workers would credit the tuner with what the user had already done."""
    from torch.utils.data import DataLoader, TensorDataset

    from redline.tune.path import TuneConfig, baseline_plan, tune
    from redline.tune.setup import TrainSetup

    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=8, num_workers=1, prefetch_factor=3,
                        persistent_workers=True)
    base = baseline_plan(_key(), 8, 8, loader)
    assert (base.num_workers, base.prefetch_factor, base.persistent_workers) == (1, 3, True)
    plain = baseline_plan(_key(), 8, 8, DataLoader(data, batch_size=8))
    assert (plain.num_workers, plain.prefetch_factor, plain.persistent_workers) == (0, None,
                                                                                     False)

    def factory() -> TrainSetup:
        torch.manual_seed(0)
        m = nn.Linear(8, 2)
        return TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                          loader=DataLoader(data, batch_size=8, num_workers=1,
                                            prefetch_factor=3, persistent_workers=True),
                          loss_fn=lambda mm, b: nn.functional.cross_entropy(mm(b[0]), b[1]))

    said: list[str] = []
    cfg = TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, tune_loader=False,
                     tune_batch=False, tune_precision=False, tune_kernels=False, reuse=False,
                     store_dir=str(tmp_path))
    res = tune(factory, cfg, log=said.append)
    assert "the loader as given (1 workers, prefetch 3" in said[0]
    assert res.before.steps >= 2 and res.after.steps >= 2
