"""``CachedDataset``: keep the output of the deterministic part of a transform chain.

The user splits the chain: ``deterministic`` (decode, resize — the same every epoch) runs once
per sample and its output is stored; ``random`` (crop, flip — different every epoch) runs on
every access. Node-local store: LMDB on a local path (``/dev/shm`` by default), one copy per
node shared by every DataLoader worker and every rank (LMDB serialises writers with its own
lock; a reader never sees an uncommitted write, so a worker killed mid-write leaves nothing
half-written).

Keys carry a fingerprint of the dataset and of the deterministic transform (its code, its
constants and its ``repr``), so a changed pipeline reads different keys and never a stale
sample.

Eviction policy: fill once, then keep ("MinIO", CoorDL; data_pipeline_anchors.md §1). With a
fresh random order every epoch, any fixed subset of the dataset gives the same hit rate, while
LRU evicts exactly what the next epoch will ask for (Mosaic streaming #658). So when the store
reaches ``max_bytes``, new samples are passed through uncached and nothing is evicted.
A full disk behaves the same: one warning, then pass-through; training never stops for the
cache.
"""

from __future__ import annotations

import hashlib
import inspect
import multiprocessing as mp
import os
import pickle
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

DEFAULT_DIR = "/dev/shm/redline-cache" if os.path.isdir("/dev/shm") else "redline-cache"


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int
    misses: int
    bytes_read: int
    bytes_written: int
    uncached: int
    """Misses not stored because the store was full (or the disk was)."""

    @property
    def hit_rate(self) -> float | None:
        n = self.hits + self.misses
        return self.hits / n if n else None


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _stable_repr(obj: Any) -> str:
    """repr() without memory addresses: fingerprints must agree across processes and ranks."""
    return _ADDRESS.sub("", repr(obj))


def _code_fingerprint(fn: Any) -> str:
    """What makes a transform produce different output: its code, constants, defaults, repr."""
    h = hashlib.sha256()
    h.update(type(fn).__qualname__.encode())
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__call__
    code = getattr(target, "__code__", None)
    if code is not None:
        h.update(code.co_code)
        h.update(repr(code.co_consts).encode())
        h.update(repr(getattr(target, "__defaults__", None)).encode())
    if not inspect.isfunction(fn):
        h.update(_stable_repr(fn).encode())  # parameters of transform objects (sizes, modes)
    return h.hexdigest()[:16]


