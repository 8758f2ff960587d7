"""A CachedDataset read from several threads at once (a thread-pool loader, a prefetching
thread beside the training loop): every sample stored once and right, the counts right, the
user's transforms run side by side, and a fork from another thread (a DataLoader starting its
workers) leaves every reader working."""

from __future__ import annotations

import multiprocessing as mp
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
from redline.data import CachedDataset, lmdb_env
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
