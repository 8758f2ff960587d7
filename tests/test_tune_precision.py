"""The numerics guard: a lower precision is kept only when its loss and gradients stay with
fp32's."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from redline.tune.precision import NonFiniteLossError, check_numerics


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


def test_which_precisions_each_device_is_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Faked CUDA devices: a V100 (7.0, no bf16) gets fp16 + GradScaler and no TF32; an A100
    (8.0, bf16) gets TF32 and bf16, and fp16 only where bf16 is missing."""
    from redline.tune import precision

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    v100 = precision.supported(cuda)
    assert v100["fp16"] is None and v100["bf16"] == "this GPU has no bf16 support"
    assert v100["tf32"] == "TF32 needs compute capability >= 8.0, have 7.0"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    a100 = precision.supported(cuda)
    assert a100["tf32"] is None and a100["bf16"] is None
    assert a100["fp16"] is not None and "only tried where it is not" in a100["fp16"]


def test_tf32_switches_both_flags_and_restores_them() -> None:
    from redline.tune.precision import tf32

    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    with tf32(True):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        with tf32(False):
            assert not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cuda.matmul.allow_tf32
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_fp16_with_grad_scaler_passes_a_normal_model() -> None:
    """fp16 autocast + GradScaler for real (CPU autocast runs fp16 too)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    chk = check_numerics(m, opt, _batches(), 8,
                         lambda mm, b: nn.functional.mse_loss(mm(b[0]), b[1]), "fp16",
                         torch.device("cpu"))
    assert chk.passed, chk.reason
    assert chk.precision == "fp16" and chk.overflow_steps == 0


class _Huge(nn.Module):
    """Activations near 1e5: beyond fp16's largest finite value (65,504), so fp16 overflows
    to inf where fp32 and bf16 do not."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lin(x * 2e4)
        return out


def test_fp16_that_overflows_is_refused_with_the_overflow_named() -> None:
    torch.manual_seed(0)
    m = _Huge()
    opt = torch.optim.SGD(m.parameters(), lr=1e-12)
    chk = check_numerics(m, opt, _batches(), 16,
                         lambda mm, b: nn.functional.mse_loss(mm(b[0]), b[1] * 1e4), "fp16",
                         torch.device("cpu"))
    assert not chk.passed and chk.overflow_steps >= 2
    assert chk.reason.startswith("fp16 refused") and "steps overflowed (GradScaler skipped " \
        "them" in chk.reason
