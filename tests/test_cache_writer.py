"""The cache's writer: a sample computed and not yet written is read back from memory, stored
as it was when computed; a writer thread (the training process's, where it has no writer
process: tests/test_cache_proc.py) takes batches off the caller, a DataLoader worker's are
written by the worker; the caller writes when the thread falls behind, and a write that fails
stops writing without losing a value."""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from factories import Numbers
from redline.data import CachedDataset, cache_proc, lmdb_env
from redline.data.cache_writer import QUEUED_BATCHES, WRITE_BATCH, StoreWriter
from redline.data.sample_codec import encode


class HeldStore:
    """A store whose writes wait until ``release`` is set (a writer thread the host does not
    schedule, or a slow disk); it records which thread wrote each batch."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.release = threading.Event()
        self.writers: list[str] = []

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | memoryview | None]:
        return [self.data.get(k) for k in keys]

    def put_many(self, items: list[tuple[bytes, bytes]]) -> int:
        name = threading.current_thread().name
        if name == "redline-cache-writer":
            self.release.wait(30)
        self.writers.append(name)
        self.data.update(items)
        return sum(len(v) for _, v in items)


def test_a_sample_not_yet_written_is_read_back_without_computing_it_again(
        tmp_path: Path) -> None:
    calls: list[int] = []

    def det(i: int) -> torch.Tensor:
        calls.append(i)
        return torch.full((4,), float(i))

    store = HeldStore()
    ds = CachedDataset(Numbers(WRITE_BATCH), det, store=store)  # type: ignore[arg-type]
    first = [ds[i] for i in range(WRITE_BATCH)]  # one full batch: handed to the held thread
    again = [ds[i] for i in range(WRITE_BATCH)]
    assert calls == list(range(WRITE_BATCH))  # computed once: the rest came from memory
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not store.data  # nothing written yet: the thread is held
    store.release.set()
    ds.flush()
    assert len(store.data) == WRITE_BATCH
    st = ds.stats()
    assert (st.misses, st.hits, st.uncached) == (WRITE_BATCH, WRITE_BATCH, 0)


def test_a_tensor_changed_in_place_after_it_was_computed_is_stored_as_it_was(
        tmp_path: Path) -> None:
    calls: list[int] = []

    def det(i: int) -> torch.Tensor:
        calls.append(i)
        return torch.full((8,), float(i))

    ds = CachedDataset(Numbers(4), det, path=tmp_path / "c")
    got = ds[2]
    got.add_(100)  # the caller's random transform, in place, before the write happened
    ds.flush()  # written: read back from the store now, not from memory
    assert torch.equal(ds[2], torch.full((8,), 2.0))  # as computed, not as changed
    assert calls == [2] and ds.stats().hits == 1


def test_a_writer_thread_that_falls_behind_makes_the_caller_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = HeldStore()
    writer = StoreWriter(store)  # type: ignore[arg-type]
    n = (QUEUED_BATCHES + 3) * WRITE_BATCH
    done = threading.Event()

    def submit_all() -> None:
        for i in range(n):
            writer.submit(str(i).encode(), b"", b"x" * 10)
        done.set()

    caller = threading.Thread(target=submit_all, name="caller")
    caller.start()
    # the thread holds one batch in its write and the queue holds QUEUED_BATCHES; the caller
    # writes the batches beyond that itself instead of waiting for the held thread
    assert done.wait(20), "the caller waited for a writer thread that does not run"
    assert store.writers.count("caller") >= 2
    store.release.set()
    writer.close()
    caller.join()
    assert len(store.data) == n and not writer.pending
    assert writer.take_counts() == (10 * n, 0)


def test_a_write_that_fails_stops_writing_and_every_value_stays_right(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_proc, "available", lambda: False)  # the writer thread's path
    ds = CachedDataset(Numbers(3 * WRITE_BATCH), lambda i: torch.full((4,), float(i)),
                       path=tmp_path / "c")

    def no_space(self: Any, items: list[tuple[bytes, bytes]]) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(type(ds.store), "put_many", no_space)
    with pytest.warns(RuntimeWarning, match="No space left") as rec:
        out = [ds[i] for i in range(3 * WRITE_BATCH)]
        ds.flush()
        out += [ds[i] for i in range(3 * WRITE_BATCH)]
    assert len(rec) == 1  # said once
    assert all(float(o[0]) == i % (3 * WRITE_BATCH) for i, o in enumerate(out))
    st = ds.stats()
    assert not st.complete and st.uncached == 6 * WRITE_BATCH  # none stored: each was counted


def test_an_inline_writer_writes_each_full_batch_on_the_callers_thread() -> None:
    store = HeldStore()
    writer = StoreWriter(store, inline=True)  # type: ignore[arg-type]
    for i in range(WRITE_BATCH + 3):
        writer.submit(b"s%d" % i, b"", b"x" * 100)
    # the full batch written at once, by the caller; the rest held (and readable) until then
    assert store.writers == [threading.current_thread().name] and len(writer.pending) == 3
    writer.close()
    assert store.writers == [threading.current_thread().name] * 2
    assert len(store.data) == WRITE_BATCH + 3 and not writer.pending
    assert writer._thread is None
    assert writer.take_counts() == (100 * (WRITE_BATCH + 3), 0)


def test_a_transaction_holds_at_most_batch_bytes_or_one_larger_sample() -> None:
    sizes: list[int] = []

    class Sized(HeldStore):
        def put_many(self, items: list[tuple[bytes, bytes]]) -> int:
            sizes.append(sum(len(v) for _, v in items))
            return super().put_many(items)

    store = Sized()
    writer = StoreWriter(store, inline=True)  # type: ignore[arg-type]
    sample = 100 * 1024
    for i in range(9):
        writer.submit(b"s%d" % i, b"", b"x" * sample)
    big = lmdb_env.BATCH_BYTES + 1
    writer.submit(b"big", b"", b"x" * big)  # a transaction of its own
    writer.submit(b"last", b"", b"x" * sample)
    writer.close()
    # out before a sample would take it past BATCH_BYTES, well before WRITE_BATCH samples
    assert sizes == [2 * sample] * 4 + [sample, big, sample]
    assert len(store.data) == 11


class NamingStore:
    """A store that appends, for each batch written, the writing process's id and thread name
    to a file (readable after a DataLoader's workers are gone)."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def get(self, key: bytes) -> bytes | None:
        return None

    def get_many(self, keys: list[bytes]) -> list[bytes | memoryview | None]:
        return [None] * len(keys)

    def put_many(self, items: list[tuple[bytes, bytes]]) -> int:
        import os
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {threading.current_thread().name} {len(items)}\n")
        return sum(len(v) for _, v in items)


def test_a_dataloader_worker_writes_its_batches_itself(tmp_path: Path) -> None:
    import os

    from torch.utils.data import DataLoader

    log = tmp_path / "writes"
    n = 3 * WRITE_BATCH
    ds = CachedDataset(Numbers(n), lambda i: torch.full((4,), float(i)),
                       store=NamingStore(log))  # type: ignore[arg-type]
    got = [b for b in DataLoader(ds, batch_size=8, num_workers=1)]
    assert torch.equal(torch.cat(got)[:, 0], torch.arange(n, dtype=torch.float32))
    lines = [ln.split() for ln in log.read_text().splitlines()]
    # written in the worker by its own thread, a batch a store call
    assert {(int(pid) != os.getpid(), name) for pid, name, _ in lines} == {(True, "MainThread")}
    assert sum(int(k) for *_, k in lines) == n
    st = ds.stats()
    one = len(encode(torch.full((4,), 0.0)))
    assert (st.misses, st.uncached, st.bytes_written) == (n, 0, n * one)
