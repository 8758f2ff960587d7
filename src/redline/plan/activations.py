"""Activation memory counted, not assumed: one forward of the model on the meta device (shapes
without memory, so a 70B model costs nothing) at two micro-batch sizes, every tensor still
alive after it counted once per storage (:class:`redline.tune.MemoryBudget` in counting mode):
what autograd keeps for backward, for any architecture.

Dropout is counted as CUDA runs it: PyTorch's fused ``native_dropout`` keeps a 1-byte mask,
while the device-generic path (CPU, meta) keeps it in the activation dtype; the count patches
``torch.nn.functional.dropout`` to the fused form for its duration. The per-sample slope
between the two sizes is the model's activation bytes per sample; the intercept is what does
not grow with the batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redline.plan.limits import PlanInputError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredActivations:
    """Bytes alive after a forward pass, as a line in the micro-batch."""

    bytes_per_sample: float
    fixed_bytes: float
    batches: tuple[int, int]
    dtype: str
    source: str

    def at(self, micro_batch: int) -> float:
        return self.fixed_bytes + self.bytes_per_sample * micro_batch


@contextlib.contextmanager
def _fused_dropout() -> Iterator[None]:
    import torch
    import torch.nn.functional as F

    original = F.dropout

    def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True,
                inplace: bool = False) -> torch.Tensor:
        if not training or p == 0:
            return input
        return torch.native_dropout(input, p, training)[0]

    F.dropout = dropout
    try:
        yield
    finally:
        F.dropout = original


def _alive_after_forward(model: torch.nn.Module, batch: Any,
                         forward: Callable[[torch.nn.Module, Any], Any]) -> int:
    from redline.tune.memory_budget import MemoryBudget

    with _fused_dropout(), MemoryBudget(None, existing=[*model.parameters(), *model.buffers()],
                                        count_meta=True) as mb:
        before = mb.live
        out = forward(model, batch)
        alive = int(mb.live - before)
        del out
    return alive


def activation_bytes(model: torch.nn.Module, make_batch: Callable[[int], Any],
                     forward: Callable[[torch.nn.Module, Any], Any], *,
                     dtype: torch.dtype | None = None,
                     batches: tuple[int, int] = (1, 2)) -> MeasuredActivations:
    """Count the activations of ``forward(model, make_batch(b))`` at two batch sizes.

    Args:
        model: on the meta device (``with torch.device("meta"): model = Net()``); converted to
            ``dtype`` here (16-bit training keeps 16-bit activations).
        make_batch: a batch of ``b`` samples, on the meta device.
        forward: runs the forward and returns the loss (or the output).
        dtype: the activation dtype (16-bit training: ``torch.bfloat16``); None leaves the
            model's.
        batches: the two micro-batch sizes counted, ``0 < b1 < b2`` (default (1, 2)).

    Returns:
        :class:`MeasuredActivations`: bytes per sample (the slope between the two counts) and
        fixed bytes (the intercept), with the sizes, dtype and source.

    Raises:
        PlanInputError: the model is not on the meta device, the sizes are not
            ``0 < b1 < b2``, or its forward does not run on the meta device.
    """
    if any(p.device.type != "meta" for p in model.parameters()):
        raise PlanInputError("activation counting needs the model on the meta device (build "
                             "it under `with torch.device(\"meta\"):`): a real model would "
                             "allocate its memory")
    if dtype is not None:
        model = model.to(dtype)
    model.train()
    b1, b2 = batches
    if not 0 < b1 < b2:
        raise PlanInputError(f"need two batch sizes 0 < b1 < b2, got {batches}")

    def cast(batch: Any) -> Any:
        from redline.data.prefetcher import map_tensors

        return map_tensors(batch, lambda t: t.to(dtype) if dtype is not None
                           and t.is_floating_point() else t)

    try:
        a1 = _alive_after_forward(model, cast(make_batch(b1)), forward)
        a2 = _alive_after_forward(model, cast(make_batch(b2)), forward)
    except (NotImplementedError, RuntimeError) as e:
        raise PlanInputError(f"the model's forward does not run on the meta device "
                             f"({type(e).__name__}: {str(e)[:300]}); give its shape "
                             "(`layers`, `hidden`, `heads`, `seq`) for the formula instead") \
            from None
    slope = (a2 - a1) / (b2 - b1)
    return MeasuredActivations(bytes_per_sample=slope, fixed_bytes=a1 - slope * b1, batches=(b1, b2),
                               dtype=str(dtype).removeprefix("torch.") if dtype else "as built",
                               source=f"counted on the meta device at micro-batches {b1} and {b2}")
