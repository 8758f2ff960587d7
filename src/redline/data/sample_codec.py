"""How a cached sample is stored: tensors as raw buffers, everything else pickled.

Pickling a tensor goes through ``torch.save``'s storage format: for a float image in a
``(image, label)`` pair it is most of a cache fill's cost and, unpickled, most of a hit's. So a
tensor alone is stored as a small header (dtype, shape) and its bytes (``T1``), and a structure
holding tensors (tuples, lists, dicts) is pickled with each CPU tensor replaced by a reference
to a raw segment after the pickle (``S1``). Anything else is pickled (``P1``). Decoding makes
one copy of each tensor's bytes (tensors own their memory; the blob may be a view into LMDB's
map). :data:`FORMAT_VERSION` is part of every key, so a store written in another format is
never read as this one.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 2
"""Bumped whenever the stored form changes (keys carry it)."""

_TENSOR = b"T1"
_STRUCT = b"S1"
_PICKLE = b"P1"


def _header(t: torch.Tensor) -> str:
    return f"{str(t.dtype)[6:]}|{','.join(map(str, t.shape))}"


def _plain_tensor(v: Any) -> bool:
    """A tensor whose bytes, dtype and shape are all there is to it (not a Parameter or
    another subclass, not on a GPU, not requiring grad)."""
    return (type(v) is torch.Tensor and v.layout == torch.strided and v.device.type == "cpu"
            and not v.requires_grad and not v.is_quantized)


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.segments: list[torch.Tensor] = []
        self.offset = 0

    def persistent_id(self, obj: Any) -> Any:
        if not _plain_tensor(obj):
            return None
        t = obj.resolve_conj().resolve_neg().contiguous()
        n = t.numel() * t.element_size()
        ref = (_header(t), self.offset, n)
        self.segments.append(t)
        self.offset += n
        return ref


def encode(value: Any) -> bytes:
    """The stored form of ``value`` (see the module docstring)."""
    if isinstance(value, torch.Tensor) and value.layout == torch.strided and not value.is_cuda:
        t = value.detach().contiguous()
        header = _header(t).encode()
        out = bytearray(_TENSOR + len(header).to_bytes(2, "little") + header)
        if t.numel():
            out += t.reshape(-1).view(torch.uint8).numpy().data  # the one copy of the data
        return bytes(out)
    if isinstance(value, tuple | list | dict):
        f = io.BytesIO()
        p = _Pickler(f)
        p.dump(value)
        if p.segments:
            body = f.getvalue()
            out = bytearray(_STRUCT + len(body).to_bytes(8, "little") + body)
            for t in p.segments:
                if t.numel():
                    out += t.reshape(-1).view(torch.uint8).numpy().data
            return bytes(out)
    return _PICKLE + pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


_HEADERS: dict[str, tuple[torch.dtype, Any, list[int]]] = {}
"""Parsed tensor headers (torch dtype, numpy dtype or None, shape): a dataset's samples share a
few shapes."""


def _parse(header: str) -> tuple[torch.dtype, Any, list[int]]:
    parsed = _HEADERS.get(header)
    if parsed is None:
        dtype_name, shape_s = header.split("|")
        dtype = getattr(torch, dtype_name)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"a stored tensor names {dtype_name!r}, not a torch dtype")
        try:
            np_dtype: Any = torch.empty(0, dtype=dtype).numpy().dtype
        except TypeError:  # bfloat16 & co. have no numpy twin
            np_dtype = None
        parsed = (dtype, np_dtype, [int(x) for x in shape_s.split(",")] if shape_s else [])
        if len(_HEADERS) < 4096:
            _HEADERS[header] = parsed
    return parsed


def _tensor(header: str, raw: bytearray) -> torch.Tensor:
    dtype, np_dtype, shape = _parse(header)
    if not raw:
        return torch.empty(shape, dtype=dtype)
    if np_dtype is not None:  # numpy's reshape is cheaper than a tensor view here
        return torch.from_numpy(np.frombuffer(raw, dtype=np_dtype).reshape(shape))
    return torch.frombuffer(raw, dtype=dtype).view(shape)


class _Unpickler(pickle.Unpickler):
    def __init__(self, body: memoryview, data: memoryview) -> None:
        super().__init__(io.BytesIO(body))
        self.data = data

    def persistent_load(self, pid: Any) -> Any:
        header, offset, n = pid
        return _tensor(header, bytearray(self.data[offset:offset + n]))  # the one copy


def decode(blob: bytes | memoryview) -> Any:
    """Inverse of :func:`encode`; ``blob`` may be a view into a memory map (copied once)."""
    tag = bytes(blob[:2])
    if tag == _TENSOR:
        n = int.from_bytes(blob[2:4], "little")
        header = bytes(blob[4:4 + n]).decode()
        return _tensor(header, bytearray(memoryview(blob)[4 + n:]))
    if tag == _STRUCT:
        m = memoryview(blob)
        n = int.from_bytes(m[2:10], "little")
        return _Unpickler(m[10:10 + n], m[10 + n:]).load()
    if tag == _PICKLE:
        return pickle.loads(blob[2:])
    raise ValueError(f"a stored sample starts with {tag!r}, not one of the tags this version "
                     "writes")
