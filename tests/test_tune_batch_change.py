"""A larger effective batch only where allowed (``--allow-batch-change``): the learning-rate
rule by optimizer, the guard over the same samples, the plan applied with its scaled rate and
warm-up, and nothing changed without the flag."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from redline.tune import TrainSetup, apply_plan
from redline.tune.batch_change import LINEAR, SQRT, check_batch_change, concat, lr_rule
from redline.tune.config import TuneConfig
from redline.tune.knobs.batch_change import BATCH_CHANGE_RECORD
from redline.tune.run import tune
from test_tune_path import speeds


def _data(n: int = 4096) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(n, 1, generator=g))


def _setup(opt: str = "sgd", lr: float = 0.02, limit: int | None = None) -> TrainSetup:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer: torch.optim.Optimizer = (
        torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9) if opt == "sgd" else
        torch.optim.AdamW(model.parameters(), lr=lr) if opt == "adamw" else
        torch.optim.Rprop(model.parameters()))
    return TrainSetup(model=model, optimizer=optimizer,
                      loader=DataLoader(_data(), batch_size=16, shuffle=True, drop_last=True),
                      loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
                      run_steps=2000, memory_limit_bytes=limit)


def _cfg(tmp_path: Path, allow: bool) -> TuneConfig:
    return TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, numerics_steps=4,
                      tune_loader=False, tune_precision=False, tune_kernels=False,
                      reuse=False, store_dir=str(tmp_path), allow_batch_change=allow)


def _larger_is_faster(plan: Any) -> float:
    return 0.01 * plan.effective_batch ** 0.5  # seconds a step: samples/s grow with the batch


def test_rules_follow_the_optimizer_and_cite_their_source() -> None:
    assert lr_rule(_setup("sgd").optimizer) is LINEAR
    assert lr_rule(_setup("adamw").optimizer) is SQRT
    assert lr_rule(_setup("rprop").optimizer) is None
    assert LINEAR.scale(4) == 4 and SQRT.scale(4) == 2
    assert LINEAR.warmup_steps(2000) == 100 and SQRT.warmup_steps(2000) == 0
    assert "Goyal" in LINEAR.source and "Malladi" in SQRT.source
    a, b = (torch.ones(2, 3), {"y": torch.zeros(2)}), (torch.ones(3, 3), {"y": torch.ones(3)})
    x, d = concat([a, b])
    assert x.shape == (5, 3) and d["y"].tolist() == [0, 0, 1, 1, 1]


def test_without_the_flag_the_effective_batch_is_never_changed(tmp_path: Path) -> None:
    res = tune(lambda: _setup("sgd"), _cfg(tmp_path, allow=False),
               measure_fn=speeds(_larger_is_faster))
    assert res.plan.effective_batch == 16 and res.plan.lr_scale == 1.0
    assert res.plan.user_effective_batch is None and not res.plan.notes
    assert BATCH_CHANGE_RECORD.label not in {d.knob for d in res.plan.decisions}


def test_sgd_grows_with_a_linear_rate_and_warm_up_and_says_so(tmp_path: Path) -> None:
    res = tune(lambda: _setup("sgd"), _cfg(tmp_path, allow=True),
               measure_fn=speeds(_larger_is_faster))
    p = res.plan
    d = next(d for d in p.decisions if d.knob == BATCH_CHANGE_RECORD.label)
    assert d.kept and d.value == "128" and d.label == "effective batch 128"
    assert (p.effective_batch, p.user_effective_batch, p.lr_scale) == (128, 16, 8.0)
    assert p.lr_rule == "linear" and p.lr_warmup_steps == round(0.05 * 2000 / 8)
    assert d.numerics is not None and "of the user's progress" in d.numerics
    assert d.details["lr_rule_source"] == LINEAR.source
    (note,) = p.notes
    assert "The optimization changed: effective batch 16 → 128" in note
    assert "Validate before adopting it" in note
    # the same samples in an eighth of the steps
    assert res.after_projection.run_steps == 250 and res.before_projection.run_steps == 2000


def test_adam_grows_by_the_square_root_to_the_largest_ratio_the_guard_passes(
        tmp_path: Path) -> None:
    """Adam's steps are about its rate whatever the gradient: 8× fewer steps at √8× the rate
    make ~45 % of the progress over the guard's samples, refused; half the ratio passes."""
    res = tune(lambda: _setup("adamw", lr=1e-3), _cfg(tmp_path, allow=True),
               measure_fn=speeds(_larger_is_faster))
    p = res.plan
    d = next(d for d in p.decisions if d.knob == BATCH_CHANGE_RECORD.label)
    assert d.kept and p.lr_rule == "sqrt" and p.lr_warmup_steps == 0
    assert p.effective_batch in (32, 64)
    assert p.lr_scale == pytest.approx(math.sqrt(p.effective_batch / 16))
    assert str(d.details["refused_larger"]).startswith("128: ")


