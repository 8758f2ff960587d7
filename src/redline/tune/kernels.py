"""Kernel knobs: which apply to this model, and hand-written attention with its code location.

The knobs (torch.compile, fused/foreach optimizer, channels_last, cudnn.benchmark) are measured
by the tuning path (:mod:`redline.tune.path`) and kept only when faster over the planned run;
this module says which are candidates. Replacing hand-written attention by
``torch.nn.functional.scaled_dot_product_attention`` is a code change, so it is reported with
the file and line of the softmax, not applied.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_TORCH_DIR = os.path.dirname(torch.__file__)
_REDLINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_WORKLOADS_DIR = os.path.join(_REDLINE_DIR, "workloads")  # built-in models are user code here
_aten = torch.ops.aten


def has_conv2d(model: torch.nn.Module) -> bool:
    """channels_last only changes anything for 4-D convolutions."""
    return any(isinstance(module, torch.nn.Conv2d) for module in model.modules())


def cudnn_benchmark_applies(model_has_conv: bool, device: torch.device) -> bool:
    """cudnn.benchmark only changes convolutions run by cuDNN (CUDA); elsewhere the flag is
    read by nothing, and a trial of it would only measure noise."""
    return model_has_conv and device.type == "cuda"


@contextlib.contextmanager
def cudnn_benchmark(enabled: bool) -> Iterator[None]:
    """``torch.backends.cudnn.benchmark`` set for the block, restored on exit (no state
    survives the call). With fixed input shapes the one-off algorithm search per shape
    (absorbed by a trial's warm-up steps) buys the fastest kernel for every later step
    (PyTorch docs, "CUDA semantics: cuDNN auto-tuner")."""
    prev = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = prev


def optimizer_impls(optimizer: torch.optim.Optimizer) -> list[str]:
    """The implementations this optimizer class offers ('fused', 'foreach'), fused first."""
    params = inspect.signature(type(optimizer).__init__).parameters
    current = {impl: optimizer.defaults.get(impl) for impl in ("fused", "foreach")}
    return [impl for impl in ("fused", "foreach") if impl in params and not current[impl]]


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionSite:
    """A softmax over a square score matrix between two batched matmuls."""

    location: str
    """'file:line' of the user's code that called softmax (innermost frame outside torch)."""
    score_shape: tuple[int, ...]
    calls_per_forward: int


def user_frame() -> str:
    """The innermost frame of the caller outside torch and redline (the built-in workloads count
    as user code), as 'file:line'."""
    for frame in reversed(traceback.extract_stack()):
        filename = os.path.abspath(frame.filename)
        ours = filename.startswith(_REDLINE_DIR) and not filename.startswith(_WORKLOADS_DIR)
        if not (filename.startswith(_TORCH_DIR) or ours or "<frozen" in filename):
            return f"{frame.filename}:{frame.lineno}"
    return "unknown location"


class _AttentionSpy(TorchDispatchMode):
    """GEMM → softmax(square last two dims) → GEMM, the pattern of trace/findings.py's
    ``unfused_attention``, seen at the op level (works on CPU)."""

    GEMM = (_aten.bmm.default, _aten.mm.default, _aten.matmul.default, _aten.baddbmm.default)
    SOFTMAX = (_aten._softmax.default, _aten.softmax.int, _aten._safe_softmax.default
               if hasattr(_aten, "_safe_softmax") else _aten._softmax.default)

    def __init__(self) -> None:
        super().__init__()
        self.gemm_square: set[tuple[int, int]] = set()
        self.pending: dict[tuple[int, int, int], tuple[tuple[int, ...], str]] = {}
        """(numel, rows, cols) of a softmax output → (shape, location): the next GEMM sees it
        through a view (b·h, t, t), so shapes are matched by size, not by exact shape."""
        self.sites: dict[str, tuple[tuple[int, ...], int]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in self.GEMM and isinstance(out, torch.Tensor) and out.dim() >= 2:
            last_two = (out.shape[-2], out.shape[-1])
            if last_two[0] == last_two[1] and last_two[0] >= 8:
                self.gemm_square.add(last_two)
            # A GEMM consuming a pending softmax output closes the pattern.
            for arg in tree_leaves(args):
                if not isinstance(arg, torch.Tensor) or arg.dim() < 2:
                    continue
                key = (arg.numel(), arg.shape[-2], arg.shape[-1])
                if key in self.pending:
                    shape, loc = self.pending.pop(key)
                    self.sites[loc] = (shape, self.sites.get(loc, (shape, 0))[1] + 1)
                    break
        elif func in self.SOFTMAX and isinstance(out, torch.Tensor) and out.dim() >= 3:
            last_two = (out.shape[-2], out.shape[-1])
            if last_two in self.gemm_square:
                self.pending[(out.numel(), *last_two)] = (tuple(out.shape), user_frame())
        return out


def find_unfused_attention(model: torch.nn.Module, batch: Any,
                           loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
                           ) -> list[AttentionSite]:
    """Run one forward (no backward, no gradient) and return the hand-written attention sites."""
    spy = _AttentionSpy()
    was_training = model.training
    try:
        with torch.no_grad(), spy:
            loss_fn(model, batch)
    finally:
        model.train(was_training)
    return [AttentionSite(location=loc, score_shape=shape, calls_per_forward=calls) for loc, (shape,
                          calls) in sorted(spy.sites.items())]
