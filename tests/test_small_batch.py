"""small_batch on any device: per-step costs that do not grow with the batch (here AdamW's
update of a ~10 M-parameter MLP) dominating the step, with the measured fixed and per-sample
parts; a compute-bound batch of the same model does not draw it."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import redline
from redline.core.measurements import Measurements
from redline.diagnose import diagnose
from redline.diagnose.thresholds import SMALL_BATCH_PROJECTED_FACTOR


def _run(batch: int, steps: int) -> Measurements:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024), nn.ReLU(),
                          nn.Linear(1024, 1024))
    assert 9e6 < sum(p.numel() for p in model.parameters()) < 11e6
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    n = batch * (steps + 3)
    loader = DataLoader(TensorDataset(torch.randn(n, 1024), torch.randn(n, 1024)),
                        batch_size=batch)
    with redline.watch(warmup_steps=3, count_flops=False) as w:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return w.report(show=False).measurements


def test_batch_2_with_adamw_is_small_batch_with_its_fixed_and_per_sample_parts() -> None:
    m = _run(2, 20)
    opt = m.fraction("optimizer")
    assert opt >= 0.5, opt  # the premise: AdamW's update dominates the step
    (f,) = [f for f in diagnose(m) if f.id == "small_batch"]
    ev = f.evidence
    step_ms = m.timing.step_time_mean_s * 1e3  # type: ignore[operator]
    assert ev["fixed_ms_per_step"] >= opt * step_ms - 1e-3  # type: ignore[operator]
    per_sample = (m.fraction("forward") + m.fraction("backward")
                  + m.fraction("data_wait")) * step_ms / 2
    assert ev["per_sample_ms"] is not None
    assert abs(ev["per_sample_ms"] - per_sample) <= 1e-3 + 0.01 * per_sample  # type: ignore[operator]
    fixed = ev["fixed_fraction"]
    assert isinstance(fixed, float) and fixed >= opt - 1e-4
    k = SMALL_BATCH_PROJECTED_FACTOR
    gain = ev[f"projected_throughput_gain_at_{k}x_batch"]
    assert abs(gain - 1 / (fixed / k + 1 - fixed)) < 0.01  # type: ignore[operator]
    assert f.ceiling_speedup is not None and abs(f.ceiling_speedup - 1 / (1 - fixed)) < 0.01
    assert "ms fixed per step" in f.title and "per sample" in f.title
    assert "--allow-batch-change" in f.fix and "accumulate" in f.fix


def test_the_same_mlp_at_batch_256_is_compute_bound_not_small_batch() -> None:
    m = _run(256, 6)
    assert m.fraction("forward") + m.fraction("backward") > 0.5
    assert "small_batch" not in {f.id for f in diagnose(m)}
