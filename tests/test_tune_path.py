"""The path's order: which knobs are visited, again when a later change makes it worth it, and
what 'before' is. Speeds come from a measuring function with known speeds where the order is
the point; the before/after comparison is always measured."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from factories import plan_key as _key
from redline.tune.decide import MeasureFn
from redline.tune.decision import Decision
from redline.tune.knobs import TunePlan
from redline.tune.knobs.batch import BATCH_RECORD
from redline.tune.knobs.channels_last import ChannelsLastKnob
from redline.tune.knobs.compile import COMPILE_RECORD
from redline.tune.knobs.cudnn_benchmark import CUDNN_BENCHMARK_RECORD
from redline.tune.knobs.precision import PrecisionKnob
from redline.tune.path import TunePath
from redline.tune.result import TrialMetrics


def speeds(rule: Callable[[TunePlan], float]) -> MeasureFn:
    """A measuring function with known speeds: ``rule(plan)`` seconds per step, every step."""
    def measure(plan: TunePlan, label: str, step_only: bool) -> TrialMetrics:
        t = rule(plan)
        return TrialMetrics(label=label, throughput_samples_per_s=plan.effective_batch / t,
                            step_time_s=t, data_wait_fraction=None, device_busy_fraction=None,
                            mfu=None, peak_memory_bytes=None, peak_memory_source="",
                            energy_j_per_step=None, energy_source="", steps=12, wall_s=12 * t,
                            step_times_s=[t] * 12)
    return measure


def by_label(plan: TunePlan) -> dict[str, Decision]:
    return {d.label: d for d in plan.decisions}


def test_batch_is_searched_again_after_a_16_bit_precision_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a budget where fp32 fits micro-batch 29 of the effective 32, bf16 activations fit
    all 32: once bf16 is kept, the path looks at the batch again. (Speed decisions are faked
    here — this tests the order of the path, not this machine's timings.)"""
    import dataclasses

    from redline.tune.config import TuneConfig
    from redline.tune.run import tune

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "scripts"))
    import tune_tiny

    def bf16(self: PrecisionKnob, path: TunePath, plan: TunePlan) -> TunePlan:
        return dataclasses.replace(plan, precision="bf16")

    # Each larger micro-batch is faster: the batch knob is kept whenever it grows.
    faster = speeds(lambda plan: 1.0 / plan.micro_batch)
    monkeypatch.setattr(PrecisionKnob, "run", bf16)
    cfg = TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, tune_loader=False,
                     tune_kernels=False, reuse=False, store_dir=str(tmp_path))
    res = tune(lambda: tune_tiny.redline_setup(limit=200_000, width=256), cfg,
               measure_fn=faster)
    steps = by_label(res.plan)
    assert steps["batch size"].kept and steps["batch size"].value == "29"
    assert steps["batch size (again)"].kept and steps["batch size (again)"].value == "32"
    assert steps["batch size (again)"].details["accumulation_steps"] == 1
    assert res.plan.micro_batch == 32 and res.plan.accumulation_steps == 1
    assert res.plan.precision == "bf16"

    # bf16 kept only in the kernels stage (precision again, with channels_last): the batch is
    # looked at again there, once.
    def fp32(self: PrecisionKnob, path: TunePath, plan: TunePlan) -> TunePlan:
        return plan

    def kernels_bf16(self: ChannelsLastKnob, path: TunePath, plan: TunePlan) -> TunePlan:
        return dataclasses.replace(plan, precision="bf16")

    monkeypatch.setattr(PrecisionKnob, "run", fp32)
    monkeypatch.setattr(ChannelsLastKnob, "run", kernels_bf16)
    cfg = dataclasses.replace(cfg, tune_kernels=True, try_compile=False)
    res = tune(lambda: tune_tiny.redline_setup(limit=200_000, width=256), cfg,
               measure_fn=faster)
    again = [d for d in res.plan.decisions if d.knob == BATCH_RECORD.label and d.again]
    assert len(again) == 1 and again[0].kept and res.plan.micro_batch == 32


