"""What a :class:`~redline.data.cache.CachedDataset` counts: its reads' hits and misses, the
bytes read and written, the samples not stored; counted per process, published to counters
shared with its DataLoader workers every few dozen events, with each batch a worker returns,
and when the process ends or the dataset is collected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redline.data.cache_writer import Writer
from redline.data.stores import process_id


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheStats:
    """Counts of a :class:`CachedDataset`'s reads: hits, misses, bytes read and written."""

    hits: int
    misses: int
    bytes_read: int
    bytes_written: int
    uncached: int
    """Misses not stored because the store was full (or the disk was, or its write failed)."""

    @property
    def hit_rate(self) -> float | None:
        n = self.hits + self.misses
        return self.hits / n if n else None

    @property
    def complete(self) -> bool:
        """Every sample computed so far was stored: after a fill epoch, the store holds the
        whole dataset. False once a write was refused or failed."""
        return self.uncached == 0


class Tally:
    """A dataset's counts and writer in this process: what its finalizer publishes. Apart
    from the dataset's other attributes, so that the finalizer holds nothing of the user's: one
    that held the user's transform (a bound method of an object that holds the dataset) would
    keep the dataset, its writer process and its ring alive until exit."""

    __slots__ = ("counters", "local", "local_pid", "writer", "writer_pid")

    def __init__(self, counters: Any) -> None:
        self.counters = counters
        """Shared with the DataLoader workers (forked, or spawned: see
        ``CachedDataset.__getstate__``; a copy gets its own): hits, misses, bytes read, bytes
        written, samples not stored."""
        self.local: list[int] | None = None
        """This process's counts not published yet (the same five, then events counted)."""
        self.local_pid = -1
        self.writer: Writer | None = None
        """This process's writer (made on the first miss: a writer process's or thread's in
        the training process, the worker's own in a DataLoader worker; its ``pending``
        samples are read back from memory first)."""
        self.writer_pid = -1


def publish_counts(t: Tally) -> None:
    """Add what the writer of this process wrote and dropped to a dataset's local counters,
    then those to its shared counters (what a dataset's flush ends with, and its finalizer,
    which runs once the dataset is collected or at exit)."""
    pid = process_id()
    local = t.local
    if local is None or t.local_pid != pid:
        return  # nothing counted in this process, nor written: a writer comes after a miss
    w = t.writer if t.writer_pid == pid else None
    if w is not None:
        written, lost = w.take_counts()
        if written or lost:
            local[3] += written
            local[4] += lost
            local[5] += 1
    if not local[5]:
        return
    c = t.counters
    with c.get_lock():
        raw: Any = c.get_obj()  # the plain ctypes array: items do not take the lock again
        for k in range(5):
            raw[k] += local[k]
    local[:] = (0, 0, 0, 0, 0, 0)  # in place: _fill holds this list
