"""The locks that make a :class:`~redline.data.cache.CachedDataset` safe to read from several
threads at once (a thread-pool loader, a prefetching thread beside the training loop), and
safe to fork from any thread.

One reentrant lock per store object, shared by the datasets that use it: they share its read
snapshot, and an LMDB transaction is one thread's at a time (``lmdb.h``). A dataset holds it
around its lookups and its hand-overs to the writer, never around the user's transforms. Before
a fork every lock is taken (:func:`hold_before_fork`, registered by :mod:`.cache` so that it
runs before the writers drain and the stores close their handles), and released after it in
both processes: a thread inside a lookup finishes first, and the child inherits no lock held
by a thread it does not have.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_LOCKS: weakref.WeakKeyDictionary[Any, threading.RLock] = weakref.WeakKeyDictionary()
"""Each store object's lock, shared by the datasets that use it (a store that cannot be
weakly referenced: each dataset's own)."""

_HELD: list[threading.RLock] = []
"""The locks taken before a fork, released after it in both processes."""

_REGISTRY = threading.Lock()
"""Held while a dataset gets its lock, and by a fork from before it takes the locks until
after it released them: forks from several threads take turns (each releases only what it
took), and a dataset made while a fork is under way waits for it, rather than reading with a
lock the fork does not hold while the stores close their handles."""

_HELD_REGISTRY = [False]
"""Whether the fork under way holds :data:`_REGISTRY` (set and read by the forking thread
alone, which holds it)."""


def lock_for(store: Any, owner: Any) -> threading.RLock:
    """The lock that a dataset holds around its store and writer (``owner``'s own where
    ``store`` cannot be weakly referenced). Per store object, since the datasets on one store
    object share its read snapshot (an LMDB transaction is one thread's at a time,
    ``lmdb.h``). Reentrant: the fork hook takes it in the forking thread, which may hold it
    already."""
    with _REGISTRY:
        for holder in (store, owner):
            try:
                return _LOCKS.setdefault(holder, threading.RLock())
            except TypeError:  # not weakly referenceable
                continue
    raise TypeError(f"a CachedDataset's store must be weakly referenceable: {type(store)}")


def hold_before_fork() -> None:
    """Take every dataset lock before this process forks (see the module docstring): the
    stores then close their handles under nobody's read."""
    _REGISTRY.acquire()
    _HELD_REGISTRY[0] = True
    for lock in list(_LOCKS.values()):  # none added meanwhile; one collected is skipped
        lock.acquire()
        _HELD.append(lock)


def release_after_fork() -> None:
    """Release what :func:`hold_before_fork` took (in the parent, and in the child)."""
    while _HELD:
        _HELD.pop().release()
    if _HELD_REGISTRY[0]:  # not where the hook before was interrupted before taking it
        _HELD_REGISTRY[0] = False
        _REGISTRY.release()
