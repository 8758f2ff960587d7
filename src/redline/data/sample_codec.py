"""How a cached sample is stored: tensors and numpy arrays as raw buffers, everything else
pickled.

Pickling a tensor goes through ``torch.save``'s storage format: for a float image in a
``(image, label)`` pair it is most of a cache fill's cost and, unpickled, most of a hit's. So a
tensor alone is stored as a small header (dtype, shape) and its bytes (``T1``), a numpy array
likewise (``A1``), and a structure holding tensors or arrays (tuples, lists, dicts, nested) is
pickled with each of them replaced by a reference to a raw segment after the pickle (``S2``).
Anything else is pickled (``P1``).

Encoding makes one copy of each tensor's bytes, into the one buffer that is stored (joined
once, never grown): the caller's tensor may be changed in place right after (a random
transform's ``add_``), while the write happens later, when the cache's batch is full. A tensor
that is dense in another order than C's (channels-last, a transpose: what ``permute`` then an
elementwise op returns, as an image decoded HWC and made CHW does) is stored in its memory
order with that order in the header, so encoding copies its bytes as they lie rather than
gathering them into C order first, and the decoded tensor has the strides the uncached one
had. Decoding makes one copy too (tensors own their memory; the blob may be a view into
LMDB's map).
:data:`FORMAT_VERSION` is part of every key, so a store written in another format is never
read as this one.
"""

from __future__ import annotations

import ctypes
import io
import pickle
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 5
"""Bumped whenever the stored form changes (keys carry it). 3: numpy arrays raw (``A1``),
segments of either kind in structures (``S2``), sizes checked on reading. 4: tensors in their
memory order (a third header field where it is not C order). 5: a tensor subclass (a
Parameter, torchvision's ``tv_tensors``), a tensor requiring grad and a quantized tensor are
pickled, as inside a structure (4 stored them raw, as plain tensors without their type, flag
or quantizer)."""

_TENSOR = b"T1"
_ARRAY = b"A1"
_STRUCT = b"S2"
_PICKLE = b"P1"

_RAW_KINDS = frozenset("biufc")
"""numpy dtype kinds stored raw: bool, integers, floats, complex (their ``dtype.str``, with its
byte order, says all there is; object, string and structured arrays are pickled)."""


def _tensor_header(t: torch.Tensor, order: list[int] | None) -> str:
    shape = ",".join(map(str, t.shape))
    if order is None:
        return f"{str(t.dtype)[6:]}|{shape}"
    return f"{str(t.dtype)[6:]}|{shape}|{','.join(map(str, order))}"


def _array_header(a: np.ndarray[Any, Any]) -> str:
    return f"{a.dtype.str}|{','.join(map(str, a.shape))}"


def _plain_tensor(v: Any) -> bool:
    """A tensor whose bytes, dtype and shape are all there is to it (not a Parameter or
    another subclass, not on a GPU, not requiring grad, not quantized)."""
    return (type(v) is torch.Tensor and v.layout == torch.strided and v.device.type == "cpu"
            and not v.requires_grad and not v.is_quantized)


def _plain_array(v: Any) -> bool:
    """A numpy array of numbers (not a subclass such as a masked array or a matrix)."""
    return type(v) is np.ndarray and v.dtype.kind in _RAW_KINDS and not v.dtype.fields


_ORDERS: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int] | None] = {}
"""Memory orders by (shape, strides) seen: a dataset's samples share a few layouts."""


def _memory_order(t: torch.Tensor) -> list[int] | None:
    """The dimensions from outermost to innermost in memory where ``t`` is a permutation of a
    C-contiguous tensor (channels-last, a transpose); None where it is not one."""
    layout = (tuple(t.shape), t.stride())
    if layout in _ORDERS:
        return _ORDERS[layout]
    strides = layout[1]
    outer_first = sorted(range(t.dim()), key=lambda d: (-strides[d], d))
    order = outer_first if t.permute(outer_first).is_contiguous() else None
    if len(_ORDERS) < 4096:
        _ORDERS[layout] = order
    return order


