"""A CachedDataset read from several threads at once (a thread-pool loader, a prefetching
thread beside the training loop): every sample stored once and right, the counts right, the
user's transforms run side by side, and a fork from another thread (a DataLoader starting its
workers) leaves every reader working."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from factories import Numbers
from redline.data import CachedDataset, cache_proc, lmdb_env
from redline.data.stores import LmdbStore


def sample(i: int) -> torch.Tensor:
    return torch.full((2500,), float(i))  # 10 kB: the ring's records, LMDB overflow pages


@pytest.fixture
def switching() -> Iterator[None]:
    """Threads handed the interpreter every microsecond, not every 5 ms: interleavings that
    a real pool meets now and then, met at every sample."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


@pytest.mark.parametrize("how", ["one by one", "in batches"])
def test_a_thread_pool_fills_the_cache_and_every_sample_is_stored_right(
        tmp_path: Path, switching: None, how: str) -> None:
    n = 1200
    ds = CachedDataset(Numbers(n), sample, path=tmp_path / "c")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not writable", no write failure
        with ThreadPoolExecutor(4) as pool:
            if how == "one by one":
                out = list(pool.map(ds.__getitem__, range(n)))
            else:
                batches = [list(range(s, min(n, s + 16))) for s in range(0, n, 16)]
                out = [t for b in pool.map(ds.__getitems__, batches) for t in b]
        ds.flush()
    assert all(torch.equal(t, sample(i)) for i, t in enumerate(out))
    st = ds.stats()
    assert (st.misses, st.hits, st.uncached, st.complete) == (n, 0, 0, True)
    fresh = CachedDataset(Numbers(n), sample, path=tmp_path / "c")
    assert all(torch.equal(fresh[i], sample(i)) for i in range(n))
    assert fresh.stats().hits == n


def test_threads_read_a_filled_cache_side_by_side(tmp_path: Path, switching: None) -> None:
    n = 600
    filled = CachedDataset(Numbers(n), sample, path=tmp_path / "c")
    [filled[i] for i in range(n)]
    filled.flush()
    ds = CachedDataset(Numbers(n), sample, path=tmp_path / "c")
    with ThreadPoolExecutor(4) as pool:
        out = list(pool.map(ds.__getitem__, [i % n for i in range(4 * n)]))
    assert all(torch.equal(t, sample(i % n)) for i, t in enumerate(out))
    assert ds.stats().hits == 4 * n


def test_the_users_transforms_run_side_by_side(tmp_path: Path) -> None:
    """The lock is not held around the transform: two threads' transforms meet (a
    transform that waited for the other under the lock would time out)."""
    meet = threading.Barrier(2, timeout=10)

    def slow(i: int) -> torch.Tensor:
        meet.wait()
        return sample(i)

    ds = CachedDataset(Numbers(8), slow, path=tmp_path / "c")
    with ThreadPoolExecutor(2) as pool:
        out = list(pool.map(ds.__getitem__, range(8)))  # raises BrokenBarrierError if not
    assert all(torch.equal(t, sample(i)) for i, t in enumerate(out))


def test_datasets_on_one_store_object_share_its_lock(tmp_path: Path, switching: None) -> None:
    store = LmdbStore(tmp_path / "c", 2**30)
    train = CachedDataset(Numbers(400), sample, store=store, fingerprint="train")
    val = CachedDataset(Numbers(400), sample, store=store, fingerprint="val")
    assert train._lock is val._lock
    with ThreadPoolExecutor(4) as pool:
        a = pool.map(train.__getitem__, range(400))
        b = pool.map(val.__getitem__, range(400))
        out = list(zip(a, b, strict=True))
    assert all(torch.equal(x, sample(i)) and torch.equal(y, sample(i))
               for i, (x, y) in enumerate(out))
    train.flush(), val.flush()
    assert train.stats().complete and val.stats().complete


def test_datasets_on_one_folder_open_it_from_threads_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two store objects on one folder (two datasets given its path), first read at once:
    one opens the process's environment, the other finds it."""
    opening = lmdb_env.open_writable

    def slow_open(path: str, map_size: int) -> Any:
        time.sleep(0.05)  # a slow filesystem: both threads are opening at once
        return opening(path, map_size)

    monkeypatch.setattr(lmdb_env, "open_writable", slow_open)
    for attempt in range(3):
        path = tmp_path / str(attempt)
        sets = [CachedDataset(Numbers(64), sample, path=path, fingerprint=f) for f in "ab"]
        start = threading.Barrier(2, timeout=10)

        def first(ds: CachedDataset, start: threading.Barrier = start) -> torch.Tensor:
            start.wait()
            return ds[0]  # type: ignore[no-any-return]

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # never "not writable: already open"
            with ThreadPoolExecutor(2) as pool:
                assert all(torch.equal(t, sample(0)) for t in pool.map(first, sets))
        for ds in sets:
            ds.flush()
            assert ds.stats().complete


