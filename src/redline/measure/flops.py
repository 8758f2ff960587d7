"""FLOPs of one training step, counted once with ``torch.utils.flop_counter``.

MFU (PaLM, arXiv 2204.02311, Appendix B): model FLOPs per second ÷ the device's peak FLOP/s for
the dtype in use. FlopCounterMode counts matmuls, convolutions and SDPA (2·m·n·k per GEMM) for
forward and backward; it does not discount causal attention and counts no recompute
(``torch.utils.flop_counter``), which is the MFU (not HFU) convention.

The counter is a dispatch mode: every operator call passes through Python, so a step of many
small calls (a loop of ``LSTMCell`` steps) runs many times slower while counted. The count
therefore covers one forward+backward (from the step's start to the end of its first outermost
backward) and is scaled by the backward passes the step made: an LBFGS step's closures or the
micro-batches of gradient accumulation are counted once, not each time. The optimizer's own
work is not model FLOPs and is not counted.

The slice is counted by :class:`_Counting`, a dispatch mode that applies torch's own formulas
(``torch.utils.flop_counter.flop_registry``) and counts the same total as ``FlopCounterMode``
at a fraction of its cost: it keeps no per-module table (``FlopCounterMode`` tracks the
module stack through hooks on every module call) and tries an operator's decomposition once,
not at every call, remembering the operators that have none. On a step of many small calls
(two ``LSTMCell`` stepped over 119 time steps) ``FlopCounterMode`` slowed the counted forward
and backward ~10×, this mode ~4× (``benchmarks/overhead.py`` prints the job's whole-run cost).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

_aten = torch.ops.aten
_SIZE_QUERIES = frozenset(
    op for op in (getattr(getattr(_aten, name, None), overload, None) for name, overload in (
        ("sym_is_contiguous", "default"), ("is_contiguous", "default"),
        ("is_contiguous", "memory_format"), ("is_strides_like_format", "default"),
        ("is_non_overlapping_and_dense", "default"), ("size", "default"),
        ("sym_size", "default"), ("stride", "default"), ("sym_stride", "default"),
        ("storage_offset", "default"), ("sym_storage_offset", "default"),
        ("numel", "default"), ("sym_numel", "default"), ("dim", "default")))
    if op is not None)
"""Queries that tensor subclasses with their own size policy (nested tensors) answer
themselves; passed on as ``FlopCounterMode`` passes them."""


class _Counting(TorchDispatchMode):
    """FLOPs of the operators run under it, by ``torch.utils.flop_counter``'s formulas."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0
        self.conv_flops = 0
        self._no_decomposition: set[Any] = {torch.ops.prim.device.default}
        """Operators without a formula found to have no decomposition either."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs if kwargs else {}
        if func in _SIZE_QUERIES or isinstance(func, torch._ops.HigherOrderOperator):
            # higher-order operators (torch.cond, user Triton kernels) are not counted here
            return NotImplemented
        packet = func._overloadpacket
        formula = flop_registry.get(packet)
        if formula is None and func not in self._no_decomposition:
            # an operator made of others that have formulas: count those (as FlopCounterMode)
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
            self._no_decomposition.add(func)
        out = func(*args, **kwargs)
        if formula is not None:
            n = int(formula(*args, **kwargs, out_val=out))
            self.flops += n
            if "convolution" in packet.__name__:
                self.conv_flops += n
        return out


class FlopWindow:
    """Counts FLOPs between :meth:`start` and :meth:`stop` (one step), on the calling thread.

    The dispatch mode is entered and left at step boundaries (inside optimizer hooks), so it
    brackets exactly one step; that step is slowed and is excluded from timing statistics.
    """

    def __init__(self) -> None:
        self._mode: _Counting | None = None
        self.flops: float | None = None
        self.conv_flops: float | None = None
        """The part of ``flops`` in convolutions (forward and backward): cuDNN runs fp32
        convolutions in TF32 by default while fp32 matmuls stay fp32, so MFU needs both."""
        self.error: str | None = None
        self.passes: int | None = None
        """Backward passes of the counted step that ``flops`` was scaled to (the count covered
        the first one); None while nothing is counted or when no backward ended the slice."""
        self._slice: tuple[float, float] | None = None
        """(FLOPs, convolution FLOPs) of the slice, once its first backward ended."""

    @property
    def active(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        self._slice = None
        try:
            mode = _Counting()
            mode.__enter__()
            self._mode = mode
        except Exception as e:  # counting is best-effort; say why it failed
            self.error = f"FLOP counting could not start: {type(e).__name__}: {e}"

    def backward_ended(self) -> None:
        """The step's first outermost backward returned (on the training thread): stop
        counting; :meth:`stop` scales the slice to the step's backward passes."""
        mode, self._mode = self._mode, None
        if mode is not None:
            self._slice = self._exit(mode)

    def stop(self, passes: int = 1) -> None:
        """End of the counted step, which made ``passes`` outermost backwards: its FLOPs are
        the slice's × ``passes`` where a backward ended the slice, else all it counted."""
        mode, self._mode = self._mode, None
        if mode is not None:
            counted = self._exit(mode)
            if counted is not None:
                self.flops, self.conv_flops = counted
        elif self._slice is not None:
            n = max(1, passes)
            self.flops, self.conv_flops = self._slice[0] * n, self._slice[1] * n
            self.passes = n
        self._slice = None

    def _exit(self, mode: _Counting) -> tuple[float, float] | None:
        try:
            mode.__exit__(None, None, None)
            return float(mode.flops), float(mode.conv_flops)
        except Exception as e:
            self.error = f"FLOP counting failed: {type(e).__name__}: {e}"
            return None
