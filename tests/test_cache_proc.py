"""The cache's writer process: the training process's samples go through a shared-memory ring
to a process of its own (Python and lmdb, no torch) that writes them to the LMDB store. Every
sample is stored as computed and read back from memory until written; a full ring makes the
training thread write; the store's bound, a failing write, a writer process that dies or
cannot start, and a training process that dies are each handled without a wrong value."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from factories import Numbers
from redline.data import CachedDataset, cache_child, cache_proc, lmdb_env
from redline.data.cache_writer import StoreWriter
from redline.data.sample_codec import encode
from redline.data.stores import LmdbStore

pytestmark = pytest.mark.skipif(not cache_proc.available(), reason="needs memfd_create (Linux)")


class Counted:
    """``i`` → a tensor of ``size`` floats, all ``i``; counts its calls."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self.calls: list[int] = []

    def __call__(self, i: int) -> torch.Tensor:
        self.calls.append(i)
        return torch.full((self.size,), float(i))


def _writer(ds: CachedDataset) -> cache_proc.ProcessWriter:
    w = ds._tally.writer
    assert isinstance(w, cache_proc.ProcessWriter), type(w)
    return w


def _stop_writer(ds: CachedDataset, stopped: list[int]) -> cache_proc.ProcessWriter:
    """The dataset's writer, its process stopped (a writer process the host does not run):
    what comes next stays unwritten, in the ring."""
    w = _writer(ds)
    assert w._proc is not None
    os.kill(w._proc.pid, signal.SIGSTOP)
    stopped.append(w._proc.pid)
    return w


@pytest.fixture
def small_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64 KiB ring whose records go back to its start past 16 KiB: a few samples of ~4 kB
    fill the window, and a handful more the ring."""
    monkeypatch.setattr(cache_proc, "RING_BYTES", 64 * 1024)
    monkeypatch.setattr(cache_proc, "WINDOW_BYTES", 16 * 1024)


@pytest.fixture
def stopped() -> Iterator[list[int]]:
    """Pids to SIGCONT (and so never leave stopped) at the end of a test."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def test_a_fill_goes_through_the_writer_process_and_every_sample_is_stored(
        tmp_path: Path) -> None:
    det = Counted()
    ds = CachedDataset(Numbers(300), det, path=tmp_path / "c")
    first = [ds[i] for i in range(300)]
    w = _writer(ds)
    ds.flush()
    assert w._proc is not None and w._proc.poll() is None
    # a process of its own that never loaded torch (its start-up stays small)
    maps = Path(f"/proc/{w._proc.pid}/maps").read_text()
    assert "libtorch" not in maps and "lmdb" in maps
    st = ds.stats()
    assert (st.misses, st.uncached, st.complete) == (300, 0, True)
    assert st.bytes_written == 300 * len(encode(torch.full((64,), 0.0)))
    again = CachedDataset(Numbers(300), Counted(), path=tmp_path / "c")  # a new reader
    assert all(torch.equal(again[i], first[i]) for i in range(300))
    assert again.stats().hits == 300 and det.calls == list(range(300))
    w.close()  # what the dataset's finalizer calls at exit
    assert w._proc is None


def test_samples_not_yet_written_are_read_back_and_stored_as_computed(
        tmp_path: Path, stopped: list[int]) -> None:
    det = Counted()
    ds = CachedDataset(Numbers(40), det, path=tmp_path / "c")
    got = ds[0]
    w = _stop_writer(ds, stopped)
    first = [ds[i] for i in range(1, 40)]
    for t in first:
        t.add_(1000)  # the caller's random transform, in place, before the write
    got.add_(1000)
    again = [ds[i] for i in range(40)]
    assert det.calls == list(range(40))  # read back from the ring, not computed again
    assert all(float(t[0]) == i for i, t in enumerate(again))  # as computed, not as changed
    assert w.pending  # held in memory: not written yet
    os.kill(w._proc.pid, signal.SIGCONT)
    ds.flush()
    assert not w.pending
    st = ds.stats()
    assert (st.misses, st.hits, st.uncached) == (40, 40, 0)
    fresh = CachedDataset(Numbers(40), Counted(), path=tmp_path / "c")
    assert all(float(fresh[i][0]) == i for i in range(40))


