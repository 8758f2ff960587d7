"""The SIMULATED accelerator: device time by its formula, split forward/backward, bf16 faster,
real gradients; the demo labels it; tuning on it keeps what its physics reward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from redline.cli.main import main
from redline.tune import TuneConfig, tune
from redline.tune.setup import TrainSetup
from redline.workloads import VisionConfig
from redline.workloads.simulated import (
    SimulatedAccelerator,
    SimulatedDeviceModel,
    build_vision_simulated,
)


def test_device_time_formula_and_validation() -> None:
    sim = SimulatedAccelerator(fixed_s=0.004, sample_s=0.001, half_speedup=2.0)
    assert sim.device_s(16, half=False) == pytest.approx(0.004 + 0.016)
    assert sim.device_s(64, half=True) == pytest.approx(0.004 + 0.032)
    assert "SIMULATED" in sim.label()
    with pytest.raises(ValueError, match="half_speedup"):
        SimulatedAccelerator(half_speedup=0.5)
    with pytest.raises(ValueError, match=">= 0 seconds"):
        SimulatedAccelerator(fixed_s=-1.0)


def test_forward_and_backward_sleep_their_shares_and_gradients_are_the_stand_ins() -> None:
    slept: list[float] = []
    sim = SimulatedAccelerator(fixed_s=0.003, sample_s=0.0015, half_speedup=3.0)
    torch.manual_seed(0)
    stand_in = nn.Linear(4, 2)
    model = SimulatedDeviceModel(stand_in, sim, sleep=slept.append)
    x = torch.randn(8, 4)
    out = model(x)
    t = 0.003 + 8 * 0.0015
    assert slept == pytest.approx([t / 3])  # forward share
    out.sum().backward()
    assert slept == pytest.approx([t / 3, 2 * t / 3])  # backward: twice the forward
    ref = nn.Linear(4, 2)
    ref.load_state_dict(stand_in.state_dict())
    ref(x).sum().backward()
    assert stand_in.weight.grad is not None and ref.weight.grad is not None
    assert torch.equal(stand_in.weight.grad, ref.weight.grad)  # pacing is an identity

    slept.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x).float().sum().backward()
    t_half = 0.003 + 8 * 0.0015 / 3.0
    assert slept == pytest.approx([t_half / 3, 2 * t_half / 3])

    slept.clear()
    with torch.no_grad():
        model(x)
    assert slept == pytest.approx([t / 3])  # inference: forward only


def test_demo_refuses_the_simulated_accelerator_for_lm(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--workload", "lm", "--simulated-accelerator"]) == 2
    err = capsys.readouterr().err
    assert "'vision' workload only" in err and "--workload lm" in err


def _factory(sim: SimulatedAccelerator) -> Any:
    cfg = VisionConfig(num_images=8, length=512, crop=32)

    def factory() -> TrainSetup:
        w = build_vision_simulated(sim, cfg)
        return TrainSetup(model=w.model, optimizer=w.optimizer, loader=w.loader,
                          loss_fn=lambda m, b: w.loss_fn(m, b, w.device), device="cpu",
                          accumulation_steps=w.accumulation_steps)

    return factory


@pytest.mark.slow
def test_tuning_on_the_simulated_accelerator_keeps_the_batch_and_bf16(tmp_path: Path) -> None:
    """Launch-bound device (large fixed cost) with a 4× tensor-core speed-up: merging the
    4 micro-batches saves 3 fixed costs per step and bf16 quarters the per-sample time, both
    far outside noise (sleeps dominate the step)."""
    sim = SimulatedAccelerator(fixed_s=0.03, sample_s=0.002, half_speedup=4.0)
    cfg = TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, numerics_steps=2,
                     loader_batches_per_trial=4, try_compile=False, reuse=False,
                     tune_kernels=False, store_dir=str(tmp_path))
    res = tune(_factory(sim), cfg)
    p = res.plan
    assert p.effective_batch == 64 and p.micro_batch == 64 and p.accumulation_steps == 1
    assert p.precision == "bf16"
    kept = {d.label: d.kept for d in p.decisions}
    assert kept["batch size"] and kept["precision bf16"]
    assert res.speedup is not None and res.speedup > 1.5
