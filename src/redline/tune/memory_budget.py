"""A simulated device-memory budget for CPU runs: counts live tensor bytes and raises the error
CUDA raises when they would exceed the limit.

Deterministic, so batch finders (redline's and other tools') can be compared side by side on a
machine without a GPU. Bytes are counted per storage: a storage's Python object lives as long
as its memory does (PyTorch preserves it), so a weak reference to it tells exactly when the
memory is freed — including activations that only autograd still holds.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes < 2**30 else f"{nbytes / 2**30:.2f} GiB"


class MemoryBudget(TorchDispatchMode):
    """Inside ``with MemoryBudget(limit):``, tensors created by torch operations count against
    ``limit`` bytes; an allocation past it raises :class:`torch.OutOfMemoryError` with CUDA's
    wording (marked as simulated).

    Args:
        limit_bytes: the simulated device memory; None = no limit (only count and record).
        existing: tensors allocated before (parameters, buffers, optimizer state) to count too.
        count_meta: count tensors on the meta device too (shapes without memory: what a step
            would allocate, at no cost; :func:`redline.plan.activations.activation_bytes`).
    """

    def __init__(self, limit_bytes: int | None, existing: Iterable[torch.Tensor] = (),
                 count_meta: bool = False) -> None:
        super().__init__()
        self.count_meta = count_meta
        if limit_bytes is None:
            limit_bytes = 2**62  # record only: no limit
        if limit_bytes <= 0:
            raise ValueError(f"limit_bytes must be > 0, got {limit_bytes}")
        self.limit = int(limit_bytes)
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}
        self.timeline: list[int] | None = None
        """Live bytes after each allocation, once :meth:`record` was called."""
        self.timeline_ops: list[str] = []
        """The operator that made each allocation of :attr:`timeline` (``aten.mm`` …): a
        step's timelines at two batch sizes are aligned by them where a kernel choice depends
        on the batch (batch 1 often takes other paths)."""
        self._op = ""
        for tensor in existing:
            self._track(tensor, check=False)

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def _track(self, tensor: torch.Tensor, check: bool = True) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)  # stable for the storage's lifetime (its Python object is preserved)
        if key in self._sizes:
            return
        nbytes = int(storage.nbytes())
        if check and self.live + nbytes > self.limit:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {_mib(nbytes)}. GPU 0 has a total capacity "
                f"of {_mib(self.limit)} of which {_mib(self.limit - self.live)} is free. "
                f"Of the allocated memory {_mib(self.live)} is allocated by PyTorch. "
                "(simulated by redline.tune.MemoryBudget)")
        self._sizes[key] = nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        if self.timeline is not None:
            self.timeline.append(self.live)
            self.timeline_ops.append(self._op)
        weakref.finalize(storage, self._free, key)

    def reset_peak(self) -> None:
        self.peak = self.live

    def record(self) -> None:
        """Start (or restart) the allocation timeline and the peak: the batch finder fits each
        point of it against the batch size (redline.tune.batch_finder)."""
        self.timeline = []
        self.timeline_ops = []
        self.reset_peak()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.timeline is not None:
            self._op = func.__name__
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and (self.count_meta or tensor.device.type != "meta"):
                self._track(tensor)
        return out