def test_a_batch_the_writer_process_wrote_whole_is_never_read_back_from_the_ring(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Entering a record in ``pending`` (a view, a tuple) costs the training thread; a record
    # written before anyone asked for it never needs it.
    settled: list[int] = []
    settle = cache_proc.ProcessWriter._settle

    def counted(self: cache_proc.ProcessWriter) -> None:
        settled.append(len(self._batches) + bool(self.ring.unsettled))
        settle(self)

    monkeypatch.setattr(cache_proc.ProcessWriter, "_settle", counted)
    ds = CachedDataset(Numbers(300), Counted(), path=tmp_path / "c")
    for i in range(300):
        ds[i]
    ds.flush()
    w = _writer(ds)
    assert settled == [] and not w.pending and w.ring.consumed == w.ring.end
    fresh = CachedDataset(Numbers(300), Counted(), path=tmp_path / "c")
    assert all(float(fresh[i][0]) == i for i in range(300))


def test_a_batch_written_in_part_leaves_the_rest_readable(
        tmp_path: Path, stopped: list[int]) -> None:
    det = Counted()
    ds = CachedDataset(Numbers(70), det, path=tmp_path / "c")
    ds[0]
    w = _stop_writer(ds, stopped)
    for i in range(1, 70):
        ds[i]
    # two published batches of WRITE_BATCH samples, six samples put since
    assert [len(keys) for _, keys in w._batches] == [32, 32] and len(w.ring.unsettled) == 6
    record = (w._batches[1][0] - w._batches[0][0]) // 32
    w._release(w._batches[0][0] + 5 * record)  # as if written up to sample 36
    key = ds._prefix
    assert sorted(w.pending) == sorted(key + str(i).encode() for i in range(37, 70))
    assert all(float(ds[i][0]) == i for i in range(37, 70))
    assert det.calls == list(range(70))  # read back from the ring, not computed again
    os.kill(w._proc.pid, signal.SIGCONT)
    ds.flush()
    assert not w.pending and ds.stats().complete


def test_a_sample_twice_in_a_batch_is_handed_over_once(tmp_path: Path) -> None:
    # A key handed over twice reads as another writer's to the writer process, which turns
    # the fill's lookup skip off for the rest of the run.
    det = Counted(size=8)
    ds = CachedDataset(Numbers(8), det, path=tmp_path / "c")
    ds[0]
    ds.flush()
    w = _writer(ds)
    assert w.only_own()
    a, b = ds.__getitems__([3, 3])
    c, d = ds.__getitems__([-1, 7])
    ds.flush()
    assert det.calls == [0, 3, 3, 7, 7]  # each computed as often as asked, as uncached
    assert a is not b and c is not d and float(a[0]) == float(b[0]) == 3.0
    assert w.only_own()
    st = ds.stats()
    assert (st.misses, st.hits, st.uncached) == (5, 0, 0)
    fresh = CachedDataset(Numbers(8), Counted(size=8), path=tmp_path / "c")
    assert [float(fresh[i][0]) for i in (0, 3, 7)] == [0.0, 3.0, 7.0]


def test_records_wrap_around_a_small_ring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          small_ring: None) -> None:
    monkeypatch.setattr(cache_proc, "SEND_BYTES", 4 * 1024)
    ds = CachedDataset(Numbers(2000), Counted(size=200), path=tmp_path / "c")
    ds[0]
    w = _writer(ds)
    assert w.ring_bytes == 64 * 1024
    for i in range(1, 2000):
        ds[i]
    assert w.ring.end > 3 * w.ring_bytes  # laps round the ring
    ds.flush()
    st = ds.stats()
    assert (st.misses, st.uncached) == (2000, 0)
    fresh = CachedDataset(Numbers(2000), Counted(size=200), path=tmp_path / "c")
    assert all(float(fresh[i][0]) == i for i in range(0, 2000, 7))
    assert fresh.stats().misses == 0


def test_a_full_ring_makes_the_training_thread_write(
        tmp_path: Path, small_ring: None, stopped: list[int]) -> None:
    ds = CachedDataset(Numbers(200), Counted(size=1000), path=tmp_path / "c")
    ds[0]
    w = _stop_writer(ds, stopped)
    for i in range(1, 200):  # ~4 kB each: the 64 kB ring holds ~16
        ds[i]
    assert len(w.pending) < 20  # the rest went to the store from this thread
    fresh = CachedDataset(Numbers(200), Counted(size=1000), path=tmp_path / "c")
    assert fresh[150] is not None and fresh.stats().hits == 1  # already there
    os.kill(w._proc.pid, signal.SIGCONT)
    ds.flush()
    st = ds.stats()
    assert (st.misses, st.uncached, st.complete) == (200, 0, True)