def _tensor_bytes(t: torch.Tensor) -> tuple[memoryview, list[int] | None]:
    """The tensor's values as bytes in its memory order where it is dense in one (a view, no
    copy), else gathered in C order; with the order where it is not C's."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    order = None
    if not t.is_contiguous():
        order = _memory_order(t)
        t = t.contiguous() if order is None else t.permute(order)
    if not t.numel():
        return memoryview(b""), order
    return t.reshape(-1).view(torch.uint8).numpy().data, order


def _array_bytes(a: np.ndarray[Any, Any]) -> memoryview:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).data


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.segments: list[memoryview] = []
        self.offset = 0

    def persistent_id(self, obj: Any) -> Any:
        if _plain_tensor(obj):
            header, _, raw = _tensor_parts(obj)
            kind = "t"
        elif _plain_array(obj):
            kind, header, raw = "a", _array_header(obj), _array_bytes(obj)
        else:
            return None
        ref = (kind, header, self.offset, raw.nbytes)
        self.segments.append(raw)
        self.offset += raw.nbytes
        return ref


def _prefix(tag: bytes, header: str) -> bytes:
    h = header.encode()
    return b"".join((tag, len(h).to_bytes(2, "little"), h))


def _single(tag: bytes, header: str, raw: memoryview) -> bytes:
    return b"".join((_prefix(tag, header), raw))  # the one copy of the data


_Layout = tuple[str, bytes, type[ctypes.Array[ctypes.c_char]] | None, int, bool] | None

LAYOUTS: dict[tuple[torch.dtype, torch.Size, tuple[int, ...]], _Layout] = {}
"""Tensor layouts seen (dtype, shape, strides): for one dense in some order, its header, its
stored form's first bytes, a ctypes array type as long as its values' bytes (None where it
has none), that length, and whether the dtype is complex (only a complex tensor can carry the
conjugate bit, so only there is it read); None for one that takes the general path. Read by
:mod:`redline.data.cache_ring` too. A dataset's samples share a few layouts,
and a fill epoch encodes every sample right after the user's own transform, with the CPU's
caches cold: there a tensor's ``numpy()`` view alone cost ~3.5 us a 10 kB sample, so a known
layout is found from the tensor's own dtype, shape and strides and its bytes are read from its
data pointer, one copy into the stored form (``benchmarks/cache.py``)."""

LAYOUTS_MAX = 4096
"""Layouts :data:`LAYOUTS` keeps at most (a dataset of more shapes learns the others' layouts
sample by sample, each time)."""

_UNSEEN: Any = object()


def _layout(t: torch.Tensor) -> _Layout:
    if t.is_quantized:  # its numbers are its bytes with a scale and zero point: pickled
        return None
    order = None if t.is_contiguous() else _memory_order(t)
    if order is None and not t.is_contiguous():
        return None  # not dense (a slice with gaps): gathered by the general path
    try:
        a = t.detach().numpy()
    except (TypeError, RuntimeError):  # bfloat16 & co. have no numpy twin: the general path
        return None
    if not (a if order is None else a.transpose(order)).flags.c_contiguous:
        return None
    header = _tensor_header(t, order)
    return (header, _prefix(_TENSOR, header), (ctypes.c_char * a.nbytes) if a.nbytes else None,
            a.nbytes, t.is_complex())


def fast_parts(t: torch.Tensor) -> tuple[str, bytes, memoryview] | None:
    """(header, first bytes of the stored form, the values' bytes as a view of the tensor's
    memory) of a tensor of exactly ``torch.Tensor``'s type in a known dense layout; None where
    the general path is needed: a tensor on another device (its data pointer is not host
    memory), one with its negative or conjugate bit set (its memory holds other numbers than
    it reads as), one requiring grad or quantized (pickled: the raw form would drop the flag,
    or the scale and zero point), a sparse, nested or MKL-DNN one (no strides), bfloat16 and
    the other dtypes without a numpy twin, a tensor without storage."""
    try:
        if not t.is_cpu or t.requires_grad or t.is_neg():
            return None
        key = (t.dtype, t.shape, t.stride())
        ptr = t.data_ptr()
    except RuntimeError:
        return None
    layout = LAYOUTS.get(key, _UNSEEN)
    if layout is _UNSEEN:
        if not ptr or t.is_conj():  # no storage, no values, or not its own numbers: nothing
            return None             # to learn a layout from
        layout = _layout(t)
        if len(LAYOUTS) < LAYOUTS_MAX:
            LAYOUTS[key] = layout
    if layout is None:
        return None
    header, first, values, _, complex_ = layout
    if complex_ and t.is_conj():
        return None
    if values is None:
        return header, first, memoryview(b"")
    if not ptr:
        return None
    # Dense with positive strides: its values are the `values`-long span from its data
    # pointer, in its memory order. The view lives no longer than the tensor: it is copied
    # into the stored form before encode() returns.
    return header, first, memoryview(values.from_address(ptr))


def _tensor_parts(t: torch.Tensor) -> tuple[str, bytes, memoryview]:
    """(header, first bytes of the stored form, the values' bytes) of a CPU tensor, through
    the known layout where there is one."""
    parts = fast_parts(t) if type(t) is torch.Tensor else None
    return parts if parts is not None else _general_parts(t)


def _general_parts(t: torch.Tensor) -> tuple[str, bytes, memoryview]:
    """:func:`_tensor_parts` without the known layouts: its values gathered in memory order."""
    raw, order = _tensor_bytes(t)
    header = _tensor_header(t, order)
    return header, _prefix(_TENSOR, header), raw


def encode_parts(value: Any) -> tuple[bytes, bytes | memoryview]:
    """The stored form of ``value`` as (its first bytes, the rest): for a tensor in a known
    dense layout (a fill epoch's common case) the rest is a view of the tensor's own memory,
    valid while the tensor is and not changed in place: copy it at once (a writer copies it
    straight into its buffer, the one copy of the data). Otherwise the first bytes are empty
    and the rest is :func:`encode`'s."""
    if type(value) is torch.Tensor:  # the known layout, before any other attribute read
        parts = fast_parts(value)
        if parts is not None:
            return parts[1], parts[2]
    return b"", encode(value)


def encode(value: Any) -> bytes:
    """The stored form of ``value`` (see the module docstring). Never pickles a plain CPU
    tensor or a numeric numpy array."""
    exact = type(value) is torch.Tensor
    if exact:  # a fill epoch's common case: the known layout, before any other attribute read
        parts = fast_parts(value)
        if parts is not None:
            return b"".join((parts[1], parts[2]))  # the one copy of the data
    if _plain_tensor(value):
        # the known layout was tried above where it can apply: not a second time
        _, first, raw = _general_parts(value)
        return b"".join((first, raw))
    if _plain_array(value):
        return _single(_ARRAY, _array_header(value), _array_bytes(value))
    if isinstance(value, tuple | list | dict):
        f = io.BytesIO()
        p = _Pickler(f)
        p.dump(value)
        if p.segments:
            body = f.getbuffer()
            return b"".join((_STRUCT, body.nbytes.to_bytes(8, "little"), body, *p.segments))
    return _PICKLE + pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


_HEADERS: dict[str, tuple[torch.dtype, Any, list[int], int, list[int] | None]] = {}
"""Parsed tensor headers (torch dtype, numpy dtype or None, shape as stored, bytes, the
permutation back to the tensor's dimensions or None): a dataset's samples share a few."""


def _parse(header: str) -> tuple[torch.dtype, Any, list[int], int, list[int] | None]:
    parsed = _HEADERS.get(header)
    if parsed is None:
        dtype_name, shape_s, *order_s = header.split("|")
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"a stored tensor names {dtype_name!r}, not a torch dtype")
        try:
            np_dtype: Any = torch.empty(0, dtype=dtype).numpy().dtype
        except TypeError:  # bfloat16 & co. have no numpy twin
            np_dtype = None
        shape = [int(x) for x in shape_s.split(",")] if shape_s else []
        size = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
        back = None
        if order_s:
            order = [int(x) for x in order_s[0].split(",")]
            if len(order_s) > 1 or sorted(order) != list(range(len(shape))):
                raise ValueError(f"a stored tensor's header {header!r} has no valid order")
            shape = [shape[d] for d in order]
            back = sorted(range(len(order)), key=order.__getitem__)
        parsed = (dtype, np_dtype, shape, size, back)
        if len(_HEADERS) < 4096:
            _HEADERS[header] = parsed
    return parsed


def _check_size(what: str, header: str, size: int, got: int) -> None:
    """A value whose bytes are not all there (a store that kept part of a write) is refused,
    so it is computed again rather than read as other numbers."""
    if got != size:
        raise ValueError(f"a stored {what} ({header}) has {got:,} bytes, not {size:,}")


def _tensor(header: str, raw: memoryview) -> torch.Tensor:
    dtype, np_dtype, shape, size, back = _parse(header)
    _check_size("tensor", header, size, raw.nbytes)
    if not size:
        t = torch.empty(shape, dtype=dtype)
    else:
        owned = bytearray(raw)  # the one copy: the tensor owns its memory
        if np_dtype is not None:  # numpy's reshape is cheaper than a tensor view here
            t = torch.from_numpy(np.frombuffer(owned, dtype=np_dtype).reshape(shape))
        else:
            t = torch.frombuffer(owned, dtype=dtype).view(shape)
    return t if back is None else t.permute(back)


def _array(header: str, raw: memoryview) -> np.ndarray[Any, Any]:
    dtype_s, shape_s = header.rsplit("|", 1)
    dtype = np.dtype(dtype_s)
    if dtype.kind not in _RAW_KINDS:
        raise ValueError(f"a stored array names dtype {dtype_s!r}, which is never stored raw")
    shape = [int(x) for x in shape_s.split(",")] if shape_s else []
    _check_size("array", header, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize,
                raw.nbytes)
    return np.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)  # the one copy


