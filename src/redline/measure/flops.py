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
module stack through hooks on every module call), decides what to do with an operator once
(one dict lookup a call after its first), and reads the matrix products' FLOPs from their
operands' shapes without the formulas' pytree wrapper. Every operator of the slice still passes
through Python: a dispatch mode that only calls the operator is the floor. On a step of many
small calls (two ``LSTMCell`` stepped over 119 time steps, ~15,000 operator calls a forward and
backward, ~3 µs each bare) ``FlopCounterMode`` slows the counted forward and backward ~10×, an
empty dispatch mode ~2.9×, this mode ~3.0× (``benchmarks/overhead.py`` prints the job's cost).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import conv_flop_count, flop_registry

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


_PASS, _RUN, _DECOMPOSE, _COUNT, _CONV, _GEMM = range(6)
_PRIM_DEVICE = torch.ops.prim.device.default


def _mm(a: torch.Tensor, b: torch.Tensor) -> int:
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


def _bmm(a: torch.Tensor, b: torch.Tensor) -> int:
    return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]


_GEMMS: dict[Any, Any] = {
    _aten.mm: lambda args: _mm(args[0], args[1]),
    _aten.addmm: lambda args: _mm(args[1], args[2]),
    _aten.bmm: lambda args: _bmm(args[0], args[1]),
    _aten.baddbmm: lambda args: _bmm(args[1], args[2]),
}
"""The matrix products by their operands' shapes: torch's formulas for them
(``mm_flop``, ``addmm_flop``, ``bmm_flop``, ``baddbmm_flop``: 2·m·n·k per product) without
their wrapper, which maps every argument to its shape through pytree at each call."""


def _slow_conv2d(x: torch.Tensor, w: torch.Tensor, *args: Any, out_val: Any = None,
                 **kwargs: Any) -> int:
    return int(conv_flop_count(list(x.shape), list(w.shape), list(out_val.shape),
                               transposed=False))


_OWN_FORMULAS: dict[Any, Any] = {_aten._slow_conv2d_forward: _slow_conv2d}
"""Operators whose formula in torch's registry takes other arguments than the operator has:
``_slow_conv2d_forward`` (input, weight, kernel size, bias, stride, padding) is registered
with ``conv_flop``, which also needs dilation and ``transposed``."""


class _Counting(TorchDispatchMode):
    """FLOPs of the operators run under it, by ``torch.utils.flop_counter``'s formulas."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0
        self.conv_flops = 0
        self.failed: str | None = None
        """The first operator whose formula raised (the count is then unknown), else None."""
        self._plans: dict[Any, tuple[int, Any]] = {}
        """What to do with each operator, found at its first call: (_PASS, None) for a size
        query or a higher-order operator; (_COUNT, formula), (_CONV, formula) for a
        convolution, (_GEMM, f) for a matrix product (see _GEMMS); (_DECOMPOSE, None) for one
        without a formula whose decomposition is tried (_RUN once it has none); (_RUN, None)
        to run it uncounted. One dict lookup a call: the dispatch mode's own cost is paid on
        every operator of the slice."""

    def _plan(self, func: Any) -> tuple[int, Any]:
        if func in _SIZE_QUERIES or isinstance(func, torch._ops.HigherOrderOperator):
            # higher-order operators (torch.cond, user Triton kernels) are not counted here
            plan: tuple[int, Any] = (_PASS, None)
        else:
            packet = func._overloadpacket
            formula = _OWN_FORMULAS.get(packet) or flop_registry.get(packet)
            if formula is None:
                plan = (_RUN, None) if func is _PRIM_DEVICE else (_DECOMPOSE, None)
            elif packet in _GEMMS:
                plan = (_GEMM, _GEMMS[packet])
            else:
                # every convolution of the registry: `convolution`, its backward, cudnn's and
                # the CPU's `_slow_conv2d_forward`, whose name lacks the word
                plan = (_CONV if "conv" in packet.__name__ else _COUNT, formula)
        self._plans[func] = plan
        return plan

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs if kwargs else {}
        kind, formula = self._plans.get(func) or self._plan(func)
        if kind == _RUN:
            return func(*args, **kwargs)
        if kind == _PASS:
            return NotImplemented
        if kind == _DECOMPOSE:
            # an operator made of others that have formulas: count those (as FlopCounterMode)
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
            self._plans[func] = (_RUN, None)
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if kind == _GEMM:
            self.flops += int(formula(args))
            return out
        try:
            n = int(formula(*args, **kwargs, out_val=out))
        except Exception as e:  # a formula that does not fit the call: never the user's error
            self.failed = self.failed or f"{func}: {type(e).__name__}: {e}"
            self._plans[func] = (_RUN, None)
            return out
        self.flops += n
        if kind == _CONV:
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
            if mode.failed is not None:
                # a count without that operator's FLOPs is a lower bound: unknown, not a guess
                self.error = f"FLOP counting failed: the formula for {mode.failed}"
                return None
            return float(mode.flops), float(mode.conv_flops)
        except Exception as e:
            self.error = f"FLOP counting failed: {type(e).__name__}: {e}"
            return None