def test_the_stores_bound_reached_in_the_writer_process_is_said_once(tmp_path: Path) -> None:
    det = Counted(size=64 * 1024)  # 256 kB a sample, a 1 MiB store
    ds = CachedDataset(Numbers(40), det, path=tmp_path / "c", max_bytes=2**20)
    with pytest.warns(RuntimeWarning, match="reached its bound") as rec:
        out = [ds[i] for i in range(40)]
        ds.flush()
        out += [ds[i] for i in range(40)]
    assert len([r for r in rec if "reached its bound" in str(r.message)]) == 1
    assert all(float(t[0]) == i % 40 for i, t in enumerate(out))
    st = ds.stats()
    assert not st.complete and 0 < st.misses - st.uncached < 40
    assert st.hits + st.misses == 80


def test_a_write_that_fails_in_the_writer_process_is_said_and_values_stay_right(
        tmp_path: Path) -> None:
    # A file size limit on the writer process (its writes then fail with EFBIG, as on a
    # full disk).
    det = Counted(size=16 * 1024)
    ds = CachedDataset(Numbers(200), det, path=tmp_path / "c")
    ds[0]
    w = _writer(ds)
    assert w._proc is not None
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.prlimit(w._proc.pid, resource.RLIMIT_FSIZE, (2 * 2**20, hard))
    with pytest.warns(RuntimeWarning, match="write failed") as rec:
        out = [ds[i] for i in range(200)]
        ds.flush()
        out += [ds[i] for i in range(200)]
    assert len(rec) == 1, [str(r.message) for r in rec]
    assert all(float(t[0]) == i % 200 for i, t in enumerate(out))
    st = ds.stats()
    assert not st.complete and st.uncached > 0


def test_a_writer_process_that_dies_is_said_and_training_goes_on(
        tmp_path: Path) -> None:
    det = Counted()
    ds = CachedDataset(Numbers(300), det, path=tmp_path / "c")
    ds[0]
    w = _writer(ds)
    assert w._proc is not None
    os.kill(w._proc.pid, signal.SIGKILL)
    w._proc.wait(10)
    with pytest.warns(RuntimeWarning, match="writer process ended") as rec:
        out = [ds[i] for i in range(300)]
        ds.flush()
        out += [ds[i] for i in range(300)]
    assert len(rec) == 1
    assert all(float(t[0]) == i % 300 for i, t in enumerate(out))
    assert not ds.stats().complete


def test_a_writer_process_found_gone_while_placing_a_record_counts_that_sample(
        tmp_path: Path, small_ring: None, stopped: list[int]) -> None:
    # A full window makes the hand-over look at the writer process again (_place): found
    # gone there, the sample being handed over is counted as not stored, not left in the ring.
    ds = CachedDataset(Numbers(40), Counted(size=1000), path=tmp_path / "c")
    ds[0]
    ds.flush()
    w = _stop_writer(ds, stopped)
    ds[1]
    w.publish()  # the writer process has more to write than it wrote
    assert w._proc is not None
    os.kill(w._proc.pid, signal.SIGKILL)
    w._proc.wait(10)
    with pytest.warns(RuntimeWarning, match="writer process ended"):
        for i in range(2, 40):
            ds[i]
        ds.flush()
    st = ds.stats()
    fresh = CachedDataset(Numbers(40), Counted(size=1000), path=tmp_path / "c")
    for i in range(40):
        fresh[i]
    assert (st.misses, fresh.stats().hits) == (40, 40 - st.uncached)  # every one counted


def test_where_the_writer_process_cannot_start_a_writer_thread_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: object, **k: object) -> None:
        raise PermissionError(1, "Operation not permitted", sys.executable)

    monkeypatch.setattr(subprocess, "Popen", refuse)
    ds = CachedDataset(Numbers(100), Counted(), path=tmp_path / "c")
    out = [ds[i] for i in range(100)]
    assert isinstance(ds._tally.writer, StoreWriter) and not ds._tally.writer.inline
    ds.flush()
    st = ds.stats()
    assert (st.misses, st.uncached, st.complete) == (100, 0, True)
    assert all(float(t[0]) == i for i, t in enumerate(out))


def test_the_end_goes_through_the_socket_where_stores_are_not_kept_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_proc, "ORDERED_STORES", False)
    ds = CachedDataset(Numbers(500), Counted(), path=tmp_path / "c")
    ds[0]
    w = _writer(ds)
    for i in range(1, 500):
        ds[i]
    assert w._head is not None and w._head[cache_child.PUBLISHED] == 0  # never by a store
    deadline = time.monotonic() + 10
    while w._head[cache_child.CONSUMED] < w.ring.sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w._head[cache_child.CONSUMED] >= w.ring.sent > 0  # written without a drain
    ds.flush()
    assert ds.stats().complete and ds.stats().misses == 500


