"""Kernel knobs: which apply to a model, hand-written attention located, compile amortized."""

from __future__ import annotations

import torch
from torch import nn

from redline.tune.kernels import find_unfused_attention, has_conv2d, optimizer_impls
from redline.tune.runtime import rebuild_optimizer


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


def test_compile_is_kept_only_when_amortized_over_the_run() -> None:
    from redline.tune.decide import one_off_pays

    # 30 s to compile, 0.20 → 0.15 s/step: pays after 600 steps (+5 % margin), not before.
    assert one_off_pays(30, 0.20, 0.15, 10_000, 0.05)[0]
    assert not one_off_pays(30, 0.20, 0.15, 500, 0.05)[0]
    keep, eager, comp = one_off_pays(30, 0.20, 0.15, 1000, 0.05)
    assert (eager, comp) == (200.0, 180.0) and keep
