"""The simulated device-memory budget counts what a real device would hold."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from redline.tune import MemoryBudget


def test_counts_live_bytes_and_frees_them() -> None:
    mb = MemoryBudget(2**30)
    with mb:
        a = torch.zeros(1000)  # 4000 bytes
        b = a.view(10, 100)  # a view: no new memory
        assert mb.live == 4000
        c = a + 1
        assert mb.live == 8000
        del c
        assert mb.live == 4000
        del a, b
    assert mb.live == 0 and mb.peak == 8000


def test_activations_held_only_by_autograd_still_count() -> None:
    """The Python tensor dies, autograd keeps its memory until backward: still counted."""
    x = torch.randn(1000, requires_grad=True)
    mb = MemoryBudget(2**30, existing=[x])
    with mb:
        y = x.exp()  # exp saves its output for backward
        z = y.sum()
        del y
        held = mb.live
        assert held >= 4000 + 4000  # x and exp's output
        z.backward()  # frees exp's saved output, allocates x.grad
        x.grad = None
    assert mb.live == held - 4000


def test_raises_cuda_style_out_of_memory() -> None:
    model = nn.Linear(256, 256)
    mb = MemoryBudget(2**20, existing=list(model.parameters()))
    with pytest.raises(torch.OutOfMemoryError, match=r"CUDA out of memory\. Tried to allocate"
                                                     r".*simulated by redline"), mb:
        model(torch.randn(4096, 256))
    assert mb.live <= 2**20


def test_bad_limit() -> None:
    with pytest.raises(ValueError, match="limit_bytes must be > 0"):
        MemoryBudget(0)