def test_a_dataloader_forked_after_a_fill_reads_what_the_ring_held(tmp_path: Path) -> None:
    det = Counted()
    ds = CachedDataset(Numbers(64), det, path=tmp_path / "c")
    [ds[i] for i in range(64)]  # held in the ring or written: drained before the fork
    got = torch.cat(list(DataLoader(ds, batch_size=16, num_workers=2)))
    assert torch.equal(got[:, 0], torch.arange(64, dtype=torch.float32))
    assert det.calls == list(range(64))  # the workers computed nothing again
    st = ds.stats()
    assert (st.misses, st.hits) == (64, 64)


_CHILD = textwrap.dedent("""
    import os, signal, sys, time, torch
    from torch.utils.data import Dataset
    from redline.data import CachedDataset

    class Numbers(Dataset):
        def __len__(self): return 500
        def __getitem__(self, i): return i

    ds = CachedDataset(Numbers(), lambda i: torch.full((64,), float(i)), path=sys.argv[1],
                       fingerprint="f")
    for i in range(500):
        ds[i]
    print(ds._tally.writer._proc.pid, flush=True)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_the_writer_process_ends_with_the_training_process(tmp_path: Path, how: str) -> None:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "c"), how],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == (0 if how == "exit" else -signal.SIGKILL), out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10  # it looks for its parent every ALIVE_CHECK_S
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            break
        if state == "Z":  # ended; its parent (init here) has not reaped it yet
            break
        time.sleep(0.05)
    else:
        assert not Path(f"/proc/{pid}").exists(), "the writer process outlived its parent"
    ds = CachedDataset(Numbers(500), Counted(), path=tmp_path / "c", fingerprint="f")
    values = [ds[i] for i in range(500)]
    assert all(float(v[0]) == i for i, v in enumerate(values))
    if how == "exit":  # written at exit; after a kill, what was published by then is
        assert ds.stats().hits == 500


def test_a_writer_process_that_ends_idle_is_followed_by_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_child, "IDLE_EXIT_S", 0.3)
    det = Counted()
    ds = CachedDataset(Numbers(200), det, path=tmp_path / "c")
    [ds[i] for i in range(100)]
    w = _writer(ds)
    first = w._proc
    assert first is not None
    first.wait(10)  # nothing more to write: it ends on its own (no process per idle dataset)
    assert w._head is not None and w._head[cache_child.STATE] == cache_child.ENDED_IDLE
    [ds[i] for i in range(100, 200)]
    ds.flush()
    assert w._proc is not first and not w.process_ended and w.failure is None
    st = ds.stats()
    assert (st.misses, st.uncached, st.complete) == (200, 0, True)
    fresh = CachedDataset(Numbers(200), Counted(), path=tmp_path / "c")
    assert all(float(fresh[i][0]) == i for i in range(200)) and fresh.stats().misses == 0


def test_a_writer_process_that_fails_at_start_up_hands_over_to_a_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")  # starts, then exits 1 at once
    ds = CachedDataset(Numbers(400), Counted(), path=tmp_path / "c")
    with pytest.warns(RuntimeWarning, match="writer process ended.*a writer thread writes"):
        out = [ds[i] for i in range(400)]
        ds.flush()
    assert isinstance(ds._tally.writer, StoreWriter)
    st = ds.stats()
    # what it held is not stored (all of it where it was found gone only at the drain), what
    # came after, the thread wrote
    assert 0 < st.uncached <= 400 and st.misses == 400
    assert all(float(t[0]) == i for i, t in enumerate(out))
    again = [ds[i] for i in range(400)]  # the ones not stored are computed again, stored now
    assert all(float(t[0]) == i for i, t in enumerate(again))
    ds.flush()
    st2 = ds.stats()
    assert st2.hits == 400 - st.uncached and st2.bytes_written > st.bytes_written


def test_a_drain_gives_up_on_a_writer_process_that_does_not_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopped: list[int]) -> None:
    monkeypatch.setattr(cache_proc, "DRAIN_TIMEOUT_S", 1.0)
    monkeypatch.setattr(cache_proc, "ORDERED_STORES", False)  # every end a word on the socket
    ds = CachedDataset(Numbers(20000), Counted(size=4), path=tmp_path / "c")
    ds[0]
    w = _writer(ds)
    assert w._proc is not None
    pid = w._proc.pid
    os.kill(pid, signal.SIGSTOP)
    stopped.append(pid)
    for i in range(1, 20000):  # its socket fills: words are dropped, never waited for
        ds[i]
    t = time.monotonic()
    with pytest.warns(RuntimeWarning, match="took no word|wrote nothing"):
        ds.flush()
    assert time.monotonic() - t < 10
    assert not Path(f"/proc/{pid}/stat").exists() or \
        Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    fresh = CachedDataset(Numbers(20000), Counted(size=4), path=tmp_path / "c")
    assert all(float(fresh[i][0]) == i for i in range(0, 20000, 997))


def test_a_lagging_writer_process_has_the_whole_ring(
        tmp_path: Path, stopped: list[int]) -> None:
    ds = CachedDataset(Numbers(20001), Counted(size=16), path=tmp_path / "c")
    ds[0]
    ds.flush()  # the first record written (freed) before the writer process lags
    w = _stop_writer(ds, stopped)
    here: list[bytes] = []
    orig = w._write_here
    w._write_here = lambda k, b: (here.append(k), orig(k, b))  # type: ignore[method-assign]
    for i in range(1, 20001):  # ~2 MiB: past the window, well within the ring
        ds[i]
    assert not here and len(w.pending) == 20000
    os.kill(w._proc.pid, signal.SIGCONT)
    ds.flush()
    assert ds.stats().complete


def test_a_ring_smaller_than_the_window_still_wraps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_proc, "RING_BYTES", 64 * 1024)  # below WINDOW_BYTES
    ds = CachedDataset(Numbers(2000), Counted(size=200), path=tmp_path / "c")
    out = [ds[i] for i in range(2000)]
    ds.flush()
    assert all(float(t[0]) == i for i, t in enumerate(out)) and ds.stats().complete


def _ring_resident_bytes() -> int:
    """Bytes of this process's ring mapping in memory (proc(5): smaps' Rss of the memfd's
    mapping)."""
    rss, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if not line[:1].isupper():  # a mapping's first line (an address range)
            inside = "redline-cache-ring" in line
        elif inside and line.startswith("Rss:"):
            rss += int(line.split()[1]) * 1024
    return rss


@pytest.mark.parametrize("kernel", ["populates", "refuses"])
def test_the_rings_window_is_made_at_its_start_whether_or_not_the_kernel_populates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: str) -> None:
    if kernel == "refuses":  # an advice the kernel does not know: EINVAL, as before Linux 5.14
        monkeypatch.setattr(cache_proc, "MADV_POPULATE_WRITE", -1)
    ds = CachedDataset(Numbers(300), Counted(), path=tmp_path / "c")
    out = [ds[0]]
    w = _writer(ds)
    window = cache_proc.HEADER_BYTES + w.window
    assert _ring_resident_bytes() >= window  # every page of the window, not the first record's
    assert not any(w._map[window - 4096:window])  # made as zeros, the header's flags clear
    out += [ds[i] for i in range(1, 300)]
    ds.flush()
    assert ds.stats().complete and ds.stats().uncached == 0
    fresh = CachedDataset(Numbers(300), Counted(), path=tmp_path / "c")
    assert all(torch.equal(fresh[i], out[i]) for i in range(300))


def test_counts_stay_right_after_the_writer_is_closed_and_used_again(tmp_path: Path) -> None:
    ds = CachedDataset(Numbers(400), Counted(), path=tmp_path / "c")
    [ds[i] for i in range(200)]
    w = _writer(ds)
    w.close()
    [ds[i] for i in range(200, 400)]
    ds.flush()
    st = ds.stats()
    one = len(encode(torch.full((64,), 0.0)))
    assert (st.misses, st.uncached, st.bytes_written) == (400, 0, 400 * one)


def test_descriptors_past_1024_are_fine(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the descriptor limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        ds = CachedDataset(Numbers(300), Counted(), path=tmp_path / "c")
        [ds[i] for i in range(300)]
        w = _writer(ds)
        assert w._ack >= 1024
        ds.flush()
        assert ds.stats().complete and w._proc is not None and w._proc.poll() is None
        w.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_ctrl_c_to_the_training_programs_process_group_leaves_the_writes_alone(
        tmp_path: Path) -> None:
    ds = CachedDataset(Numbers(100), Counted(), path=tmp_path / "c")
    [ds[i] for i in range(100)]
    w = _writer(ds)
    assert w._proc is not None
    assert os.getpgid(w._proc.pid) != os.getpgid(0)  # SIGINT to our group does not reach it
    ds.flush()
    assert ds.stats().complete


def test_a_fork_of_the_program_that_exits_leaves_the_parents_writer_alone(
        tmp_path: Path) -> None:
    ds = CachedDataset(Numbers(400), Counted(), path=tmp_path / "c")
    [ds[i] for i in range(200)]
    w = _writer(ds)
    proc = w._proc
    assert proc is not None
    pid = os.fork()
    if pid == 0:  # the program's own fork: its normal exit runs the finalizers it inherited
        try:
            import multiprocessing.util as mp_util
            mp_util._exit_function()  # type: ignore[attr-defined]
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert proc.poll() is None and w._proc is proc  # not told to end by the fork
    [ds[i] for i in range(200, 400)]
    ds.flush()
    st = ds.stats()
    assert (st.misses, st.uncached, st.complete) == (400, 0, True)


def test_a_writer_process_that_dies_during_a_drain_ends_the_wait_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopped: list[int]) -> None:
    import threading

    monkeypatch.setattr(cache_proc, "DRAIN_TIMEOUT_S", 60.0)
    ds = CachedDataset(Numbers(300), Counted(), path=tmp_path / "c")
    ds[0]
    w = _writer(ds)
    assert w._proc is not None
    pid = w._proc.pid
    os.kill(pid, signal.SIGSTOP)  # holds what comes next unwritten
    stopped.append(pid)
    [ds[i] for i in range(1, 300)]
    threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()  # dies while drained
    t = time.monotonic()
    with pytest.warns(RuntimeWarning, match="writer process ended"):
        ds.flush()
    assert time.monotonic() - t < 10  # not the drain's whole deadline
    assert isinstance(ds._tally.writer, StoreWriter)
    assert ds.stats().uncached > 0


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to keep apart")
def test_the_writer_process_keeps_off_the_training_threads_cpu(tmp_path: Path) -> None:
    allowed = os.sched_getaffinity(0)
    here = min(allowed)
    ds = CachedDataset(Numbers(300), Counted(), path=tmp_path / "c")
    ds[0]
    ds.flush()  # the writer process runs, with this process's CPUs
    w = _writer(ds)
    assert w._proc is not None and os.sched_getaffinity(w._proc.pid) == allowed
    os.sched_setaffinity(0, {here})  # this thread only: the training thread on one CPU
    try:
        assert cache_child._cpu_of(os.getpid(), threading.get_native_id()) == here
        time.sleep(2 * cache_child.PLACE_CHECK_S)
        [ds[i] for i in range(1, 300)]
        ds.flush()
    finally:
        os.sched_setaffinity(0, allowed)
    assert os.sched_getaffinity(w._proc.pid) == allowed - {here}
    assert ds.stats().complete
    assert cache_child._cpu_of(os.getpid(), 2**31 - 1) is None  # no such thread


def _count_lookups(ds: CachedDataset, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The keys ``ds`` looks up in its store from now on."""
    looked: list[bytes] = []
    store = ds.store
    get = store.get

    def spy(key: bytes) -> Any:
        looked.append(key)
        return get(key)

    monkeypatch.setattr(store, "get", spy)
    return looked