@pytest.mark.slow
def test_compile_is_measured_against_the_eager_step_and_amortized(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole compile knob on the CPU (inductor): a real compiled trial, the eager side
    measured on the step alone like it, and the decision from one_off_pays over run_steps."""
    from redline.tune.config import TuneConfig
    from redline.tune.run import tune

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "scripts"))
    import tune_tiny

    cfg = TuneConfig(steps_per_trial=3, rounds=1, warmup_steps=1, tune_loader=False,
                     tune_batch=False, tune_precision=False, reuse=False,
                     store_dir=str(tmp_path))
    res = tune(lambda: tune_tiny.redline_setup(limit=None), cfg)
    d = next(x for x in res.plan.decisions if x.knob == COMPILE_RECORD.label)
    assert "failed" not in d.reason, d.reason
    compile_s = d.details["compile_s"]
    assert isinstance(compile_s, float) and compile_s >= 0
    assert d.samples_per_s_before and d.samples_per_s_after
    assert "over 500 steps" in d.reason  # the factory's run_steps
    assert res.plan.compile is d.kept


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
    """cuDNN's fast 16-bit convolutions are NHWC: in NCHW a 16-bit precision can measure no
    faster, and then faster once channels_last is kept. A precision that passed the numerics
    guard is tried once more after channels_last. (Known speeds: this tests the path.)"""

    from redline.tune.config import TuneConfig
    from redline.tune.run import tune

    # channels_last halves the step; bf16 halves it again, but only in channels_last
    def step_s(plan: TunePlan) -> float:
        t = 0.5 if plan.channels_last else 1.0
        return t / 2 if plan.channels_last and plan.precision == "bf16" else t

    cfg = TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, tune_loader=False,
                     tune_batch=False, try_compile=False, reuse=False, store_dir=str(tmp_path))
    res = tune(_tiny_conv_setup, cfg, measure_fn=speeds(step_s))
    steps = by_label(res.plan)
    assert not steps["precision bf16"].kept
    assert steps["channels_last"].kept
    again = steps["precision bf16 (again, channels_last)"]
    assert again.kept and again.numerics is not None and "matches fp32" in again.numerics
    assert res.plan.precision == "bf16" and res.plan.channels_last


def test_cudnn_benchmark_is_a_measured_knob_for_conv_nets_on_cuda(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cudnn.benchmark is tried only where cuDNN runs the convolutions (a conv net on CUDA),
    kept when measured faster, and the tuned loop sets it only while it runs. (The CUDA check
    is patched and the speeds faked: this tests the path and the runtime on CPU.)"""

    from redline.tune.config import TuneConfig
    from redline.tune.kernels import cudnn_benchmark_applies
    from redline.tune.knobs import cudnn_benchmark as cudnn_knob
    from redline.tune.run import tune
    from redline.tune.runtime import TunedLoop

    assert not cudnn_benchmark_applies(True, torch.device("cpu"))
    assert cudnn_benchmark_applies(True, torch.device("cuda"))
    assert not cudnn_benchmark_applies(False, torch.device("cuda"))

    factory = _tiny_conv_setup

    tried: list[str] = []

    def step_s(plan: TunePlan) -> float:
        return 0.66 if plan.cudnn_benchmark else 1.0

    def measure(plan: TunePlan, label: str, step_only: bool) -> TrialMetrics:
        tried.append(label)
        return speeds(step_s)(plan, label, step_only)

    cfg = TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, tune_loader=False,
                     tune_batch=False, tune_precision=False, try_compile=False, reuse=False,
                     store_dir=str(tmp_path))
    res = tune(factory, cfg, measure_fn=measure)
    assert not any(d.knob == CUDNN_BENCHMARK_RECORD.label for d in res.plan.decisions)
    monkeypatch.setattr(cudnn_knob, "cudnn_benchmark_applies", lambda conv, dev: conv)
    res = tune(factory, cfg, measure_fn=measure)
    steps = by_label(res.plan)
    assert steps["cudnn.benchmark"].kept and res.plan.cudnn_benchmark
    assert tried.count("cudnn.benchmark") == 2  # one round: current and candidate
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

    from redline.tune.config import TuneConfig
    from redline.tune.path import baseline_plan
    from redline.tune.run import tune
    from redline.tune.setup import TrainSetup

    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=8, num_workers=1, prefetch_factor=3,
                        persistent_workers=True)
    base = baseline_plan(_key(), 8, 8, loader).loader
    assert (base.num_workers, base.prefetch_factor, base.persistent_workers) == (1, 3, True)
    plain = baseline_plan(_key(), 8, 8, DataLoader(data, batch_size=8)).loader
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


