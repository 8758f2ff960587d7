"""``CachedDataset``: keep the output of the deterministic part of a transform chain.

The user splits the chain: ``deterministic`` (decode, resize — the same every epoch) runs once
per sample and its output is stored; ``random`` (crop, flip — different every epoch) runs on
every access. Node-local store: LMDB on a local path (``/dev/shm`` by default where it has room,
else a folder on disk, and never more than half of its filesystem's free space:
:mod:`redline.data.store_place`), one copy per node shared by every DataLoader worker and
every rank (LMDB serialises writers with its own lock; a reader never sees an uncommitted
write, so a worker killed mid-write leaves nothing half-written).

Keys carry a fingerprint of the dataset and of the deterministic transform (its code and
what it depends on: :mod:`redline.data.fingerprint`), so a changed pipeline reads different
keys and never a stale sample.

Eviction policy: fill once, then keep ("MinIO", CoorDL: Mohan et al., VLDB 2021). With a
fresh random order every epoch, any fixed subset of the dataset gives the same hit rate, while
LRU evicts exactly what the next epoch will ask for (Mosaic streaming #658). So when the store
reaches ``max_bytes``, new samples are passed through uncached and nothing is evicted.
A full disk behaves the same: one warning, then pass-through; training never stops for the
cache.

Writes are batched: a computed sample is encoded on the caller's side (tensors and arrays as
raw bytes, :mod:`redline.data.sample_codec`) and written a batch at a time; in the training
process by a writer process of its own, fed through a ring in shared memory
(:mod:`redline.data.cache_proc`; a writer thread where that process cannot run,
:mod:`redline.data.cache_writer`), in a DataLoader worker by the worker itself (where that
measured cheaper); until written, samples are read back from memory (``benchmarks/cache.py``;
the README's cache section has its numbers).

A dataset may be read from several threads at once, and any thread may fork beside them
(:mod:`redline.data.cache_locks`).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import multiprocessing.context as mpc
import multiprocessing.util as mp_util
import operator
import os
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset, get_worker_info

from redline.data import cache_proc, cache_ring, store_place
from redline.data.cache_counts import CacheStats, Tally, publish_counts
from redline.data.cache_locks import hold_before_fork, lock_for, release_after_fork
from redline.data.cache_writer import WRITE_BATCH, StoreWriter, Writer
from redline.data.fingerprint import dataset_fingerprint, transform_fingerprint
from redline.data.sample_codec import FORMAT_VERSION, decode, encode_parts
from redline.data.stores import PID, LmdbStore, Store, process_id

FLUSH_EVERY = 64
"""Cache events counted per process before the shared counters are updated."""

OWN_KEYS_MAX = 2**27
"""Samples of a dataset at most for which the training process keeps one bit each (16 MiB)
saying whether it handed the sample to its writer process (see ``_own_keys``)."""

__all__ = ["DEFAULT_DIR", "FLUSH_EVERY", "WRITE_BATCH", "CacheStats", "CachedDataset"]

DEFAULT_DIR = os.path.join(store_place.SHM_DIR, store_place.DEFAULT_NAME)
"""The default store's folder where /dev/shm has room (:func:`store_place.default_placement`
chooses, at each CachedDataset made without ``store``)."""

_WITH_WRITER: weakref.WeakSet[CachedDataset] = weakref.WeakSet()
"""Datasets of this process with a background writer."""


def _write_before_fork() -> None:
    """Write what this process computed and has not written before it forks (a DataLoader
    starting its workers): the workers then read those samples instead of computing them
    again, and no writer thread is inside a transaction when the stores close their handles
    (this hook runs before theirs: hooks run in reverse order of registration).

    The children may write to the stores too (DataLoader workers do), so from here on this
    process looks up every sample it reads: its writer process would learn of their writes
    only at its next transaction, and until then the samples they stored would be computed
    again (``_own_keys``)."""
    for ds in list(_WITH_WRITER):
        with contextlib.suppress(Exception):
            ds._drain()
        ds._own_keys = ds._fill = None


_SAID: set[str] = set()

_UNREADABLE = object()
"""What _decode returns for a stored sample that cannot be read back."""

_MISSING = object()
"""What a lookup returns for a sample to compute."""


def _say_once(message: str) -> None:
    """Warn once per process per sentence (a train and a val dataset share one store)."""
    if message not in _SAID:
        _SAID.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


class CachedDataset(Dataset[Any]):
    """Wrap ``dataset`` so ``deterministic(dataset[i])`` is computed once and stored.

    Args:
        dataset: a map-style dataset indexed by integers (any index a sampler gives: an
            int, a numpy integer or a one-element integer tensor).
        deterministic: the transform whose output is cached (must not be random).
        random: the transform applied on every access, after the cache (may be None).
        store: a folder for the node-local LMDB store, or a
            :class:`~redline.data.stores.RedisStore` to share samples across nodes. Default:
            ``/dev/shm/redline-cache`` where half of /dev/shm's free space holds 256 MiB (or
            ``max_bytes``), removed when the last process using it exits; else
            ``~/.cache/redline/redline-cache``, on disk, kept (said once). See
            :mod:`redline.data.store_place`.
        max_bytes: size bound of the LMDB store (its map size); when full, nothing is
            evicted (see the module docstring) and further samples pass through uncached.
        fingerprint: override the automatic dataset+transform fingerprint (e.g. a version
            string) when the automatic one cannot see what changed.
    """

    def __init__(self, dataset: Any, deterministic: Callable[[Any], Any],
                 random: Callable[[Any], Any] | None = None, *,
                 store: str | os.PathLike[str] | Store | None = None,
                 max_bytes: int = 8 * 2**30, fingerprint: str | None = None,
                 path: str | os.PathLike[str] | None = None) -> None:
        if max_bytes < 2**20:
            raise ValueError(f"max_bytes must be at least 1 MiB, got {max_bytes}")
        self.dataset = dataset
        self.deterministic = deterministic
        self.random = random
        if path is not None:  # the folder of the LMDB store, under its older name
            store = path
        if store is None:
            place = store_place.default_placement(max_bytes)
            if place.note is not None:
                _say_once(f"redline cache: {place.note}")
            store = LmdbStore(place.path, max_bytes, ephemeral=place.ephemeral)
        elif isinstance(store, str | os.PathLike):
            store = LmdbStore(store, max_bytes)
        self.store: Store = store
        capped = getattr(store, "capped_note", None)
        if capped is not None:
            _say_once(f"redline cache: {capped}")
        self.path = getattr(self.store, "path", None)
        self.max_bytes = int(max_bytes)
        if fingerprint is None:
            data, unseen_data = dataset_fingerprint(dataset)
            code, unseen = transform_fingerprint(deterministic)
            fingerprint = f"{data}-{code}"
            unseen = unseen_data + unseen
            if unseen:
                warnings.warn(
                    "redline cache: the fingerprint of the dataset and its deterministic "
                    f"transform cannot see {'; '.join(unseen[:5])}"
                    f"{' …' if len(unseen) > 5 else ''}. If any of them changes, the cache "
                    "would serve samples made before: pass CachedDataset(..., "
                    "fingerprint='…'), a string that changes with them.",
                    RuntimeWarning, stacklevel=2)
        self.fingerprint = fingerprint
        # The stored form's version too: a store written in another format is never misread.
        self._prefix = f"{self.fingerprint}:v{FORMAT_VERSION}:".encode()
        self._tally = Tally(mp.Array("q", 5))
        """This process's counts and writer, and the counters shared with the DataLoader
        workers (:class:`~redline.data.cache_counts.Tally`)."""
        self._lock = lock_for(self.store, self)
        """Held around every use of the store and the writer from this dataset; not around
        the user's transforms, which threads run side by side."""
        self._spawnable = False
        """Whether the counters were moved to a spawn-context array (see __getstate__)."""
        self._writable = True
        self._warned = False
        self._said: set[str] = set()
        self._own_keys: bytearray | None = None
        """Bit i set: sample i was handed to this process's writer. Kept where that writer is
        a writer process that started on a store holding none of this dataset's keys, until
        this process forks (its children may write: ``_write_before_fork``): while nobody
        else writes to the store (:meth:`~.cache_proc.ProcessWriter.only_own`), a sample
        whose bit is clear is not stored, and a fill epoch's reads skip the lookup
        (``benchmarks/cache.py --compare-lookups``; the README's cache section)."""
        self._fill: tuple[int, cache_proc.ProcessWriter, bytearray, int, list[int],
                          cache_ring.Ring] | None = None
        """(process id, its writer process, ``_own_keys``, their bits, the local counters, the
        writer's ring) while a fill's miss may skip what :meth:`_keep` checks each sample (this
        process's writer is a writer process with ``_own_keys`` kept, writing is on, the
        counters are this process's): made at the first such miss, dropped wherever one of
        them changes."""

    def __len__(self) -> int:
        return len(self.dataset)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for spawned workers (their counts add to this process's), or copied
        # (copy.deepcopy, a pickle kept or sent elsewhere: the copy counts its own reads, from
        # zero); either way what this process computed goes to the store first.
        with self._lock:
            self._drain()
            spawning = mpc.get_spawning_popen() is not None
            if spawning and not self._spawnable:
                # A fork-context lock refuses to cross into a spawned process ("A SemLock
                # created in a fork context…"): move the counters to a spawn-context array,
                # once. Not made so from the start: a spawn-context lock starts
                # multiprocessing's resource tracker, a child process that runs with forked
                # workers needing none.
                self._flush()
                moved = mp.get_context("spawn").Array("q", 5)
                with self._tally.counters.get_lock():
                    moved[:] = self._tally.counters[:]
                self._tally.counters, self._spawnable = moved, True
            state = self.__dict__.copy()
        # The counters, shared with a spawned worker only (multiprocessing refuses to pickle
        # them otherwise); the writer stays here.
        state["_tally"] = Tally(self._tally.counters if spawning else None)
        state["_own_keys"] = state["_fill"] = None  # this process's writer's, not the new one's
        state["_lock"] = None  # a process's own (made anew in __setstate__)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._tally.counters is None:  # a copy: counters of its own
            self._tally = Tally(mp.Array("q", 5))
            self._spawnable = False
        self._lock = lock_for(self.store, self)

    def flush(self) -> None:
        """Wait until the samples this process computed are written (they are written
        WRITE_BATCH at a time, by the training process's writer process or thread and by the
        worker in a DataLoader worker, before a fork, and at exit), and publish its
        counters."""
        with self._lock:
            self._drain()
            self._flush()

    def _writer_here(self) -> Writer | None:
        """This process's writer, if it made one (a forked worker's copy is its parent's)."""
        t = self._tally
        return t.writer if t.writer_pid == process_id() else None

    def _drain(self) -> None:
        w = self._writer_here()
        if w is not None:
            w.drain()
            self._check_writer(w)

    def _check_writer(self, w: Writer) -> None:
        """Say once, from this thread, why the writer stopped (if it did). Where the training
        process's writer process ended on its own (killed, out of memory), a writer thread
        goes on writing; the samples the process held unwritten are counted as not stored
        (they are computed again when next read)."""
        if w.failure is None or not self._writable:
            return
        if isinstance(w, cache_proc.ProcessWriter) and w.process_ended:
            written, lost = w.take_counts()
            self._add(written=written, uncached=lost, publish=False)
            w.close()
            self._own_keys = self._fill = None
            self._tally.writer = thread = StoreWriter(self.store)
            mp_util.Finalize(self, thread.close, exitpriority=11)
            self._say("writer", f"{w.failure}; a writer thread writes from now on")
            return
        self._stop_writing(w.failure)

    def _add(self, hits: int = 0, misses: int = 0, read: int = 0, written: int = 0,
             uncached: int = 0, publish: bool = True) -> None:
        """Count locally; publish to the shared counters every FLUSH_EVERY events (a lock per
        sample costs as much as the read it counts) and when the process exits."""
        t = self._tally
        local = t.local
        if local is None or t.local_pid != process_id():
            local = t.local = [0, 0, 0, 0, 0, 0]
            t.local_pid = process_id()
            # DataLoader workers end through multiprocessing's exit path, which runs these.
            # Given the tally, not the dataset (see Tally).
            mp_util.Finalize(self, publish_counts, args=(t,), exitpriority=10)
        local[0] += hits
        local[1] += misses
        local[2] += read
        local[3] += written
        local[4] += uncached
        local[5] += 1
        if publish and (local[5] >= FLUSH_EVERY or uncached):
            self._flush()

    def _flush(self) -> None:
        publish_counts(self._tally)

    def _stop_writing(self, why: str) -> None:
        self._writable = False
        self._fill = None
        if not self._warned:
            self._warned = True
            where = self.path or type(self.store).__name__
            warnings.warn(f"redline cache at {where}: {why}; samples now pass through "
                          "uncached (training goes on)", RuntimeWarning, stacklevel=4)

    def _deterministic_many(self, indices: list[int]) -> list[Any]:
        """A batch: looked up in one store round trip, its misses computed (outside the
        lock, as in :meth:`get_deterministic`) and handed over together."""
        indices = [i if i >= 0 else self._position(i) for i in indices]
        keys = [self._prefix + str(i).encode() for i in indices]
        out: list[Any] = [None] * len(indices)
        todo: list[tuple[int, bool]] = []
        """(position, whether to store it) of each sample to compute."""
        read = hits = 0
        with self._lock:
            # Computed here, not written yet: read your own writes. Looked up before the
            # store: a sample leaves `pending` once written (a writer thread's without this
            # lock), so one gone from there by now is in the store.
            w = self._writer_here()
            pending = w.pending if w is not None else {}
            blobs: list[bytes | memoryview | None] = [pending.get(k) for k in keys]
            if None in blobs:
                unknown = [k for k, b in zip(keys, blobs, strict=True) if b is None]
                stored = iter(self.store.get_many(unknown))
                blobs = [next(stored) if b is None else b for b in blobs]
            for j, (i, blob) in enumerate(zip(indices, blobs, strict=True)):
                if blob is not None:
                    value = self._decode(blob, i)
                    if value is not _UNREADABLE:
                        hits += 1
                        read += len(blob)
                        out[j] = value
                        continue
                todo.append((j, blob is None))  # one that cannot be read back stays as it is
        for j, _ in todo:
            out[j] = self.deterministic(self.dataset[indices[j]])
        with self._lock:
            puts: list[tuple[bytes, bytes, bytes | memoryview]] = []
            put_indices: list[int] = []
            put_keys: set[bytes] = set()
            again = 0
            """Samples the batch holds twice (a sampler with replacement; ``-1`` and
            ``len - 1``): computed each time, as without the cache, and handed over once (a
            key handed over twice would read as another writer's to the writer process)."""
            if self._writable:
                for j, unstored in todo:
                    if keys[j] in put_keys:
                        again += 1
                        continue
                    encoded = self._encode(out[j], indices[j]) if unstored else None
                    if encoded is not None:
                        puts.append((keys[j], *encoded))
                        put_indices.append(indices[j])
                        put_keys.add(keys[j])
            misses = len(indices) - hits
            self._add(hits=hits, misses=misses, read=read,
                      uncached=misses - len(puts) - again)
            self._store(puts)
            for i in put_indices:
                self._mark_own(i)
            if get_worker_info() is not None:
                # A DataLoader worker's batch is written and counted before the worker hands
                # it over: a worker kept between epochs (persistent_workers) holds no samples
                # back, which the others would compute again, and stats() is current after
                # each epoch. (Batches of fewer samples than a transaction holds add commits,
                # a small cost beside the samples' decode.)
                w = self._writer_here()
                if w is not None:
                    w.drain()
                self._flush()
        return out

    def _store(self, puts: list[tuple[bytes, bytes, bytes | memoryview]]) -> None:
        """Queue computed samples for writing, unless the store cannot take them."""
        if not puts:
            return
        why = getattr(self.store, "read_only_reason", None)
        if why is not None:  # known on the first read: say so now, not at the write
            self._add(uncached=len(puts))
            self._stop_writing(why)
        else:
            self._queue(puts)

    def _queue(self, puts: list[tuple[bytes, bytes, bytes | memoryview]]) -> None:
        """Hand computed samples to this process's writer (made on first use: a forked worker
        makes its own, the parent's thread is not in it)."""
        w = self._writer_here()
        if w is None:
            w = self._tally.writer = _new_writer(self.store)
            self._tally.writer_pid = process_id()
            _WITH_WRITER.add(self)
            # DataLoader workers end through multiprocessing's exit path, which runs these
            # (before the counters' publication, priority 10). The writer's own close, not the
            # dataset's: a dataset that is dropped ends its writer process then.
            mp_util.Finalize(self, w.close, exitpriority=11)
            self._own_keys = self._only_own_from_here(w)
        for k, head, body in puts:
            w.submit(k, head, body)
        self._check_writer(w)

    def _only_own_from_here(self, w: Writer) -> bytearray | None:
        """The bits of ``_own_keys``, all clear, where ``w`` is a writer process on a store
        that holds none of this dataset's keys (told to it); None where the skip cannot be
        (another writer, another store, a dataset without a length or past OWN_KEYS_MAX)."""
        if not isinstance(w, cache_proc.ProcessWriter) or not isinstance(self.store, LmdbStore):
            return None
        try:
            n = len(self.dataset)
        except Exception:  # no length (or not one to trust): no bits to keep
            return None
        last = self.store.last_txn_without(self._prefix) if n <= OWN_KEYS_MAX else None
        if last is None:
            return None
        w.expect_only_own(last)
        return bytearray((n + 7) // 8)

    def get_deterministic(self, i: int) -> Any:
        """Item ``i`` after the deterministic part only: read from the store, or computed and
        stored (what filling the cache ahead of a run calls for every item). Safe from several
        threads at once (a thread-pool loader): the lookup and the hand-over hold the
        store's lock (:mod:`.cache_locks`), the transform runs outside it."""
        if i < 0:
            i = self._position(i)
        key = self._prefix + str(i).encode()
        fill = self._fill
        if fill is not None:
            # A fill epoch's read, right after the user's transform (the CPU's caches cold):
            # _keep's path with what it checks each sample checked once (see _fill), a dozen
            # operations fewer a sample (``benchmarks/cache.py --compare-fill-path``). This
            # check takes no lock: it reads no store, and two threads that both find sample i
            # not handed over both compute it, while the hand-over below, under the lock,
            # hands it over once.
            pid, writer, bits_of, n_bits, _, _ = fill
            if not (pid == PID[0] and 0 <= i < n_bits and not bits_of[i >> 3] >> (i & 7) & 1
                    and writer.only_own()):  # never handed over, nobody else writes
                fill = None
        if fill is None:
            with self._lock:
                found = self._look_up(i, key)
            if found is not _MISSING:
                return found
        value = self.deterministic(self.dataset[i])
        with self._lock:
            if fill is None or fill is not self._fill:
                return self._keep(i, key, self._writer_here(), value)
            _, writer, bits_of, _, local, ring = fill
            if not bits_of[i >> 3] >> (i & 7) & 1:  # else another thread handed it over
                # A plain tensor in a dense layout, in one call (compiled where it was built:
                # cache_ring; ``benchmarks/cache.py --compare-hand-over``).
                put = ring.put(key, value)
                if put == 2:
                    writer.publish()
                elif not put:
                    try:
                        head, body = encode_parts(value)
                    except Exception:
                        self._fill = None
                        return self._keep(i, key, writer, value)  # says why, once
                    writer.submit(key, head, body)
                bits_of[i >> 3] |= 1 << (i & 7)
            local[1] += 1
            local[5] += 1
            if local[5] >= FLUSH_EVERY:
                self._flush()
            if writer.failure is not None:
                self._fill = None
                self._check_writer(writer)
            return value

    def _position(self, i: int) -> int:
        """A negative index as the position it stands for (``len + i``, as a list reads it),
        so that ``ds[-1]`` and ``ds[len(ds) - 1]`` are one stored sample; as it is where the
        dataset has no length or the index is past its start (the dataset says so)."""
        try:
            n = len(self.dataset)
        except Exception:
            return i
        return i + n if -n <= i < 0 else i

    def _look_up(self, i: int, key: bytes) -> Any:
        """Sample ``i`` from this process's pending writes or the store (counted as a hit),
        or _MISSING: not stored (a sample that cannot be read back included)."""
        t = self._tally
        w = t.writer if t.writer_pid == process_id() else None  # _writer_here()
        blob: bytes | memoryview | None = None
        if w is not None:
            own = self._own_keys
            if (own is not None and 0 <= i < len(own) * 8 and not own[i >> 3] >> (i & 7) & 1
                    and w.only_own()):
                return _MISSING  # never handed over, nobody else writes
            blob = w.pending.get(key)
        if blob is None:
            blob = self.store.get(key)
        if blob is None:
            return _MISSING
        value = self._decode(blob, i)  # under the lock: a view into the store's snapshot
        if value is _UNREADABLE:
            return _MISSING  # computed again (its stored form is kept: nothing is overwritten)
        self._add(hits=1, read=len(blob))
        return value

    def _keep(self, i: int, key: bytes, w: Writer | None, value: Any) -> Any:
        """``value``, sample ``i`` just computed: queued for writing, counted. Every read of a
        fill epoch takes this path where :meth:`get_deterministic`'s shorter one does not
        apply, so once this process has its writer and counters it makes a handful of
        calls."""
        t = self._tally
        local = t.local
        if (w is None or local is None or t.local_pid != t.writer_pid
                or not self._writable
                or getattr(self.store, "read_only_reason", None) is not None):
            encoded = self._encode(value, i) if self._writable else None
            puts = [] if encoded is None else [(key, *encoded)]
            self._add(misses=1, uncached=1 - len(puts))
            self._store(puts)
            if puts:
                self._mark_own(i)
            return value
        try:  # what _encode does, on the fill's path
            encoded = encode_parts(value)
        except Exception:
            encoded = self._encode(value, i)  # says why, once
        local[1] += 1  # what _add(misses=1) counts
        local[5] += 1
        if encoded is None:
            local[4] += 1
            self._flush()
            return value
        w.submit(key, *encoded)
        own = self._own_keys
        if own is not None and 0 <= i < len(own) * 8:
            own[i >> 3] |= 1 << (i & 7)  # what _mark_own does, on the fill's path
            if self._fill is None and w.failure is None:
                self._start_fill(w, own, local)
        if local[5] >= FLUSH_EVERY:
            self._flush()
        if w.failure is not None:
            self._check_writer(w)
        return value

    def _start_fill(self, w: Writer, own: bytearray, local: list[int]) -> None:
        """From the next miss on, take :meth:`get_deterministic`'s short path (see
        ``_fill``) with ``w``, ``own`` and ``local``, now known to hold."""
        if isinstance(w, cache_proc.ProcessWriter):
            self._fill = (self._tally.writer_pid, w, own, len(own) * 8, local, w.ring)

    def _mark_own(self, i: int) -> None:
        """Sample ``i`` was handed to this process's writer (see ``_own_keys``)."""
        own = self._own_keys
        if own is not None and 0 <= i < len(own) * 8:
            own[i >> 3] |= 1 << (i & 7)

    def _encode(self, value: Any, i: int) -> tuple[bytes, bytes | memoryview] | None:
        """The stored form of sample ``i`` in two parts (:func:`.sample_codec.encode_parts`:
        the second may be a view of ``value``'s memory, which the writer copies); None where
        it cannot be made (an object pickle refuses: a lambda, an open file, a lock): the
        sample passes through uncached and training goes on, said once."""
        try:
            return encode_parts(value)
        except Exception as e:  # pickle raises TypeError, AttributeError, PicklingError, …
            self._say("encode", f"sample {i} (a {type(value).__qualname__}) cannot be stored: "
                      f"{type(e).__name__}: {e}; samples that cannot be pickled pass through "
                      "uncached (training goes on). Return tensors, arrays or plain Python "
                      "values from the deterministic transform to cache them")
            return None

    def _decode(self, blob: bytes | memoryview, i: int) -> Any:
        """The sample stored for ``i``, or _UNREADABLE where it cannot be read back (a class
        that moved or is missing in this process): the sample is computed again, said once."""
        try:
            return decode(blob)
        except Exception as e:
            self._say("decode", f"the stored sample {i} cannot be read back "
                      f"({type(e).__name__}: {e}); such samples are computed again")
            return _UNREADABLE

    def _say(self, kind: str, message: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            where = self.path or type(self.store).__name__
            warnings.warn(f"redline cache at {where}: {message}", RuntimeWarning, stacklevel=5)

    def __getitem__(self, i: int) -> Any:
        try:
            i = operator.index(i)  # (inline: every read of an epoch comes through here)
        except TypeError:
            i = _index(i)  # raises, saying why
        value = self.get_deterministic(i)
        return self.random(value) if self.random is not None else value

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """A whole batch in one store round trip (the DataLoader calls this when present)."""
        values = self._deterministic_many([_index(i) for i in indices])
        if self.random is None:
            return values
        return [self.random(v) for v in values]

    def stats(self) -> CacheStats:
        """Counters summed over this process and its DataLoader workers (a worker publishes
        its counts with each batch it returns, and read one sample at a time every few dozen
        samples and when it exits). This process's pending writes are written first."""
        with self._lock:
            self._drain()
            self._flush()
        with self._tally.counters.get_lock():
            c = [int(x) for x in self._tally.counters[:]]
        hits, misses, read, written, uncached = c[:5]
        return CacheStats(hits=hits, misses=misses, bytes_read=read, bytes_written=written,
                          uncached=uncached)


def _index(i: Any) -> int:
    """``i`` as the int it stands for (a numpy integer, a one-element integer tensor); a
    TypeError for a key that is not one (a float would be cut to another sample's index)."""
    try:
        return operator.index(i)
    except TypeError:
        raise TypeError(f"CachedDataset indexes samples by integer (0 to len - 1, what "
                        f"DataLoader's samplers give), got {type(i).__name__} {i!r}; a dataset "
                        f"keyed otherwise can be wrapped in one that maps positions to its "
                        f"keys") from None


def _new_writer(store: Store) -> Writer:
    """A DataLoader worker writes its batches itself (see cache_writer's docstring); the
    training process hands an LMDB store's to a writer process (:mod:`.cache_proc`), or, where
    the system has none or it cannot start, to a writer thread."""
    if get_worker_info() is not None:
        return StoreWriter(store, inline=True)
    if isinstance(store, LmdbStore) and cache_proc.available():
        w = cache_proc.ProcessWriter(store)
        if w.start():
            return w
    return StoreWriter(store)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_write_before_fork)
    # Registered after _write_before_fork, so it runs before it: the locks first.
    os.register_at_fork(before=hold_before_fork, after_in_parent=release_after_fork,
                        after_in_child=release_after_fork)