def test_a_fill_alone_on_its_store_skips_the_lookups_of_samples_never_handed_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    det = Counted()
    ds = CachedDataset(Numbers(300), det, path=tmp_path / "c")
    ds[0]
    w = _writer(ds)
    assert ds._own_keys is not None and w.only_own()
    looked = _count_lookups(ds, monkeypatch)
    first = [ds[i] for i in range(1, 300)]
    assert looked == []  # all 299 misses: none was looked up
    again = [ds[i] for i in range(1, 300)]  # handed over: read back (memory or store)
    assert det.calls == list(range(300))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    ds.flush()
    st = ds.stats()
    assert (st.misses, st.hits, st.uncached, st.complete) == (300, 299, 0, True)
    assert w.only_own()


def test_a_writer_closed_by_another_thread_mid_check_turns_the_skip_off_without_raising(
        tmp_path: Path) -> None:
    """The fill's check runs without the lock: another thread may close the writer (its
    process died) between the check's read of the header and its use."""
    ds = CachedDataset(Numbers(30), Counted(), path=tmp_path / "c")
    ds[0]
    w = _writer(ds)
    assert w.only_own()
    head = w._head
    assert head is not None
    head.release()  # what close() does, seen by a check that read the header before it
    assert not w.only_own()
    w._head = None
    w.close()


