"""A cache's writes, in batches: the samples a process computes are encoded on the caller's
side (one copy of their bytes, so a tensor changed in place afterwards is stored as it was),
gathered into batches, and written one store call (one LMDB transaction) a batch, by the caller
or by one background thread per process and dataset.

Who writes a batch depends on the process. In the training process, a writer process of its
own where the store is LMDB (:mod:`redline.data.cache_proc`), else (a Redis store, no memfd, a
writer process that cannot start or died) the background thread here: the training thread
then pays the encoding and a queue append per sample, and the store's copies, its commit and
its lock (shared by every DataLoader worker and rank writing to the same LMDB) are waited for
by the writer thread (py-lmdb releases the GIL inside LMDB's calls; the Redis client inside
its socket calls). In a DataLoader worker, the worker itself, when a batch is full: the worker
is not the training thread, its sibling workers already keep the cores busy, and a thread
there only adds its wake-ups and GIL hand-overs (one per LMDB put) to the worker's own work
(``benchmarks/cache.py``; the README's cache section has the comparison).

The thread's queue is bounded (:data:`QUEUED_BATCHES` batches of at most :data:`WRITE_BATCH`
samples or :data:`~redline.data.lmdb_env.BATCH_BYTES` bytes): when it is full (a store slower
than the pipeline, or a writer thread that a loaded host does not schedule: it runs
:data:`NICE_STEP` below its process) the caller writes that batch itself, so memory never
grows and the caller never waits longer than one write.

Until a batch is written its samples stay readable from :attr:`StoreWriter.pending` (read
your own writes: a sample computed and asked for again in the same epoch is served from
there). A write that fails (the store's size bound, a full disk, any error of the store) stops
this writer: what it held is dropped and counted as not stored, and the reason is kept for the
dataset to say once, from the training thread. The store's own atomicity (a transaction per
batch in LMDB) keeps a failed batch from being read as valid.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from typing import Any, Protocol

from redline.data.lmdb_env import BATCH_BYTES
from redline.data.stores import Store, StoreFull

WRITE_BATCH = 32
"""Samples per store call at most (a transaction per sample costs a commit each)."""

QUEUED_BATCHES = 32
"""Batches waiting for the writer thread at most; one more is written by the caller itself.
With :data:`BATCH_BYTES`, bounds what a process holds unwritten to ~8 MiB of samples smaller
than it, or 33 samples where each is larger (a batch of its own)."""


class Writer(Protocol):
    """What a dataset calls on its writer in one process."""

    @property
    def pending(self) -> dict[bytes, Any]:
        """Samples handed over and not written yet (key → stored form): read your own
        writes."""
        ...

    @property
    def failure(self) -> str | None:
        """Why writing stopped (None: it has not)."""
        ...

    def submit(self, key: bytes, head: bytes, body: bytes | memoryview) -> None:
        """Take one sample's stored form, ``head + body`` (``body`` may be a view of the
        caller's tensor: copied before this returns)."""
        ...

    def only_own(self) -> bool:
        """Whether the store holds no key of the dataset but those handed to this writer (a
        sample never handed over is then not stored: no lookup needed)."""
        ...

    def drain(self) -> None: ...
    def close(self) -> None: ...
    def take_counts(self) -> tuple[int, int]: ...


class StoreWriter:
    """The writer of one dataset in one process (see the module docstring)."""

    def __init__(self, store: Store, *, inline: bool = False) -> None:
        self.store = store
        self.inline = inline
        """Write every batch on the caller's thread (a DataLoader worker's writer)."""
        self.pending: dict[bytes, bytes] = {}
        """Samples handed to the writer and not written yet (key → stored form)."""
        self.failure: str | None = None
        """Why writing stopped (None: it has not)."""
        self._batch: list[tuple[bytes, bytes]] = []
        self._batch_bytes = 0
        self._queue: queue.Queue[list[tuple[bytes, bytes]] | None] = queue.Queue(QUEUED_BATCHES)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._writing = threading.Lock()
        """Held around each store call: the thread's and the caller's writes take turns."""
        self._written = 0
        self._lost = 0

    def submit(self, key: bytes, head: bytes, body: bytes | memoryview) -> None:
        """Queue one sample's stored form, ``head + body``, for writing (readable from
        :attr:`pending` until it is written)."""
        blob = body if not head and isinstance(body, bytes) else b"".join((head, body))
        if self._batch and self._batch_bytes + len(blob) > BATCH_BYTES:
            self._send()  # this sample would take the batch past its bytes
        self.pending[key] = blob
        self._batch.append((key, blob))
        self._batch_bytes += len(blob)
        if len(self._batch) >= WRITE_BATCH or self._batch_bytes >= BATCH_BYTES:
            self._send()

    def only_own(self) -> bool:
        """Never known here: other processes and writers may share the store."""
        return False

    def _send(self) -> None:
        if not self._batch:
            return
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if self.inline:
            self._write(batch)
            return
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="redline-cache-writer",
                                            daemon=True)
            self._thread.start()
        try:
            self._queue.put_nowait(batch)
        except queue.Full:  # the thread is behind: write this one here rather than wait
            self._write(batch)

    def drain(self) -> None:
        """Return once everything submitted so far is written (or dropped by a failure)."""
        self._send()
        if self._thread is not None and self._thread.is_alive():
            self._queue.join()
            return
        while True:  # no thread (this process forked from one that had it): write here
            try:
                batch = self._queue.get_nowait()
            except queue.Empty:
                return
            if batch is not None:
                self._write(batch)
            self._queue.task_done()

    def close(self) -> None:
        """Drain, then end the thread (a later submit starts another)."""
        self.drain()
        thread, self._thread = self._thread, None
        if thread is not None and thread.is_alive():
            self._queue.put(None)
            thread.join()

    def take_counts(self) -> tuple[int, int]:
        """(bytes written, samples not stored) since the last call."""
        with self._lock:
            out = (self._written, self._lost)
            self._written = self._lost = 0
        return out

    def _run(self) -> None:
        _lower_priority()
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                self._write(batch)
            finally:
                self._queue.task_done()

    def _write(self, batch: list[tuple[bytes, bytes]]) -> None:
        with self._writing:
            self._write_locked(batch)

    def _write_locked(self, batch: list[tuple[bytes, bytes]]) -> None:
        written = stored = 0
        try:
            if self.failure is None:
                written = self.store.put_many(batch)
                stored = len(batch)
        except StoreFull as e:
            written, stored = e.written, e.stored
            self.failure = f"{e} (fill-once policy: nothing is evicted)"
        except Exception as e:  # a full disk (OSError ENOSPC), a store's own error: not fatal
            self.failure = f"write failed ({type(e).__name__}: {e})"
        finally:
            pending = self.pending
            for k, _ in batch:  # written, or given up: read from the store or computed again
                pending.pop(k, None)
            with self._lock:
                self._written += written
                self._lost += len(batch) - stored


NICE_STEP = 10
"""How much nicer than its process the writer thread runs: nice +10 weighs about a tenth of a
training thread (the kernel's nice-to-weight table: 110 against 1024), so on busy cores it
takes little from the training work. Lower weights starve it even beside an idle core: at
SCHED_IDLE or nice +19 the writer thread of a sample-by-sample fill, woken on the training
thread's CPU, wrote under half of its batches (the rest fell to the training thread,
``benchmarks/cache.py``); at +10 it wrote them all."""


def _lower_priority() -> None:
    """Run this thread :data:`NICE_STEP` nicer than its process (Linux sets a nice value per
    thread, by its thread id)."""
    import os
    with contextlib.suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid,
                       min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICE_STEP))
