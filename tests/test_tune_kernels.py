"""Kernel knobs: which apply to a model, hand-written attention located, compile amortized."""

from __future__ import annotations

import torch
from torch import nn

from redline.tune.kernels import find_unfused_attention, has_conv2d, optimizer_impls
from redline.tune.knobs.optimizer import rebuild_optimizer


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


def test_the_tuned_loop_applies_each_kernel_knob_and_undoes_process_settings() -> None:
    """The apply stages of channels_last, cudnn.benchmark, the optimizer's implementation, the
    learning-rate scale and the loader's torch threads, on one CPU loop: each visible in the
    loop's pieces, the process-wide ones restored when it closes."""
    from torch.utils.data import DataLoader, TensorDataset

    from factories import plan_key
    from redline.tune.knobs import TunePlan
    from redline.tune.knobs.channels_last import to_channels_last
    from redline.tune.runtime import TunedLoop

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 3, 8, 8), torch.randint(0, 2, (8,))),
                        batch_size=4)
    seen: list[bool] = []

    def loss(m: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
        seen.append(batch[0].is_contiguous(memory_format=torch.channels_last))
        return nn.functional.cross_entropy(m(batch[0]), batch[1])

    plan = TunePlan(key=plan_key(), effective_batch=8, micro_batch=4, channels_last=True,
                    cudnn_benchmark=True, optimizer_impl="foreach", lr_scale=2.0,
                    lr_rule="linear", torch_threads=1)
    threads, cudnn = torch.get_num_threads(), torch.backends.cudnn.benchmark
    with TunedLoop(plan, model, optimizer, loader, loss, torch.device("cpu")) as loop:
        weight = loop.model[0].weight
        assert weight.is_contiguous(memory_format=torch.channels_last)
        assert loop.optimizer is optimizer and optimizer.param_groups[0]["foreach"] is True
        assert optimizer.param_groups[0]["lr"] == 0.2  # no warm-up: the scaled rate at once
        assert torch.get_num_threads() == 1 and torch.backends.cudnn.benchmark is True
        batch = next(iter(loop.loader))
        assert loop.dataloader.batch_size == 8  # one effective batch, split in the step
        loop.step(batch)
    assert seen == [True, True]  # two micro-batches, both channels_last
    assert torch.get_num_threads() == threads and torch.backends.cudnn.benchmark is cudnn
    assert to_channels_last([torch.zeros(2, 3)])[0].dim() == 2  # only 4-D inputs change