def test_another_writer_on_the_store_turns_the_skipped_lookups_off(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    det = Counted()
    ds = CachedDataset(Numbers(300), det, path=tmp_path / "c")
    [ds[i] for i in range(100)]
    ds.flush()
    w = _writer(ds)
    assert w.only_own()
    # another writer (a rank, a worker) stores sample 250 as it computed it
    other = LmdbStore(tmp_path / "c", 2**30)
    other.put_many([(ds._prefix + b"250", encode(torch.full((64,), -1.0)))])
    [ds[i] for i in range(100, 200)]
    ds.flush()  # the writer process's next transaction did not follow its last one
    assert not w.only_own()
    looked = _count_lookups(ds, monkeypatch)
    assert float(ds[250][0]) == -1.0 and 250 not in det.calls  # read, not computed
    assert looked == [ds._prefix + b"250"]


def test_a_writer_that_stored_the_same_samples_turns_the_skipped_lookups_off(
        tmp_path: Path) -> None:
    det = Counted()
    ds = CachedDataset(Numbers(200), det, path=tmp_path / "c")
    ds[0]
    ds.flush()
    w = _writer(ds)
    assert w.only_own()
    # DataLoader workers (or a rank) store the rest in one transaction: no gap in the writer
    # process's own transactions follows, as its next one stores nothing
    other = LmdbStore(tmp_path / "c", 2**30)
    other.put_many([(ds._prefix + b"%d" % i, encode(torch.full((64,), float(i))))
                    for i in range(1, 200)])
    [ds[i] for i in range(1, 33)]  # taken as not stored: computed, handed over, found there
    ds.flush()
    assert not w.only_own()
    det.calls.clear()
    values = [ds[i] for i in range(33, 200)]
    assert det.calls == []  # read, not computed
    assert all(float(v[0]) == i for i, v in zip(range(33, 200), values, strict=True))


def test_a_fills_misses_take_the_short_path_and_end_as_the_general_path_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the second miss (the first makes the writer process) the fill's reads skip
    _keep; the store, the values and the counters come out as they do through _keep alone."""
    def fill(path: Path, short: bool) -> tuple[list[torch.Tensor], Any, list[int]]:
        ds = CachedDataset(Numbers(300), Counted(), path=path)
        if not short:
            monkeypatch.setattr(ds, "_start_fill", lambda *a: None)
        ds[0], ds[1]
        assert (ds._fill is not None) == short
        kept: list[int] = []
        keep = ds._keep
        monkeypatch.setattr(ds, "_keep", lambda i, *a: kept.append(i) or keep(i, *a))
        values = [ds[i] for i in range(2, 300)]
        ds.flush()
        _writer(ds).close()
        return values, ds.stats(), kept

    short, st_short, kept_short = fill(tmp_path / "a", True)
    general, st_general, kept_general = fill(tmp_path / "b", False)
    assert kept_short == [] and kept_general == list(range(2, 300))
    assert st_short == st_general and (st_short.misses, st_short.complete) == (300, True)
    assert st_short.bytes_written == st_general.bytes_written > 0
    assert all(torch.equal(a, b) for a, b in zip(short, general, strict=True))
    det = Counted()
    back = CachedDataset(Numbers(300), det, path=tmp_path / "a")
    assert all(float(back[i][0]) == i for i in range(300)) and det.calls == []


def test_a_sample_that_cannot_be_stored_leaves_the_short_path_says_why_and_the_fill_goes_on(
        tmp_path: Path) -> None:
    class Unpicklable:
        def __init__(self) -> None:
            self.f = lambda: 0  # pickle refuses a lambda

    def det(i: int) -> Any:
        return Unpicklable() if i == 5 else torch.full((8,), float(i))

    ds = CachedDataset(Numbers(20), det, path=tmp_path / "c", fingerprint="f")
    [ds[i] for i in range(5)]
    assert ds._fill is not None
    with pytest.warns(RuntimeWarning, match="sample 5 .* cannot be stored"):
        assert isinstance(ds[5], Unpicklable)
    assert ds._fill is None
    values = [ds[i] for i in range(6, 20)]
    assert ds._fill is not None  # taken again from the next sample that could be stored
    assert all(float(v[0]) == i for i, v in zip(range(6, 20), values, strict=True))
    ds.flush()
    st = ds.stats()
    assert (st.misses, st.uncached, st.complete) == (20, 1, False)


def test_a_dataset_dropped_mid_fill_is_collected_its_writes_kept_and_counted(
        tmp_path: Path) -> None:
    """Nothing of the cache keeps a dataset the program dropped: once collected, its writer
    process has written what it held and ended, and its counters are published."""
    import gc
    import weakref

    ds = CachedDataset(Numbers(100), Counted(), path=tmp_path / "c")
    [ds[i] for i in range(100)]
    proc = _writer(ds)._proc
    counters = ds._tally.counters
    assert proc is not None and proc.poll() is None
    gone = weakref.ref(ds)
    del ds
    gc.collect()
    assert gone() is None
    assert proc.wait(10) == 0
    hits, misses, _, written, uncached = counters[:]
    assert (hits, misses, uncached) == (0, 100, 0) and written >= 100 * 64 * 4
    det = Counted()
    back = CachedDataset(Numbers(100), det, path=tmp_path / "c")
    assert all(float(back[i][0]) == i for i in range(100)) and det.calls == []


def test_a_dataset_in_a_reference_cycle_with_its_transform_is_collected(tmp_path: Path) -> None:
    """The transform a bound method of the object that holds the dataset (a cycle): once the
    program drops that object, the collector frees the dataset, its writer process ends and
    its counts are published, as without the cycle."""
    import gc
    import weakref

    class Pipeline:
        def __init__(self) -> None:
            self.ds = CachedDataset(Numbers(100), self.decode, path=tmp_path / "c",
                                    fingerprint="p")

        def decode(self, i: int) -> torch.Tensor:
            return torch.full((64,), float(i))

    pipe = Pipeline()
    [pipe.ds[i] for i in range(100)]
    proc = _writer(pipe.ds)._proc
    counters = pipe.ds._tally.counters
    assert proc is not None and proc.poll() is None
    gone = weakref.ref(pipe.ds)
    del pipe
    gc.collect()
    assert gone() is None
    assert proc.wait(10) == 0
    hits, misses, _, written, uncached = counters[:]
    assert (hits, misses, uncached) == (0, 100, 0) and written >= 100 * 64 * 4


def test_a_dataset_whose_length_raises_is_still_filled(tmp_path: Path) -> None:
    class NoLength(Numbers):
        def __len__(self) -> int:
            raise NotImplementedError("length unknown")

    ds = CachedDataset(NoLength(10), Counted(), path=tmp_path / "c", fingerprint="f")
    assert [float(ds.get_deterministic(i)[0]) for i in range(10)] == [float(i) for i in range(10)]
    ds.flush()
    assert ds._own_keys is None and ds.stats().uncached == 0


def test_a_store_that_holds_the_datasets_samples_is_looked_up(tmp_path: Path) -> None:
    first = CachedDataset(Numbers(50), Counted(), path=tmp_path / "c")
    [first[i] for i in range(0, 50, 2)]  # half of them
    first.flush()
    _writer(first).close()
    det = Counted()
    ds = CachedDataset(Numbers(50), det, path=tmp_path / "c")
    values = [ds[i] for i in range(50)]
    assert ds._own_keys is None  # the store held some: every sample is looked up
    assert det.calls == list(range(1, 50, 2))
    assert all(float(v[0]) == i for i, v in enumerate(values))


def test_the_writer_process_keeps_each_transaction_within_batch_bytes() -> None:
    import mmap

    ring_bytes = 4 * 2**20
    mem = mmap.mmap(-1, cache_child.HEADER_BYTES + ring_bytes)
    sample = 100 * 1024
    sizes = [sample] * 5 + [lmdb_env.BATCH_BYTES + 1, sample]
    at = 0
    for n, size in enumerate(sizes):  # records as the training side lays them out
        key = b"k%d" % n
        off = cache_child.HEADER_BYTES + at
        cache_child.RECORD.pack_into(mem, off, len(key), size)
        mem[off + cache_child.RECORD.size:off + cache_child.RECORD.size + len(key)] = key
        at += (cache_child.RECORD.size + len(key) + size + 7) & ~7
    ring = cache_child._Ring(mem, ring_bytes, None, 0, 0)
    batches = []
    while ring.consumed < at:
        ring.consumed, items = ring._batch(at)
        batches.append([len(v) for _, v in items])
    # out before a record would take it past BATCH_BYTES; a larger one alone
    assert batches == [[sample] * 2, [sample] * 2, [sample], [lmdb_env.BATCH_BYTES + 1],
                       [sample]]
    del ring