def _describe(v: Any) -> str:
    if v is None or isinstance(v, bool | int | float | str | bytes | os.PathLike):
        return repr(v)[:256]
    if isinstance(v, list | tuple):
        return f"{type(v).__name__}[{len(v)}]{_stable_repr(v[:3])[:256]}{_stable_repr(v[-3:])[:256]}"
    if isinstance(v, dict):
        return f"dict[{len(v)}]{_stable_repr(list(v)[:3])[:256]}"
    shape, dtype = getattr(v, "shape", None), getattr(v, "dtype", None)
    if shape is not None and dtype is not None:  # numpy array / tensor: shape, dtype, a sample
        flat = v.reshape(-1)
        n = int(flat.shape[0])
        sample = flat[:: max(1, n // 64)][:64]
        return f"{type(v).__name__}{tuple(shape)}{dtype}{_stable_repr(sample.tolist())}"
    return type(v).__qualname__


def dataset_fingerprint(dataset: Any) -> str:
    """Type, length, and the dataset's ``fingerprint`` attribute if it has one, else a stable
    description of its attributes (values of scalars, sizes and samples of containers)."""
    h = hashlib.sha256()
    h.update(type(dataset).__qualname__.encode())
    h.update(str(len(dataset)).encode())
    own = getattr(dataset, "fingerprint", None)
    if own is not None:
        h.update(str(own).encode())
    else:
        try:
            attrs = sorted(vars(dataset).items())
        except TypeError:
            attrs = []
        for k, v in attrs:
            h.update(f"{k}={_describe(v)};".encode())
    return h.hexdigest()[:16]


_ENVS: dict[tuple[int, str], Any] = {}
"""Open LMDB environments of this process by path: LMDB allows one per path per process, and
several datasets (train/val, or re-created ones) may share a store. Handles only, like a
connection pool; keyed by pid so a forked worker opens its own."""


def _environment(path: Path, max_bytes: int) -> Any:
    import lmdb

    key = (os.getpid(), str(path.resolve()))
    env = _ENVS.get(key)
    if env is None:
        path.mkdir(parents=True, exist_ok=True)
        # sync off: a cache needs integrity (LMDB keeps it: a killed writer's transaction never
        # becomes visible), not durability across power loss; an fsync per sample would cost
        # more than the decode it saves. The first opener's max_bytes sets the map size.
        env = lmdb.open(str(path), map_size=max_bytes, subdir=True, readahead=False,
                        max_readers=512, lock=True, sync=False, metasync=False)
        _ENVS[key] = env
    return env


_TENSOR = b"T1"
_PICKLE = b"P1"


def encode(value: Any) -> bytes:
    """Tensors as a small header + their raw bytes (loads without pickle's per-object work);
    anything else pickled."""
    if isinstance(value, torch.Tensor) and value.layout == torch.strided and not value.is_cuda:
        t = value.detach().contiguous()
        header = f"{str(t.dtype)[6:]}|{','.join(map(str, t.shape))}".encode()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return _TENSOR + len(header).to_bytes(2, "little") + header + data
    return _PICKLE + pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


_HEADERS: dict[bytes, tuple[torch.dtype, list[int]]] = {}
"""Parsed tensor headers (dtype, shape): a dataset's samples share a few shapes."""


def decode(blob: bytes) -> Any:
    if blob[:2] == _TENSOR:
        n = int.from_bytes(blob[2:4], "little")
        header = blob[4:4 + n]
        parsed = _HEADERS.get(header)
        if parsed is None:
            dtype_name, shape_s = header.decode().split("|")
            parsed = (getattr(torch, dtype_name),
                      [int(x) for x in shape_s.split(",")] if shape_s else [])
            if len(_HEADERS) < 4096:
                _HEADERS[header] = parsed
        dtype, shape = parsed
        raw = bytearray(blob[4 + n:])  # a writable copy: tensors must own their memory
        if not raw:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(raw, dtype=dtype).view(shape)
    return pickle.loads(blob[2:])


class CachedDataset(Dataset[Any]):
    """Wrap ``dataset`` so ``deterministic(dataset[i])`` is computed once and stored.

    Args:
        dataset: any map-style dataset.
        deterministic: the transform whose output is cached (must not be random).
        random: the transform applied on every access, after the cache (may be None).
        path: LMDB directory; node-local (``/dev/shm`` or a local disk), shared by all
            workers and ranks on the node.
        max_bytes: store size bound (LMDB map size); when full, nothing is evicted (see the
            module docstring) and further samples pass through uncached.
        fingerprint: override the automatic dataset+transform fingerprint (e.g. a version
            string) when the automatic one cannot see what changed.
    """

    def __init__(self, dataset: Any, deterministic: Callable[[Any], Any],
                 random: Callable[[Any], Any] | None = None, *,
                 path: str | os.PathLike[str] = DEFAULT_DIR, max_bytes: int = 8 * 2**30,
                 fingerprint: str | None = None) -> None:
        if max_bytes < 2**20:
            raise ValueError(f"max_bytes must be at least 1 MiB, got {max_bytes}")
        self.dataset = dataset
        self.deterministic = deterministic
        self.random = random
        self.path = Path(path)
        self.max_bytes = int(max_bytes)
        self.fingerprint = fingerprint or (
            f"{dataset_fingerprint(dataset)}-{_code_fingerprint(deterministic)}")
        self._prefix = self.fingerprint.encode() + b":"
        # Shared across forked/spawned DataLoader workers: hits, misses, read, written, uncached
        self._counters = mp.Array("q", 5)
        self._env: Any = None
        self._pid = -1
        self._rtxn: Any = None
        self._rtxn_pid = -1
        self._writable = True
        self._warned = False

    def __len__(self) -> int:
        return len(self.dataset)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # LMDB handles never cross a process boundary
        state["_env"], state["_pid"], state["_rtxn"], state["_rtxn_pid"] = None, -1, None, -1
        return state

    # -- store ----------------------------------------------------------------------------
    def _open(self) -> Any:
        if self._env is None or self._pid != os.getpid():
            self._env = _environment(self.path, self.max_bytes)
            self._pid = os.getpid()
        return self._env

    def _reader(self, env: Any) -> Any:
        """This process's read transaction, kept open between reads (a snapshot; renewed when a
        key is missing). Fill-once never frees pages, so a long reader costs no growth."""
        if self._rtxn is None or self._rtxn_pid != os.getpid():
            self._rtxn = env.begin(buffers=False)
            self._rtxn_pid = os.getpid()
        return self._rtxn

    def _count(self, k: int, k2: int = -1, n2: int = 0) -> None:
        """Add 1 to counter k (and n2 to counter k2) under one lock acquisition."""
        c = self._counters
        with c.get_lock():
            raw: Any = c.get_obj()  # the plain ctypes array: items do not take the lock again
            raw[k] += 1
            if k2 >= 0:
                raw[k2] += n2

    def _stop_writing(self, why: str) -> None:
        self._writable = False
        if not self._warned:
            self._warned = True
            warnings.warn(f"redline cache at {self.path}: {why}; samples now pass through "
                          "uncached (training goes on)", RuntimeWarning, stacklevel=3)

    def _get_det(self, i: int) -> Any:
        key = self._prefix + str(i).encode()
        env = self._open()
        txn = self._reader(env)
        blob = txn.get(key)
        if blob is None:  # maybe stored since this reader's snapshot: look again, fresh
            txn.abort()
            self._rtxn = txn = env.begin(buffers=False)
            blob = txn.get(key)
        if blob is not None:
            self._count(0, 2, len(blob))
            return decode(blob)
        self._count(1)
        value = self.deterministic(self.dataset[i])
        if self._writable:
            self._put(env, key, value)
        else:
            self._count(4)
        return value

    def _put(self, env: Any, key: bytes, value: Any) -> None:
        import lmdb

        blob = encode(value)
        try:
            with env.begin(write=True) as txn:
                txn.put(key, blob, overwrite=False)  # another worker may have stored it first
            with self._counters.get_lock():
                counters: Any = self._counters.get_obj()
                counters[3] += len(blob)
        except lmdb.MapFullError:
            self._count(4)
            self._stop_writing(f"reached max_bytes={self.max_bytes:,} (fill-once policy: "
                               "nothing is evicted)")
        except (lmdb.DiskError, lmdb.Error, OSError) as e:
            self._count(4)
            self._stop_writing(f"write failed ({type(e).__name__}: {e}), e.g. the disk is full")

    def __getitem__(self, i: int) -> Any:
        value = self._get_det(int(i))
        return self.random(value) if self.random is not None else value

    def stats(self) -> CacheStats:
        """Counters summed over this process and its DataLoader workers."""
        with self._counters.get_lock():
            c = [int(x) for x in self._counters[:]]
        return CacheStats(*c)
