"""Where CachedDataset keeps samples: LMDB on the node (default) or Redis across nodes.

A store maps bytes keys to bytes values, never evicts, and reports a full store by raising
:class:`StoreFull`. A store that cannot be reached answers "not there" (the sample is then
recomputed) and says so once.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import os
import shutil
import threading
import time
import warnings
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from redline.core.errors import RedlineError
from redline.data import lmdb_env, store_place


class StoreFull(RedlineError):
    """The store reached its size bound (or the disk/memory behind it is full)."""

    def __init__(self, message: str, *, stored: int = 0, written: int = 0) -> None:
        super().__init__(message)
        self.stored = stored
        """Items of the call stored before it was full."""
        self.written = written
        """Bytes of the call written before it was full."""


class Store(Protocol):
    def get(self, key: bytes) -> bytes | memoryview | None: ...
    def get_many(self, keys: list[bytes]) -> list[bytes | memoryview | None]: ...
    def put_many(self, items: list[tuple[bytes, bytes]]) -> int:
        """Store the items not stored yet; returns bytes written. Raises StoreFull."""
        ...


_ENVS: dict[tuple[int, str], tuple[weakref.ref[Any], tuple[int, int] | None]] = {}
"""Open LMDB environments of this process by path, with the (device, inode) of the data file
each opened: py-lmdb allows one environment per file per process, and several datasets
(train/val, or re-created ones) may share a store. Keyed by pid so a forked worker opens its
own. Held weakly: an environment lives while a store uses it, so a store folder removed
while this process runs (a notebook clearing its cache) leaves memory once its datasets are
gone, and a folder made anew at the same path is a new file, opened anew (not the removed
one's handle, which would serve the removed samples)."""

_ENVS_LOCK = threading.Lock()
"""Held while a store finds or opens its environment: two threads opening one path at once
would both open it, and LMDB refuses the second ("already open in this process")."""

SNAPSHOT_S = 0.5
"""How long a read snapshot answers a miss without being renewed, where this process has
not written the key missed since it began. A miss of a fill epoch (every read misses, and a
DataLoader worker writes each batch it computes) then costs one lookup, not a new transaction;
a sample another worker or rank stored within that time is computed again (and its write
skipped: nothing is overwritten)."""

_GENERATION = [0]
"""Bumped each time the pool is closed before a fork: stores then reopen their environment."""


def _close_before_fork() -> None:
    """Close this process's environments before it forks (a DataLoader starting its workers).

    A forked child inherits the parent's open environment, and py-lmdb then refuses to open
    the same path again in the child ("already open in this process"); using the inherited one
    is undefined (``lmdb.h``: "use an MDB_env in only one process"; py-lmdb issue #346: a
    child freeing an inherited transaction removes the parent's reader). Closed here, every
    store reopens lazily on its next read, in the parent and in each child. Only redline's own
    environments are touched. The pool's lock is held across the fork (released after it in
    both processes): a thread opening a store finishes first, and the child never inherits
    the lock held by a thread it does not have.
    """
    _ENVS_LOCK.acquire()
    mine = [k for k in _ENVS if k[0] == os.getpid()]
    if not mine:
        return
    for k in mine:
        env = _ENVS.pop(k)[0]()
        if env is not None:
            with contextlib.suppress(Exception):  # a failing close must not stop the fork
                env.close()
    _GENERATION[0] += 1


def _outermost_missing(folder: Path) -> Path | None:
    """The outermost folder that ``folder.mkdir(parents=True)`` would make; None where
    ``folder`` exists."""
    missing = None
    while not folder.exists() and folder != folder.parent:
        missing, folder = folder, folder.parent
    return missing


def _data_file(folder: Path) -> tuple[int, int] | None:
    """(device, inode) of the LMDB data file in ``folder``; None where there is none."""
    try:
        st = os.stat(folder / "data.mdb")
    except OSError:
        return None
    return st.st_dev, st.st_ino


PID = [os.getpid()]
"""This process's id, renewed in a forked child: ``os.getpid`` is a system call each time
(glibc no longer caches it), and a fill epoch asks for it several times a sample (the fill's
check reads ``PID[0]`` itself: :func:`process_id` is a call more)."""


def process_id() -> int:
    """``os.getpid()`` without the system call (see :data:`PID`)."""
    return PID[0]


def _after_fork_in_child() -> None:
    PID[0] = os.getpid()
    _ENVS_LOCK.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_close_before_fork, after_in_parent=_ENVS_LOCK.release,
                        after_in_child=_after_fork_in_child)


