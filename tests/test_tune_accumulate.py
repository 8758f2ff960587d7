"""Exact effective batch: micro-batch split, uneven last micro-batch, DDP no_sync."""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path

import pytest
import torch
from torch import nn

from rank_scripts import run_ranks
from redline.tune.accumulate import accumulate, batchnorm_modules, micro_sizes, split_batch

Pair = namedtuple("Pair", "x y")


def test_micro_sizes() -> None:
    assert micro_sizes(64, 24) == [24, 24, 16]
    assert micro_sizes(64, 16) == [16] * 4
    assert micro_sizes(5, 8) == [5]
    with pytest.raises(ValueError):
        micro_sizes(0, 4)


def test_split_keeps_structure_and_slices_per_sample_lists() -> None:
    batch = {"x": torch.arange(10).view(5, 2), "ids": list("abcde"), "scale": torch.tensor(2.0),
             "pair": Pair(torch.arange(5), torch.ones(5, 3))}
    parts = split_batch(batch, 2)
    assert [n for _, n in parts] == [2, 2, 1]
    last = parts[-1][0]
    assert last["x"].tolist() == [[8, 9]]
    assert last["ids"] == ["e"]
    assert last["scale"].item() == 2.0  # not per-sample: passed to every piece
    assert isinstance(last["pair"], Pair) and last["pair"].x.tolist() == [4]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Dropout(0.0), nn.Linear(12, 4))


def _loss(m: nn.Module, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(m(b[0]), b[1])


@pytest.mark.parametrize("micro", [64, 16, 24, 7, 1])
def test_gradients_equal_the_original_configuration(micro: int) -> None:
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(64, 6, generator=g), torch.randint(0, 4, (64,), generator=g)
    # The user's configuration: micro-batch 16 × 4, each loss divided by 4.
    ref = _model()
    for i in range(4):
        (_loss(ref, (x[16 * i:16 * (i + 1)], y[16 * i:16 * (i + 1)])) / 4).backward()
    tuned = _model()
    loss = accumulate(tuned, (x, y), micro, _loss)
    for a, b in zip(ref.parameters(), tuned.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)
    full = _loss(_model(), (x, y))
    assert loss.item() == pytest.approx(full.item(), rel=1e-5)


def test_uneven_last_micro_batch_is_weighted_by_size_not_by_count() -> None:
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(10, 6, generator=g), torch.randint(0, 4, (10,), generator=g)
    full = _model()
    _loss(full, (x, y)).backward()
    tuned = _model()
    accumulate(tuned, (x, y), 4, _loss)  # 4, 4, 2
    naive = _model()
    for i in range(3):  # what `loss / accumulation_steps` does: equal weights
        (_loss(naive, (x[4 * i:4 * i + 4], y[4 * i:4 * i + 4])) / 3).backward()
    w_full = next(full.parameters()).grad
    assert w_full is not None
    torch.testing.assert_close(next(tuned.parameters()).grad, w_full, rtol=1e-5, atol=1e-6)
    err = (next(naive.parameters()).grad - w_full).abs().max().item()  # type: ignore[operator]
    assert err > 1e-4  # the naive weighting really differs


def test_batchnorm_layers_are_named() -> None:
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    assert batchnorm_modules(m) == ["1"]


@pytest.mark.slow
def test_ddp_syncs_once_per_effective_batch(tmp_path: Path) -> None:
    for o in run_ranks("ddp_accumulate.py", tmp_path):
        # micro-batches 6, 6, 6, 2: only the last runs outside no_sync → one all-reduce (the
        # small model fits one bucket), not four.
        assert o["allreduce_calls"] == 1
        assert o["max_abs_err"] < 1e-6


@pytest.mark.slow
def test_fsdp2_reduces_once_per_effective_batch(tmp_path: Path) -> None:
    """FSDP2 has no no_sync(): accumulate() switches gradient sync off for every micro-batch
    but the last (set_requires_gradient_sync), so 3 fully_shard groups reduce 3 times per
    effective batch of 4 micro-batches, not 12, and each rank's shard is the full batch's."""
    for o in run_ranks("fsdp_accumulate.py", tmp_path):
        assert o["reductions"] == 3
        assert o["max_abs_err"] < 1e-6