def test_a_fork_from_another_thread_leaves_every_reader_working(tmp_path: Path) -> None:
    """A DataLoader starting its workers (a fork) while other threads read: the stores close
    their handles before the fork under nobody's read, and reopen after it."""
    n = 256
    ds = CachedDataset(Numbers(n), sample, path=tmp_path / "c")
    [ds[i] for i in range(n)]
    ds.flush()
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        i = 0
        while not stop.is_set():
            try:
                assert torch.equal(ds[i % n], sample(i % n))
            except BaseException as e:  # any failure, reported below
                errors.append(e)
                return
            i += 1

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    try:
        loader = DataLoader(ds, batch_size=32, num_workers=2,
                            multiprocessing_context=mp.get_context("fork"))
        for _ in range(3):  # three forks of two workers each
            got = torch.cat(list(loader))
            assert torch.equal(got, torch.stack([sample(i) for i in range(n)]))
    finally:
        stop.set()
        for t in readers:
            t.join(timeout=30)
    assert errors == []


def _filled(path: Path, n: int) -> CachedDataset:
    ds = CachedDataset(Numbers(n), sample, path=path, fingerprint="x")
    [ds[i] for i in range(n)]
    ds.flush()
    return ds


def _fork_and_reap() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def test_forks_from_several_threads_at_once_leave_the_readers_working(
        tmp_path: Path, switching: None, capfd: pytest.CaptureFixture[str]) -> None:
    """Two DataLoaders started from two threads fork at once: each fork releases only the
    locks it took (one released by the other's hook stayed held: every reader hung)."""
    n = 64
    ds = _filled(tmp_path / "c", n)
    errors: list[BaseException] = []
    stop = threading.Event()

    def read() -> None:
        i = 0
        try:
            while not stop.is_set():
                assert torch.equal(ds[i % n], sample(i % n))
                i += 1
        except BaseException as e:  # any failure, reported below
            errors.append(e)

    def fork() -> None:
        for _ in range(150):
            _fork_and_reap()

    reader = threading.Thread(target=read, daemon=True)
    forkers = [threading.Thread(target=fork, daemon=True) for _ in range(3)]
    reader.start()
    for t in forkers:
        t.start()
    for t in forkers:
        t.join(timeout=60)
    stop.set()
    reader.join(timeout=30)
    assert not reader.is_alive() and not any(t.is_alive() for t in forkers)  # no deadlock
    assert errors == []
    assert "Exception ignored" not in capfd.readouterr().err  # no hook failed


def test_a_dataset_made_while_another_thread_forks_reads_fine(
        tmp_path: Path, switching: None) -> None:
    """A validation set made in a thread while the training DataLoader forks its workers:
    its lock waits for the fork, so its first read never meets the stores closing."""
    n = 64
    _filled(tmp_path / "c", n)
    errors: list[BaseException] = []
    stop = threading.Event()
    made = [0]

    def make_and_read() -> None:
        try:
            while not stop.is_set():
                ds = CachedDataset(Numbers(n), sample, path=tmp_path / "c", fingerprint="x")
                for i in range(0, n, 8):
                    assert torch.equal(ds[i], sample(i))
                made[0] += 1
        except BaseException as e:  # any failure, reported below
            errors.append(e)

    t = threading.Thread(target=make_and_read, daemon=True)
    t.start()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not errors:
        _fork_and_reap()
    stop.set()
    t.join(timeout=30)
    assert errors == [] and made[0] > 0


def test_a_batch_read_right_after_its_hand_over_to_a_writer_thread_is_not_computed_again(
        tmp_path: Path, switching: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read your own writes through __getitems__ with a writer thread: the pending samples are
    looked up before the store, so one written (and dropped from pending) in between is found
    in the store, never missed by both."""
    monkeypatch.setattr(cache_proc, "available", lambda: False)  # the writer thread's path
    reading = LmdbStore.get_many

    def slow_read(self: LmdbStore, keys: list[bytes]) -> list[bytes | memoryview | None]:
        out = reading(self, keys)
        time.sleep(0.0005)  # the writer thread writes a batch meanwhile
        return out

    monkeypatch.setattr(LmdbStore, "get_many", slow_read)
    calls: list[int] = []

    def counted(i: int) -> torch.Tensor:
        calls.append(i)
        return torch.full((16,), float(i))

    n = 1600
    ds = CachedDataset(Numbers(n), counted, path=tmp_path / "c")
    for s in range(0, n, 8):
        batch = list(range(s, s + 8))
        ds.__getitems__(batch)  # computed, handed to the writer thread
        for _ in range(2):
            again = ds.__getitems__(batch)
            assert all(float(t[0]) == i for i, t in zip(batch, again, strict=True))
    assert len(calls) == n  # each computed once
    ds.flush()
    st = ds.stats()
    assert (st.misses, st.hits, st.complete) == (n, 2 * n, True)
