"""Where the sample store lives: it never fills /dev/shm past a safe share of its free space
(the default goes to disk when /dev/shm is small, said once), and a store redline made in
memory is removed by the last process using it, or, left by a killed run, by the next run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from redline.data import CachedDataset, store_place
from redline.data.stores import LmdbStore

SRC = str(Path(__file__).resolve().parents[1] / "src")
MiB = 2**20


class Numbers(Dataset[int]):
    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def big(i: int) -> torch.Tensor:
    return torch.full((50_000,), float(i))  # 200 KB a sample


def small(i: int) -> torch.Tensor:
    return torch.full((4,), float(i))


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /dev/shm (a real folder) and a cache folder on "disk"."""
    d = tmp_path / "shm"
    d.mkdir()
    monkeypatch.setattr(store_place, "SHM_DIR", str(d))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "disk"))
    return d


def test_a_small_dev_shm_sends_the_default_store_to_disk(
        shm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = store_place.default_placement(8 * 2**30, free=lambda _: 64 * MiB)  # Docker's default
    assert p.path == tmp_path / "disk" / "redline" / "redline-cache" and not p.ephemeral
    assert p.note is not None and "64 MiB free" in p.note and str(p.path) in p.note
    roomy = store_place.default_placement(8 * 2**30, free=lambda _: 4 * 2**30)
    assert roomy.path == shm / "redline-cache" and roomy.ephemeral and roomy.note is None
    # a dataset made without store= says so once and trains from disk
    monkeypatch.setattr(store_place, "free_bytes",
                        lambda path: 64 * MiB if path.startswith(str(shm)) else 50 * 2**30)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        a = CachedDataset(Numbers(8), small)
        b = CachedDataset(Numbers(8), small, max_bytes=2**30)
    assert len([w for w in said if "on disk" in str(w.message)]) == 1
    assert a.path == b.path == tmp_path / "disk" / "redline" / "redline-cache"
    assert [float(a[i][0]) for i in range(8)] == [float(i) for i in range(8)]
    a.flush()
    assert a.path is not None and (a.path / "data.mdb").is_file() and not any(shm.iterdir())


def test_a_store_never_takes_more_than_its_share_of_free_space(tmp_path: Path) -> None:
    free = 8 * MiB  # what a nearly full tmpfs has left
    store = LmdbStore(tmp_path / "c", 2**30, free=lambda _: free)
    assert store.max_bytes == int(store_place.SAFE_FRACTION * free)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ds = CachedDataset(Numbers(64), big, store=store)
        out = [float(ds[i][0]) for i in range(64)]  # 12.8 MB of samples
        ds.flush()
    assert out == [float(i) for i in range(64)]  # right, cached or not
    msgs = [str(w.message) for w in said]
    assert sum("holds at most 4.0 MiB" in m for m in msgs) == 1
    assert sum("fill-once policy" in m for m in msgs) == 1
    assert store_place.store_bytes(tmp_path / "c") <= store.max_bytes + 64 * 1024
    assert 0 < ds.stats().uncached < 64
    # a filesystem with almost nothing left: read-only, nothing written
    tiny = LmdbStore(tmp_path / "t", 2**30, free=lambda _: MiB)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        t = CachedDataset(Numbers(4), small, store=tiny)
        assert float(t[3][0]) == 3.0
    msgs = [str(w.message) for w in said]
    assert len(msgs) == 1, msgs  # not also "holds at most 0.5 MiB": it holds none
    assert "too little free space" in msgs[0] and "pass through uncached" in msgs[0]
    assert not (tmp_path / "t").exists()  # nothing left behind
    # a folder that cannot be made says so, not that its filesystem is full
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        t = CachedDataset(Numbers(4), small, store=blocker / "c")
        assert float(t[3][0]) == 3.0
    msgs = [str(w.message) for w in said]
    assert len(msgs) == 1 and f"{blocker / 'c'} cannot be made" in msgs[0], msgs


CHILD = '''
import os, signal, sys
sys.path.insert(0, {src!r})
import torch
from torch.utils.data import DataLoader
from redline.data import CachedDataset, store_place
store_place.SHM_DIR = {shm!r}
class Numbers:
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return i
def small(i):
    return torch.full((4,), float(i))
ds = CachedDataset(Numbers(), small, fingerprint="v1")
for _ in DataLoader(ds, batch_size=8, num_workers=2):
    pass
ds.flush()
assert (ds.path / "data.mdb").is_file()
print(ds.path, flush=True)
how = sys.argv[1]
if how == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
elif how == "wait":
    sys.stdin.readline()
'''


def _child(shm: Path, how: str, tmp_path: Path) -> subprocess.Popen[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(src=SRC, shm=str(shm)))
    return subprocess.Popen([sys.executable, str(script), how], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_the_last_process_using_a_memory_store_removes_it(shm: Path, tmp_path: Path) -> None:
    p = _child(shm, "exit", tmp_path)
    out, _ = p.communicate(timeout=180)
    assert p.returncode == 0 and out.strip() == str(shm / "redline-cache")
    assert not (shm / "redline-cache").exists()  # nothing left in memory


@pytest.mark.slow
def test_a_store_left_by_a_killed_run_is_removed_and_a_live_one_kept(
        shm: Path, tmp_path: Path) -> None:
    p = _child(shm, "killed", tmp_path)
    p.communicate(timeout=180)
    assert p.returncode == -signal.SIGKILL
    left = shm / "redline-cache"
    assert (left / "data.mdb").is_file()  # what a SIGKILL leaves
    tune_left = shm / "redline-tune-cache-abc"
    store_place.mark_ephemeral(tune_left)
    (tune_left / "data.mdb").write_bytes(b"x" * 1000)
    users = shm / "redline-mine"  # not redline's to remove: no marker
    users.mkdir()
    gone = store_place.sweep(shm)
    assert sorted(gone) == sorted([str(left), str(tune_left)])
    assert not left.exists() and not tune_left.exists() and users.exists()
    # a store a live process uses is kept, and joined
    live = _child(shm, "wait", tmp_path)
    assert live.stdout is not None
    assert live.stdout.readline().strip() == str(left)
    try:
        assert store_place.sweep(shm) == [] and (left / "data.mdb").is_file()
        ds = CachedDataset(Numbers(64), small, fingerprint="v1")
        assert ds.path == left and float(ds[5][0]) == 5.0
        assert ds.stats().hits == 1  # the live run's sample
    finally:
        live.communicate("\n", timeout=60)
    assert left.exists()  # this process still uses it
    assert store_place.release(left) and not left.exists()


@pytest.mark.slow
def test_a_leftover_store_is_emptied_by_the_next_process_that_leases_it(
        shm: Path, tmp_path: Path) -> None:
    p = _child(shm, "killed", tmp_path)
    p.communicate(timeout=180)
    left = shm / "redline-cache"
    assert (left / "data.mdb").is_file()
    ds = CachedDataset(Numbers(64), small, store=left, fingerprint="v1")  # named: no sweep
    assert float(ds[5][0]) == 5.0 and ds.stats().hits == 0  # the dead run's data is gone
    assert store_place.release(left) and not left.exists()
    assert os.listdir(shm) == []


def _mapped(folder: Path) -> bool:
    """Whether this process maps a file of ``folder`` (a removed one included)."""
    return str(folder / "data.mdb") in Path("/proc/self/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_a_store_folder_removed_and_made_anew_is_read_as_the_new_one(tmp_path: Path) -> None:
    """A notebook clears its cache (``rm -rf`` the folder) and makes the dataset again: the new
    dataset reads the new folder, never the removed one's samples, and the removed file
    leaves this process's memory once the datasets that used it are gone."""
    import gc
    import shutil

    folder = tmp_path / "c"
    old = CachedDataset(Numbers(4), lambda i: torch.tensor([float(i)]), store=folder,
                        fingerprint="v1")
    assert [old[i].item() for i in range(4)] == [0.0, 1.0, 2.0, 3.0]
    old.flush()
    shutil.rmtree(folder)
    # the transform changed in a way its fingerprint cannot see: the folder was cleared for it
    new = CachedDataset(Numbers(4), lambda i: torch.tensor([100.0 * i]), store=folder,
                        fingerprint="v1")
    assert [new[i].item() for i in range(4)] == [0.0, 100.0, 200.0, 300.0]
    assert new.stats().misses == 4
    assert old[1].item() == 1.0  # the old dataset keeps its own (removed) store meanwhile
    new.flush()
    assert _mapped(folder)
    del old, new
    gc.collect()
    assert not _mapped(folder)