class LmdbStore:
    """Node-local store: LMDB at ``path`` (``/dev/shm`` or a local disk), shared by every
    DataLoader worker and rank on the node. LMDB serialises writers with its own lock, and a
    transaction that was not committed (a worker killed mid-write) is never visible.

    Its size is bounded by ``max_bytes`` and by :data:`~redline.data.store_place.SAFE_FRACTION`
    of what its filesystem has free (:func:`~redline.data.store_place.budget`, read once, here):
    it never fills ``/dev/shm`` under the DataLoader workers. An ``ephemeral`` store (one redline
    makes in memory) is removed by the last process that uses it
    (:mod:`redline.data.store_place`).

    A path this process cannot write to is opened read-only (a store filled earlier is read,
    nothing is written); a path that cannot be opened at all acts as an empty store that
    refuses writes. Either is said once, by the dataset, and training goes on."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int, *, ephemeral: bool = False,
                 free: store_place.FreeBytes | None = None) -> None:
        # Loaded here, in the process that makes the dataset, though it opens the store only
        # on its first read: forked DataLoader workers then inherit the module, where each
        # would otherwise load it anew at every epoch (a C extension, ~0.5 ms, on the
        # workers' start-up path).
        import lmdb  # noqa: F401
        self.path = Path(path)
        if ephemeral or store_place.is_ephemeral(self.path):
            # Held from here, by the process that makes the dataset: it stays while this
            # process lives even if only its DataLoader workers read (a leftover is emptied).
            store_place.lease(self.path)
        self.requested_bytes = int(max_bytes)
        """``max_bytes`` as asked for."""
        self.max_bytes = store_place.budget(self.path, max_bytes, free)
        """The map size: ``max_bytes`` or the filesystem's safe share, whichever is smaller."""
        self.ephemeral = ephemeral
        self._env: Any = None
        self._txn: Any = None
        self._txn_began = 0.0
        """``time.monotonic()`` when the read snapshot began."""
        self._own_since: set[bytes] | None = set()
        """Keys this process wrote to this store (its writer thread's included) since the read
        snapshot began, which the snapshot does not hold; None where it wrote some it cannot
        name (its writer process's): every miss is then looked up again in a new snapshot."""
        self._pid = -1
        self._gen = -1
        self.read_only_reason: str | None = None
        """Why nothing can be written here, once that is known (None: writable so far)."""

    @property
    def capped_note(self) -> str | None:
        """A sentence where the free space, not ``max_bytes``, bounds the store (not where it
        leaves too little to open one: the first read says why it cannot be used)."""
        if self.max_bytes >= self.requested_bytes or self.max_bytes < 2**20:
            return None
        return (f"{self.path} holds at most {self.max_bytes / 2**20:,.1f} MiB "
                f"({store_place.SAFE_FRACTION:.0%} of what its filesystem has free), not "
                f"max_bytes={self.requested_bytes / 2**20:,.0f} MiB; past it, samples pass "
                "through uncached")

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()  # handles stay in-process
        state.update(_env=None, _txn=None, _pid=-1, _gen=-1, read_only_reason=None)
        return state

    def _open(self) -> Any:
        """The environment, opened on first use in this process (None when it cannot be)."""
        if self._pid == PID[0] and self._gen == _GENERATION[0]:
            return self._env
        import lmdb

        key = (os.getpid(), str(self.path.resolve()))
        with _ENVS_LOCK:
            ref, opened = _ENVS.get(key, (None, None))
            env = ref() if ref is not None else None
            if env is None or _data_file(self.path) != opened:
                # None, or the file it opened was removed or replaced: its users keep it
                env = self._open_env(lmdb)
                if env is not None:
                    _ENVS[key] = (weakref.ref(env), _data_file(self.path))
        self._env, self._txn, self._pid, self._gen = env, None, os.getpid(), _GENERATION[0]
        return env

    def _open_env(self, lmdb: Any) -> Any:
        if self.ephemeral or store_place.is_ephemeral(self.path):
            store_place.lease(self.path)  # removed by its last user; a dead run's emptied
        made = _outermost_missing(self.path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            why = f"{self.path} cannot be made ({type(e).__name__}: {e})"
        else:
            if self.max_bytes < 2**20:
                why = (f"{self.path} has too little free space "
                       f"({store_place.free_bytes(str(self.path)) / 2**20:,.1f} MiB)")
                if made is not None:  # made just now, empty: not left behind
                    shutil.rmtree(made, ignore_errors=True)
            else:
                try:
                    return lmdb_env.open_writable(str(self.path), self.max_bytes)
                except (lmdb.Error, OSError) as e:
                    why = f"{self.path} is not writable ({type(e).__name__}: {e})"
        if not (self.path / "data.mdb").is_file():
            self.read_only_reason = f"{why}, and holds no store to read"
            return None
        try:
            # Without the lock file: nobody can write to a path nobody may write to, so
            # readers need no coordination (LMDB's MDB_NOLOCK).
            env = lmdb.open(str(self.path), subdir=True, readonly=True, lock=False,
                            readahead=False)
        except (lmdb.Error, OSError) as e:
            self.read_only_reason = f"{why}; reading it failed too ({type(e).__name__}: {e})"
            return None
        self.read_only_reason = f"{why}: the samples stored there are read, none is added"
        return env

    def close(self) -> None:
        """Close this process's handle on the store (it reopens on the next read)."""
        key = (os.getpid(), str(self.path.resolve()))
        with _ENVS_LOCK:
            pooled = _ENVS.pop(key, None)
        envs = [pooled[0]() if pooled is not None else None]
        if self._pid == PID[0] and self._env is not envs[0]:
            envs.append(self._env)  # the handle on a folder since removed or replaced
        for env in envs:
            if env is not None:
                with contextlib.suppress(Exception):
                    env.close()
        self._env, self._txn, self._pid = None, None, -1

    def get(self, key: bytes) -> bytes | memoryview | None:
        """One key: the per-sample path of a DataLoader, kept short. The value may be a
        memoryview into the map, valid until this store's next call: decode it at once."""
        txn = (self._txn if self._pid == PID[0] and self._gen == _GENERATION[0]
               and self._txn is not None else None)
        if txn is None:
            return self.get_many([key])[0]
        v: memoryview | None = txn.get(key)
        if v is not None or self._snapshot_fresh((key,)):
            return v
        return self.get_many([key])[0]

    def last_txn_without(self, prefix: bytes) -> int | None:
        """The id of the store's last write transaction, where the store holds no key that
        starts with ``prefix`` (a dataset's keys) as of it; None where it holds one, or where
        this process cannot write to it. Takes a new snapshot."""
        import lmdb

        env = self._open()
        if env is None or self.read_only_reason is not None:
            return None
        try:
            txn = self._renew(env)
            with txn.cursor() as cur:
                if cur.set_range(prefix) and bytes(cur.key()).startswith(prefix):
                    return None
            return int(txn.id())
        except lmdb.Error:  # unknown: every sample is looked up
            return None

    def note_written(self) -> None:
        """Another process wrote for this one (the cache's writer process), keys unknown
        here: the next miss takes a new snapshot."""
        self._own_since = None

    def _snapshot_fresh(self, missed: Iterable[bytes]) -> bool:
        """Whether the current snapshot's misses of ``missed`` can be believed: none of them
        was written by this process since it began (a DataLoader worker that wrote its last
        batch misses its next batch's samples, not the last one's), and it is younger than
        :data:`SNAPSHOT_S`."""
        own = self._own_since
        return (own is not None and time.monotonic() - self._txn_began < SNAPSHOT_S
                and (not own or own.isdisjoint(missed)))

    def _renew(self, env: Any) -> Any:
        if self._txn is not None:
            self._txn.abort()
        self._own_since, self._txn_began = set(), time.monotonic()
        self._txn = lmdb_env.begin(env, buffers=True)
        return self._txn

    def get_many(self, keys: list[bytes]) -> list[bytes | memoryview | None]:
        env = self._open()
        if env is None:
            return [None] * len(keys)
        # One read transaction kept between reads (a snapshot, renewed on a miss that it may
        # not know of): fill-once never frees pages, so a long reader costs no growth. Values
        # come back as views into the map (no copy); the decoder makes the one copy a tensor
        # needs.
        txn = self._txn if self._txn is not None else self._renew(env)
        out: list[bytes | memoryview | None] = [txn.get(k) for k in keys]
        if None in out and not self._snapshot_fresh(
                k for k, v in zip(keys, out, strict=True) if v is None):  # maybe stored since
            out = [None if v is None else bytes(v) for v in out]  # views die with the snapshot
            txn = self._renew(env)
            out = [v if v is not None else txn.get(k) for k, v in zip(keys, out, strict=True)]
        return out

    def put_many(self, items: list[tuple[bytes, bytes]]) -> int:
        env = self._open()
        if self.read_only_reason is not None:
            raise StoreFull(self.read_only_reason)
        stored, written, why = lmdb_env.put_items(env, items, self.max_bytes)
        own = self._own_since
        if own is not None:
            own.update(k for k, _ in items[:stored])
        if why is not None:
            raise StoreFull(why, stored=stored, written=written)
        return written


class RedisStore:
    """Samples partitioned over several Redis servers, for caches that outgrow one node.

    Partitioning is client-side consistent hashing (64 points per server on a SHA-1 ring)
    rather than Redis Cluster: it works with plain, independent ``redis-server`` processes (no
    cluster mode, no 3-master minimum), and adding or losing a server moves only ~1/N of the
    keys. Reads of a batch are pipelined: one round trip per server per batch (MGET). Values
    are written with SET NX (first writer wins, nothing is overwritten or evicted; give the
    servers ``maxmemory`` with ``maxmemory-policy noeviction``). A server that stops answering
    is dropped for the rest of the run: its samples are recomputed, logged once.

    Args:
        urls: ``redis://host:port/db`` of each server.
        timeout_s: socket timeout; a server slower than this counts as gone.
    """

    POINTS = 64

    def __init__(self, urls: list[str], timeout_s: float = 2.0) -> None:
        if not urls:
            raise ValueError("RedisStore needs at least one server URL (redis://host:port)")
        self.urls = list(urls)
        self.timeout_s = timeout_s
        ring = sorted((int(hashlib.sha1(f"{u}#{p}".encode()).hexdigest()[:16], 16), n)
                      for n, u in enumerate(self.urls) for p in range(self.POINTS))
        self._ring_keys = [h for h, _ in ring]
        self._ring_nodes = [n for _, n in ring]
        self._clients: dict[int, Any] = {}
        self._pid = -1
        self._dead: set[int] = set()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_clients"], state["_pid"] = {}, -1  # sockets never cross a process boundary
        return state

    def node(self, key: bytes) -> int:
        """Index of the server holding ``key``."""
        h = int(hashlib.sha1(key).hexdigest()[:16], 16)
        i = bisect.bisect(self._ring_keys, h) % len(self._ring_keys)
        return self._ring_nodes[i]

    def _client(self, n: int) -> Any:
        if self._pid != os.getpid():
            self._clients, self._pid = {}, os.getpid()
        c = self._clients.get(n)
        if c is None:
            import redis

            c = self._clients[n] = redis.Redis.from_url(
                self.urls[n], socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s)
        return c

    def _lost(self, n: int, err: Exception) -> None:
        if n not in self._dead:
            self._dead.add(n)
            warnings.warn(f"redline cache: Redis server {self.urls[n]} is unreachable "
                          f"({type(err).__name__}: {err}); its samples are recomputed from now "
                          "on (training goes on)", RuntimeWarning, stacklevel=4)

    def _by_node(self, keys: list[bytes]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for i, k in enumerate(keys):
            groups.setdefault(self.node(k), []).append(i)
        return groups

    def get(self, key: bytes) -> bytes | memoryview | None:
        return self.get_many([key])[0]

    def get_many(self, keys: list[bytes]) -> list[bytes | memoryview | None]:
        import redis

        out: list[bytes | memoryview | None] = [None] * len(keys)
        for n, idx in self._by_node(keys).items():
            if n in self._dead:
                continue
            try:
                vals = self._client(n).mget([keys[i] for i in idx])
            except redis.RedisError as e:
                self._lost(n, e)
                continue
            for i, v in zip(idx, vals, strict=True):
                out[i] = v
        return out

    def put_many(self, items: list[tuple[bytes, bytes]]) -> int:
        import redis

        written = 0
        for n, idx in self._by_node([k for k, _ in items]).items():
            if n in self._dead:
                continue
            try:
                pipe = self._client(n).pipeline(transaction=False)
                for i in idx:
                    pipe.set(items[i][0], items[i][1], nx=True)
                for i, ok in zip(idx, pipe.execute(), strict=True):
                    if ok:
                        written += len(items[i][1])
            except redis.ResponseError as e:
                if "OOM" in str(e) or "maxmemory" in str(e):
                    raise StoreFull(f"Redis {self.urls[n]} is full: {e}") from e
                self._lost(n, e)
            except redis.RedisError as e:
                self._lost(n, e)
        return written