def test_tf32_and_fp16_are_decided_by_the_guard_and_the_measured_speed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a (faked) pre-Ampere GPU fp16 + GradScaler is the candidate; on an Ampere one TF32 is
    tried before bf16: each passes the numerics guard (run for real on this CPU) and is kept
    only when measured faster (faked speeds: this tests the path, not this machine)."""
    from redline.tune.config import TuneConfig
    from redline.tune.knobs import precision as precision_knob
    from redline.tune.run import tune

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "scripts"))
    import tune_tiny

    cfg = TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, tune_loader=False,
                     tune_batch=False, tune_kernels=False, reuse=False,
                     store_dir=str(tmp_path))
    pre_ampere = {"fp32": None, "tf32": "TF32 needs compute capability >= 8.0, have 7.0",
                  "bf16": "this GPU has no bf16 support", "fp16": None}
    monkeypatch.setattr(precision_knob, "supported", lambda device: pre_ampere)
    fp16_fast = speeds(lambda plan: 0.5 if plan.precision == "fp16" else 1.0)
    res = tune(lambda: tune_tiny.redline_setup(limit=None), cfg, measure_fn=fp16_fast)
    steps = by_label(res.plan)
    assert steps["precision fp16"].kept and res.plan.precision == "fp16"
    assert steps["precision fp16"].numerics is not None
    assert "matches fp32" in steps["precision fp16"].numerics
    assert not steps["precision tf32"].kept and "capability" in steps["precision tf32"].reason

    ampere = {"fp32": None, "tf32": None, "bf16": None,
              "fp16": "bf16 is supported: fp16 + GradScaler is only tried where it is not"}
    monkeypatch.setattr(precision_knob, "supported", lambda device: ampere)
    tf32_fast = speeds(lambda plan: 0.6 if plan.precision == "tf32" else 1.0)
    res = tune(lambda: tune_tiny.redline_setup(limit=None), cfg, measure_fn=tf32_fast)
    steps = by_label(res.plan)
    assert steps["precision tf32"].kept and res.plan.precision == "tf32"
    assert not steps["precision bf16"].kept  # slower than the TF32 now kept
    assert not steps["precision fp16"].kept


def _weights_heavy_setup(limit: int | None) -> Any:
    """Large weights, small activations, SGD (no optimizer state): autocast's 16-bit copies of
    the weights make the bf16 step bigger than the fp32 one at any batch."""
    from torch.utils.data import DataLoader, TensorDataset

    from redline.tune.setup import TrainSetup

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 4))
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(256, 256, generator=g), torch.randint(0, 4, (256,),
                                                                           generator=g))
    return TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.01),
                      loader=DataLoader(ds, batch_size=4, drop_last=True),
                      loss_fn=lambda mm, b: nn.functional.cross_entropy(mm(b[0]), b[1]),
                      accumulation_steps=8, memory_limit_bytes=limit)


def test_a_16_bit_precision_whose_step_does_not_fit_is_reverted(tmp_path: Path) -> None:
    """bf16 is faster (faked) and passes the numerics guard, but under this budget its step
    does not fit even at micro-batch 1 (weights' 16-bit copies): the search again finds so and
    the plan goes back to fp32, saying why, instead of failing the whole tune."""
    from redline.tune.config import TuneConfig
    from redline.tune.run import tune

    cfg = TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, tune_loader=False,
                     tune_kernels=False, reuse=False, store_dir=str(tmp_path))
    fast = speeds(lambda plan: (0.5 if plan.precision == "bf16" else 1.0) / plan.micro_batch)
    res = tune(lambda: _weights_heavy_setup(3_250_000), cfg, measure_fn=fast)
    steps = by_label(res.plan)
    assert res.plan.precision == "fp32"
    assert not steps["precision bf16"].kept
    assert "reverted" in steps["precision bf16"].reason
    assert "does not fit at micro-batch 1" in steps["precision bf16"].reason
    assert not steps["batch size (again)"].kept
    assert steps["batch size"].kept and 4 < res.plan.micro_batch < 32
