"""Whether a training step can be replayed as CUDA graphs, and why not.

A CUDA graph records the kernels of a step once and replays them with one launch, removing
the host's per-kernel launch cost, which is what a launch-bound step (short kernels, a busy
host) loses its device time to. The knob is ``torch.compile(mode="reduce-overhead")``
(PyTorch docs, "torch.compile: reduce-overhead mode uses CUDA graphs"): its static input
buffers are filled from each batch, and a graph is recorded per input shape. Recording is
refused where replay cannot be the same step:

- **dynamic shapes**: samples whose shapes differ from batch to batch (variable-length
  sequences) need a graph per shape, each recorded at its first appearance;
- **host reads of tensor values** inside the step (``.item()``, ``bool(tensor)``, an ``if`` on a
  tensor, ``torch.nonzero`` or ``unique`` whose output size depends on the data): a graph
  replays kernels, not the Python decisions taken from values it read (CUDA Programming
  Guide, "CUDA Graphs": no synchronization or host reads inside a capture).

Both are found on any device, the CPU included, by running one step under a dispatch-level
spy (:func:`graph_blockers`). Operators a capture does not support are found by capturing it
(on a GPU): the trial fails and the path records why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from redline.tune.kernels import user_frame

_aten = torch.ops.aten

SHAPE_BATCHES = 8
"""Batches whose per-sample shapes are compared before graphs are tried."""

_HOST_READS: dict[Any, str] = {
    _aten._local_scalar_dense.default: "reads a tensor's value on the host (.item(), "
                                       "bool(tensor), an `if` on a tensor)",
    _aten.nonzero.default: "torch.nonzero: an output size set by the data",
    _aten.masked_select.default: "masked_select: an output size set by the data",
    _aten.equal.default: "torch.equal: a host bool from tensor values",
}
for _name in ("_unique2", "unique_dim", "unique_consecutive", "_unique"):
    _op = getattr(_aten, _name, None)
    if _op is not None:
        _HOST_READS[_op.default] = "unique: an output size set by the data"


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphBlocker:
    """One place in the step a CUDA graph cannot replay."""

    location: str
    """'file:line' of the user's code (innermost frame outside torch and redline)."""
    what: str
    count: int
    """Times it ran in one step."""


class _HostReadSpy(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[tuple[str, str], int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        what = _HOST_READS.get(func)
        if what is not None:
            key = (user_frame(), what)
            self.seen[key] = self.seen.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


def graph_blockers(model: torch.nn.Module, batch: Any,
                   loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> list[GraphBlocker]:
    """Run one forward and backward (gradients cleared after) and return where the step reads
    tensor values on the host or makes data-dependent shapes."""
    spy = _HostReadSpy()
    try:
        with spy:
            loss = loss_fn(model, batch)
            loss.backward()
    finally:
        model.zero_grad(set_to_none=True)
    return [GraphBlocker(location=loc, what=what, count=count)
            for (loc, what), count in sorted(spy.seen.items())]


def sample_shapes(batch: Any) -> tuple[tuple[int, ...], ...]:
    """Per-sample shapes of a batch's tensors (the batch dimension dropped)."""
    return tuple(tuple(tensor.shape[1:]) for tensor in tree_leaves(batch) if isinstance(tensor, torch.Tensor))


def dynamic_shapes(batches: Sequence[Any]) -> str | None:
    """Why the batches' shapes are not static (per sample), or None."""
    shapes = {sample_shapes(batch) for batch in batches}
    if len(shapes) <= 1:
        return None
    shown = ", ".join(str(list(map(list, shape))) for shape in sorted(shapes)[:3])
    return (f"dynamic shapes: {len(shapes)} different per-sample shapes in {len(batches)} "
            f"batches ({shown}{' …' if len(shapes) > 3 else ''}): each needs its own graph")


def graph_refusal(batches: Sequence[Any], blockers: Sequence[GraphBlocker]) -> str | None:
    """Why CUDA graphs are not tried for this step, or None."""
    why = dynamic_shapes(batches)
    if why is not None:
        return why
    if blockers:
        blocker = blockers[0]
        more = f" (and {len(blockers) - 1} more)" if len(blockers) > 1 else ""
        return (f"the step {blocker.what} at {blocker.location}, {blocker.count}× per step{more}: a graph "
                "replays kernels, not decisions taken on the host from tensor values")
    return None
