"""``DevicePrefetcher``: copy the next batch to the device while the current one computes.

The pattern of NVIDIA Apex's ``data_prefetcher`` (``examples/imagenet/main_amp.py``), as a drop-in wrapper:
the copy of batch *n+1* is issued on a side CUDA stream from pinned memory with
``non_blocking=True`` while batch *n* computes; before batch *n+1* is handed out the consumer's
stream waits for the copy (``wait_stream``, no host sync), and every tensor is
``record_stream``-ed on the consumer's stream so the caching allocator does not reuse its memory
while kernels still read it (torchtnt's prefetcher omits this). uint8 images can be converted to
float and normalized on the device, so the host ships 4× fewer bytes.

On a device that is not CUDA it is a correct pass-through (same batches, same normalization).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import (
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    MutableSequence,
    Sequence,
)
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

B = TypeVar("B")


@dataclass(slots=True, kw_only=True)
class PrefetchStats:
    """What the prefetcher did over its life, all epochs added (device times from CUDA
    events, read without synchronizing)."""

    batches: int = 0
    bytes_copied: int = 0
    """Bytes of host tensors copied to the device (a tensor already there is not counted)."""
    prefetched: int = 0
    """Batches whose copy was issued ahead on a side stream (the CUDA path; 0 on a
    pass-through, which copies nothing ahead)."""
    ready_when_requested: int = 0
    """Batches whose copy had already finished when the loop asked for them: fully hidden."""
    copy_s: float = 0.0
    """Device seconds spent copying (resolved batches only)."""
    resolved: int = 0

    @property
    def hidden_fraction(self) -> float | None:
        """Share of the batches copied ahead whose copy was entirely overlapped with compute;
        None where none was copied ahead (a pass-through, or no batch yet)."""
        return self.ready_when_requested / self.prefetched if self.prefetched else None


def map_tensors(obj: Any, fn: Any) -> Any:
    """Apply ``fn`` to every tensor in a nested batch, keeping its structure (mappings,
    sequences, namedtuples, sets, dataclass instances).

    A container is rebuilt as its own type where that type allows it: a mutable mapping or
    sequence (``defaultdict``, ``UserList``, ``deque``) as a shallow copy with its items
    replaced, so the extra state its constructor takes is kept; otherwise from its items, and
    where its constructor refuses them, as a plain ``dict`` or ``list`` (what PyTorch's
    ``pin_memory`` does). A dataclass instance is a shallow copy with its fields replaced,
    including fields not taken by ``__init__``, without running ``__post_init__`` again.

    Args:
        obj: the batch: a tensor, or containers of tensors and other values.
        fn: called on each tensor; returns its replacement.

    Returns:
        A batch of the same structure with each tensor replaced by ``fn(tensor)``; other values
        kept as they are.
    """
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, str | bytes | bytearray | memoryview):  # sequences of themselves
        return obj
    if isinstance(obj, Mapping):
        items = {k: map_tensors(v, fn) for k, v in obj.items()}
        try:
            if isinstance(obj, MutableMapping):
                clone = copy.copy(obj)
                clone.update(items)
                return clone
            return type(obj)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(v, fn) for v in obj))
    if type(obj) is list or type(obj) is tuple:  # the common case, first
        return type(obj)(map_tensors(v, fn) for v in obj)
    if isinstance(obj, Sequence | AbstractSet):
        mapped = [map_tensors(v, fn) for v in obj]
        try:
            if isinstance(obj, MutableSequence):
                seq = copy.copy(obj)
                seq.clear()
                seq.extend(mapped)
                return seq
            return type(obj)(mapped)  # type: ignore[call-arg]
        except TypeError:
            return mapped
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        instance = copy.copy(obj)
        for f in dataclasses.fields(obj):
            if hasattr(obj, f.name):  # (a field without a default not set yet)
                # object.__setattr__: a frozen dataclass refuses setattr
                object.__setattr__(instance, f.name, map_tensors(getattr(obj, f.name), fn))
        return instance
    return obj


class DevicePrefetcher(Generic[B]):
    """Iterate ``loader`` with each batch already on ``device``.

    Args:
        loader: any iterable of batches (a DataLoader with ``pin_memory=True`` is best; unpinned
            tensors are pinned here, which costs a host copy).
        device: target device, e.g. ``'cuda'``.
        mean: per-channel mean; with ``std``, uint8 tensors of 3+ dims whose ``channels_dim``
            holds ``len(mean)`` channels (any number where ``mean`` has one value, which
            applies to every channel) are converted to float and normalized as
            ``(x / 255 - mean) / std`` on the device. Other tensors are untouched: with a
            mean per RGB channel, a uint8 segmentation mask beside the images (N×H×W, or
            N×1×H×W) stays as it is (a mask of exactly three channels cannot be told apart).
        std: per-channel standard deviation (see ``mean``).
        channels_dim: dimension of the channels in image batches (1 for NCHW).

    Example:
        >>> loader = DataLoader(ds, batch_size=64, num_workers=4, pin_memory=True)
        >>> for x, y in DevicePrefetcher(loader, "cuda", mean=(0.485, 0.456, 0.406),
        ...                              std=(0.229, 0.224, 0.225)):
        ...     loss = model(x).loss(y)
    """

    def __init__(self, loader: Iterable[B], device: str | torch.device,
                 mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 channels_dim: int = 1) -> None:
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std (for uint8 → float normalization) or neither")
        if std is not None and any(s == 0 for s in std):
            raise ValueError(f"std must not contain 0, got {list(std)}")
        self.loader = loader
        self.device = torch.device(device)
        self.channels_dim = channels_dim
        self._mean = None if mean is None else torch.tensor(mean, dtype=torch.float32)
        self._std = None if std is None else torch.tensor(std, dtype=torch.float32)
        self._moments: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        """``mean`` and ``std`` on each device they were used on, copied there once: a copy
        from pageable host memory per batch would make the host wait for the side stream
        (the batch's own copy queued on it) before the batch is handed out."""
        self.stats = PrefetchStats()
        self._cuda = self.device.type == "cuda"
        if self._cuda and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        self._backend: Any = CudaBackend()

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    # -- transforms -----------------------------------------------------------------------
    def _normalize(self, t: torch.Tensor) -> torch.Tensor:
        if (self._mean is None or self._std is None or t.dtype != torch.uint8 or t.dim() < 3
                or t.dim() <= self.channels_dim
                or len(self._mean) not in (1, t.shape[self.channels_dim])):
            return t  # not an image batch of these channels (a mask, labels): as it came
        shape = [1] * t.dim()
        shape[self.channels_dim] = -1
        moments = self._moments.get(t.device)
        if moments is None:
            moments = self._moments[t.device] = (self._mean.to(t.device), self._std.to(t.device))
        mean, std = (m.view(shape) for m in moments)
        return (t.float().div_(255.0) - mean) / std

    # -- iteration ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[B]:
        if not self._cuda:
            yield from self._passthrough()
        else:
            yield from self._prefetch()

    def _passthrough(self) -> Iterator[B]:
        dev = self.device
        for batch in self.loader:
            self.stats.batches += 1
            out: B = map_tensors(batch, lambda t: self._normalize(t.to(dev)))
            yield out

    def _prefetch(self) -> Iterator[B]:
        cuda = self._backend
        stream = cuda.new_stream(self.device)
        it = iter(self.loader)
        nxt = self._issue(it, stream)
        pending: list[tuple[Any, Any]] = []
        while nxt is not None:
            batch, done, start = nxt
            self.stats.batches += 1
            self.stats.prefetched += 1
            if done.query():
                self.stats.ready_when_requested += 1
            cur = cuda.current_stream(self.device)
            cur.wait_stream(stream)  # the GPU waits for the copy; the host does not
            # The batch was allocated on the side stream: tell the caching allocator it is used
            # on the consumer's stream, or its memory could be reused while kernels still read it.
            map_tensors(batch, lambda t, s=cur: t.record_stream(s))
            failed: Exception | None = None
            try:
                following = self._issue(it, stream)  # overlap the next copy with this compute
            except Exception as e:  # the loader failed on the next batch: this one first
                failed, following = e, None
            pending.append((start, done))
            self._resolve(pending)
            yield batch
            if failed is not None:
                raise failed
            nxt = following
        self._resolve(pending)

    def _issue(self, it: Iterator[B], stream: Any) -> tuple[B, Any, Any] | None:
        try:
            host = next(it)
        except StopIteration:
            return None
        cuda = self._backend
        start, done = cuda.event(), cuda.event()
        dev = self.device
        consumer = cuda.current_stream(dev)  # (inside `on(stream)` the side one is current)
        waited = False

        def copy(t: torch.Tensor) -> torch.Tensor:
            nonlocal waited
            if t.device.type == "cpu":
                if not cuda.is_pinned(t):
                    t = cuda.pin(t)
                self.stats.bytes_copied += t.numel() * t.element_size()
            elif not waited:
                # Made on the device by the loader (a decode there), on the consumer's
                # stream: the side stream reads it only once that stream's work is done.
                stream.wait_stream(consumer)
                waited = True
            return self._normalize(t.to(dev, non_blocking=True))

        with cuda.on(stream):
            start.record(stream)
            batch: B = map_tensors(host, copy)
            done.record(stream)
        return batch, done, start

    def _resolve(self, pending: list[tuple[Any, Any]]) -> None:
        """Read the copy times of finished copies (query(), never synchronize())."""
        while pending and pending[0][1].query():
            start, done = pending.pop(0)
            self.stats.copy_s += start.elapsed_time(done) / 1e3
            self.stats.resolved += 1


class CudaBackend:
    """The CUDA calls the prefetcher makes, in one place (a test substitutes a recording
    stand-in to check their order without a GPU)."""

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device=device)

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def event(self) -> Any:
        return torch.cuda.Event(enable_timing=True)

    def on(self, stream: Any) -> Any:
        return torch.cuda.stream(stream)

    def is_pinned(self, t: torch.Tensor) -> bool:
        return bool(t.is_pinned())

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory()