def test_an_optimizer_without_a_rule_and_a_full_memory_are_refused(tmp_path: Path) -> None:
    res = tune(lambda: _setup("rprop"), _cfg(tmp_path, allow=True),
               measure_fn=speeds(_larger_is_faster))
    d = next(d for d in res.plan.decisions if d.knob == BATCH_CHANGE_RECORD.label)
    assert not d.kept and "Rprop has no stated learning-rate rule" in d.reason
    # a memory budget that holds the user's batch and not twice it
    res = tune(lambda: _setup("sgd", limit=16_000), _cfg(tmp_path, allow=True),
               measure_fn=speeds(_larger_is_faster))
    d = next(d for d in res.plan.decisions if d.knob == BATCH_CHANGE_RECORD.label)
    assert not d.kept and "no multiple of the effective batch 16" in d.reason
    assert res.plan.effective_batch == 16


def test_the_guard_refuses_a_rate_that_diverges() -> None:
    s = _setup("sgd", lr=0.02)
    it = iter(DataLoader(_data(), batch_size=16))
    batches = [next(it) for _ in range(17)]
    w0 = [p.detach().clone() for p in s.model.parameters()]
    guard = {"heldout": batches[-1], "effective": 16, "ratio": 4, "micro": 16, "to_micro": 64,
             "loss_fn": s.loss_fn, "min_progress": 0.5}
    ok = check_batch_change(s.model, s.optimizer, batches[:-1], lr_scale=4.0, **guard)
    bad = check_batch_change(s.model, s.optimizer, batches[:-1], lr_scale=400.0, **guard)
    assert ok.passed and ok.samples == 256 and ok.progress >= 0.5, ok.reason
    assert ok.heldout_loss_before < ok.heldout_loss_start
    assert not bad.passed and bad.reason.startswith("refused:"), bad.reason
    # the model and optimizer are left as they were
    assert all(torch.equal(a, b) for a, b in zip(w0, s.model.parameters(), strict=True))
    assert s.optimizer.param_groups[0]["lr"] == 0.02 and not s.optimizer.state


def test_the_plan_applies_its_scaled_rate_after_the_warm_up(tmp_path: Path) -> None:
    res = tune(lambda: _setup("sgd"), _cfg(tmp_path, allow=True),
               measure_fn=speeds(_larger_is_faster))
    plan = res.plan
    s = _setup("sgd")
    tuned = apply_plan(plan, s.model, s.optimizer, s.loader, s.loss_fn)
    group = tuned.optimizer.param_groups[0]
    seen = []
    for k, batch in enumerate(tuned.loader):
        tuned.step(batch)
        seen.append(group["lr"])  # the rate that step used
        if k > plan.lr_warmup_steps + 1:
            break
    assert batch[0].shape[0] == 128  # the loader yields the larger effective batch
    w = plan.lr_warmup_steps
    assert seen[0] == pytest.approx(0.02 * 8 * tuned.lr_factor(0))
    assert seen[0] == pytest.approx(0.02)  # warm-up starts from the user's rate
    assert seen[w] == pytest.approx(0.16) and seen[-1] == pytest.approx(0.16)
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(seen))