class _Unpickler(pickle.Unpickler):
    def __init__(self, body: memoryview, data: memoryview) -> None:
        super().__init__(io.BytesIO(body))
        self.data = data

    def persistent_load(self, pid: Any) -> Any:
        kind, header, offset, n = pid
        raw = self.data[offset:offset + n]
        if kind == "t":
            return _tensor(header, raw)
        if kind == "a":
            return _array(header, raw)
        raise ValueError(f"a stored structure refers to a segment of kind {kind!r}")


def _single_parts(m: memoryview) -> tuple[str, memoryview]:
    n = int.from_bytes(m[2:4], "little")
    return bytes(m[4:4 + n]).decode(), m[4 + n:]


def decode(blob: bytes | memoryview) -> Any:
    """Inverse of :func:`encode`; ``blob`` may be a view into a memory map (copied once)."""
    m = memoryview(blob).cast("B") if isinstance(blob, memoryview) else memoryview(blob)
    tag = bytes(m[:2])
    if tag == _TENSOR:
        return _tensor(*_single_parts(m))
    if tag == _ARRAY:
        return _array(*_single_parts(m))
    if tag == _STRUCT:
        n = int.from_bytes(m[2:10], "little")
        return _Unpickler(m[10:10 + n], m[10 + n:]).load()
    if tag == _PICKLE:
        return pickle.loads(m[2:])
    raise ValueError(f"a stored sample starts with {tag!r}, not one of the tags this version "
                     "writes")
