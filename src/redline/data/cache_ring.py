"""The training side of the cache's ring (:mod:`redline.data.cache_proc`): where records go,
and the fill's per-sample hand-over of a tensor, compiled where it could be built.

A fill epoch hands every sample over right after the user's own transform, with the CPU's
caches cold: there each interpreted operation costs several times its warm cost, and the
interpreter's work also slows the user's next transform (its code and data evicted). So the
common case, a plain CPU tensor in a dense layout (:data:`.sample_codec.LAYOUTS`, learnt at its
first tensor) with room in the ring's window, is one call: :meth:`PyRing.put`, or the same in C
(``redline/data/_ring.c``, built at install where a C compiler is there: ``COMPILED``).
Everything else (a value of another kind, a tensor the raw form does not take, a record that
wraps or finds no room) is not taken, and the caller encodes and submits it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

import torch

from redline.data.cache_child import RECORD, record_bytes
from redline.data.sample_codec import LAYOUTS, LAYOUTS_MAX, fast_parts

_U32 = 2**32 - 1


def write_record(mem: Any, at: int, key: bytes, head: bytes, body: Any) -> None:
    """Write the record of ``key`` with the value ``head + body`` at byte ``at`` of ``mem``
    (the map: through it, not a view of it, any contiguous buffer is taken as ``body``, a
    tensor's bytes as ctypes' chars, without a cast). Its header, key and the value's first
    bytes in one copy, its bulk in another."""
    h1 = at + RECORD.size + len(key) + len(head)
    mem[at:h1] = b"".join((RECORD.pack(len(key), len(head) + len(body)), key, head))
    mem[h1:h1 + len(body)] = body


class Ring(Protocol):
    """What :class:`~.cache_proc.ProcessWriter` keeps of its ring's positions (absolute: the
    offset is the position modulo :attr:`ring_bytes`) and the hand-over it calls."""

    end: int
    """Where the next record goes (positions are never negative: the compiled ring's are
    unsigned)."""
    consumed: int
    """Where the writer process had written up to, when last read."""
    sent: int
    """The end last published to the writer process."""
    unsettled: list[bytes]
    """The keys of the records put since they were last settled (see ``ProcessWriter``)."""

    @property
    def ring_bytes(self) -> int: ...

    @property
    def window(self) -> int: ...

    def hold(self, mem: Any) -> None:
        """Write through ``mem`` (the writer's map: a writable buffer) until :meth:`release`."""
        ...

    def release(self) -> None:
        """Let go of the map (before it is closed); :meth:`put` takes nothing until held."""
        ...

    def put(self, key: bytes, value: Any) -> int:
        """Copy ``value``'s stored form into the ring under ``key`` where it is a plain CPU
        tensor in a known layout and its record fits the window: 1, or 2 where the ring's
        end is due to be published (:data:`~.cache_child.WRITE_BATCH` records, or
        ``send_bytes``, since); 0 where it is not taken (the caller encodes and submits
        it)."""
        ...


class PyRing:
    """:class:`Ring` in Python (where the C one could not be built), and its reference."""

    __slots__ = (
        "_batch",
        "_header",
        "_mem",
        "_send_bytes",
        "consumed",
        "end",
        "ring_bytes",
        "sent",
        "unsettled",
        "window",
    )

    def __init__(self, ring_bytes: int, window: int, header_bytes: int, send_bytes: int,
                 write_batch: int, layouts: dict[Any, Any], layouts_max: int,
                 tensor_type: type, learn: Callable[[Any], Any]) -> None:
        if not 0 < window <= ring_bytes or header_bytes < 0:
            raise ValueError("Ring: sizes must be positive, window <= ring_bytes")
        if (layouts is not LAYOUTS or layouts_max != LAYOUTS_MAX or tensor_type is not torch.Tensor
                or learn is not fast_parts):
            raise ValueError("PyRing reads sample_codec's layouts, through its fast_parts")
        self.end = self.consumed = self.sent = 0
        self.unsettled: list[bytes] = []
        self.ring_bytes, self.window = ring_bytes, window
        self._header, self._send_bytes, self._batch = header_bytes, send_bytes, write_batch
        self._mem: Any = None

    def hold(self, mem: Any) -> None:
        if self._mem is not None:
            raise RuntimeError("Ring.hold: a map is held already")
        if len(mem) < self._header + self.ring_bytes:
            raise ValueError(f"Ring.hold: the map holds {len(mem)} bytes, not "
                             f"{self._header + self.ring_bytes}")
        self._mem = mem

    def release(self) -> None:
        self._mem = None

    def put(self, key: bytes, value: Any) -> int:
        if self._mem is None or type(value) is not torch.Tensor:
            return 0
        try:
            parts = fast_parts(value)
        except Exception:  # (as the compiled ring: the caller's encode meets it and decides)
            return 0
        mem = self._mem  # read after the tensor's methods, which may run Python (a torch
        if parts is None or mem is None:  # function mode) that released it
            return 0
        _, head, body = parts
        n = len(head) + len(body)
        need = record_bytes(len(key), n)
        end = self.end
        at = end % self.ring_bytes
        if (n > _U32 or at + need > self.window
                or end + need - self.consumed > self.ring_bytes):
            return 0
        write_record(mem, self._header + at, key, head, body)
        self.unsettled.append(key)
        self.end = end = end + need
        return 2 if len(self.unsettled) >= self._batch or end - self.sent >= self._send_bytes else 1


_ring: Any
try:  # (by name: the compiled module has no stub; Ring above is its type)
    _ring = importlib.import_module("redline.data._ring")
except ImportError:  # built without a C compiler: the same in Python
    _ring = None

COMPILED = _ring is not None
"""Whether the compiled :class:`Ring` is used (``redline/data/_ring.c``, built at install)."""


def new_ring(ring_bytes: int, window: int, header_bytes: int, send_bytes: int,
             write_batch: int, *, compiled: bool | None = None) -> Ring:
    """A ring's training side (``compiled``: the C one where built, by default)."""
    use_c = COMPILED if compiled is None else compiled
    if use_c and _ring is None:
        raise RuntimeError("redline.data._ring was not built (no C compiler at install)")
    cls: Any = _ring.Ring if use_c else PyRing
    ring: Ring = cls(ring_bytes=ring_bytes, window=window, header_bytes=header_bytes,
                     send_bytes=send_bytes, write_batch=write_batch, layouts=LAYOUTS,
                     layouts_max=LAYOUTS_MAX, tensor_type=torch.Tensor, learn=fast_parts)
    return ring
