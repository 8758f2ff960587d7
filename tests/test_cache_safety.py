"""The sample cache never serves stale or wrong data and never stops training: fingerprints
follow what a transform depends on and agree across runs; a store read before the DataLoader
forks its workers still works there; read-only stores are read, or passed through."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from redline.data import CachedDataset
from redline.data.fingerprint import transform_fingerprint


def _module(src: str, name: str = "user_transform") -> dict[str, Any]:
    """Define ``src`` as a module of the user's would be (its own file name and globals)."""
    ns: dict[str, Any] = {"__name__": name}
    exec(compile(src, f"{name}.py", "exec"), ns)
    return ns


def _fp(fn: Any) -> str:
    return transform_fingerprint(fn)[0]


def test_module_constants_and_helpers_change_the_fingerprint() -> None:
    base = "SIZE = 64\ndef helper(x):\n    return x * 2\ndef t(x):\n    return helper(x)[:SIZE]\n"
    a = _module(base)["t"]
    assert _fp(a) == _fp(_module(base)["t"])  # the same code, defined again: the same key
    assert _fp(a) != _fp(_module(base.replace("SIZE = 64", "SIZE = 32"))["t"])
    assert _fp(a) != _fp(_module(base.replace("x * 2", "x * 3"))["t"])


def test_closures_defaults_objects_and_partials_change_the_fingerprint() -> None:
    src = ("def make(k):\n    def t(x, bias=0):\n        return x * k + bias\n    return t\n"
           "class Resize:\n    def __init__(self, size):\n        self.size = size\n"
           "    def __call__(self, x):\n        return x[:self.size]\n"
           "def scale(x, factor):\n    return x * factor\n")
    m = _module(src)
    assert _fp(m["make"](2)) != _fp(m["make"](3))
    assert _fp(m["Resize"](64)) != _fp(m["Resize"](32))
    assert _fp(m["Resize"](64)) == _fp(_module(src)["Resize"](64))
    assert _fp(functools.partial(m["scale"], factor=2)) != _fp(
        functools.partial(m["scale"], factor=3))
    t = m["make"](2)
    t2 = m["make"](2)
    t2.__defaults__ = (1,)
    assert _fp(t) != _fp(t2)


COMPREHENSION = '''
import sys
sys.path.insert(0, {root!r})
from redline.data.fingerprint import transform_fingerprint
NORM = [0.5, 0.25]
def t(x):
    return [v / n for v, n in zip(x, NORM)] + [{{k: k for k in range(3)}}[1]]
print(transform_fingerprint(t)[0])
'''


def test_the_fingerprint_is_the_same_in_every_run() -> None:
    """A transform with comprehensions (nested code objects, whose repr holds an address)
    gets one fingerprint in every process, so a second run reuses the first run's samples."""
    root = str(Path(__file__).resolve().parents[1] / "src")
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "t.py"
        script.write_text(COMPREHENSION.format(root=root))
        runs = {subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                               check=True).stdout for _ in range(3)}
    assert len(runs) == 1 and len(runs.pop().strip()) == 16


def test_what_the_fingerprint_cannot_see_is_said_once(tmp_path: Path) -> None:
    handle = open(os.devnull, "rb")  # noqa: SIM115  (a dependency no fingerprint can read)
    try:
        t = _module("def make(f):\n    def t(x):\n        f.read(0)\n        return x\n"
                    "    return t\n")["make"](handle)
        _, unseen = transform_fingerprint(t)
        assert unseen and "closure variable 'f'" in unseen[0]
        with pytest.warns(RuntimeWarning, match=r"cannot see .*fingerprint='…'"):
            CachedDataset(Numbers(4), t, store=tmp_path / "c")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a given fingerprint: nothing to say
            CachedDataset(Numbers(4), t, store=tmp_path / "c", fingerprint="v1")
    finally:
        handle.close()


class Numbers(Dataset[torch.Tensor]):
    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((4,), float(i))


def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_a_store_read_before_the_workers_fork_works_in_them(tmp_path: Path) -> None:
    ds = CachedDataset(Numbers(), double, store=tmp_path / "c")
    assert float(ds[3][0]) == 6.0  # the main process opens the store first
    loader = DataLoader(ds, batch_size=8, num_workers=2,
                        multiprocessing_context=mp.get_context("fork"))
    for _ in range(2):  # twice: the second epoch reads what the workers stored
        assert torch.cat(list(loader))[:, 0].tolist() == [2.0 * i for i in range(64)]
    s = ds.stats()
    assert s.misses == 64 and s.hits == 1 + 64 and s.uncached == 0
    assert float(ds[5][0]) == 10.0  # and the main process still reads after the fork


def _as_nobody() -> None:
    """Lose the right to write the store (root writes anywhere: become nobody)."""
    if os.geteuid() == 0:
        os.setgid(65534)
        os.setuid(65534)


def _read(path: str, q: Any) -> None:
    _as_nobody()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = CachedDataset(Numbers(8), double, store=path)
        values = [float(ds[i][0]) for i in range(8)]
    q.put((values, ds.stats().hits, [str(w.message) for w in caught]))


def _in_child(path: Path) -> tuple[list[float], int, list[str]]:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_read, args=(str(path), q))
    p.start()
    out = q.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0
    return out  # type: ignore[no-any-return]


def test_a_read_only_store_is_read_and_an_empty_one_passes_through() -> None:
    root = Path(tempfile.mkdtemp(prefix="redline-ro-"))
    try:
        root.chmod(0o755)
        full = root / "filled"
        ds = CachedDataset(Numbers(8), double, store=full)
        for i in range(4):
            ds[i]
        del ds
        for p in (full, *full.iterdir()):
            p.chmod(0o555 if p.is_dir() else 0o444)
        root.chmod(0o555)
        values, hits, said = _in_child(full)
        assert values == [2.0 * i for i in range(8)] and hits == 4
        assert len(said) == 1 and "not writable" in said[0] and "are read" in said[0]
        values, hits, said = _in_child(root / "never-made")
        assert values == [2.0 * i for i in range(8)] and hits == 0
        assert len(said) == 1 and "holds no store to read" in said[0]
    finally:
        root.chmod(0o755)
        subprocess.run(["rm", "-rf", str(root)], check=False)


def test_stateless_objects_of_the_users_classes_are_seen() -> None:
    m = _module("class Flip:\n    def __call__(self, x):\n        return x.flip(0)\n")
    assert transform_fingerprint(m["Flip"]())[1] == []
    other = _module("class Flip:\n    def __call__(self, x):\n        return x.flip(1)\n")
    assert _fp(m["Flip"]()) != _fp(other["Flip"]())
    assert transform_fingerprint(lambda x: x.to(torch.float16))[1] == []


def test_tune_runs_on_a_cached_dataset(tmp_path: Path) -> None:
    """The tuner reads samples in the main process (probes, first batch) and then times
    loaders with workers: both over one store."""
    from torch import nn

    from redline.tune import TrainSetup, TuneConfig, tune

    class Pairs(Dataset[tuple[torch.Tensor, torch.Tensor]]):
        def __len__(self) -> int:
            return 256

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.full((8,), float(i % 7)), torch.tensor(i % 2)

    def scale(sample: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return sample[0] / 7, sample[1]

    def jitter(sample: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.002)  # the random tail, run on every access: the loop waits for data
        return sample

    def setup() -> TrainSetup:
        torch.manual_seed(0)
        m = nn.Linear(8, 2)
        ds = CachedDataset(Pairs(), scale, jitter, store=tmp_path / "cache")
        return TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                          loader=DataLoader(ds, batch_size=8),
                          loss_fn=lambda mm, b: nn.functional.cross_entropy(mm(b[0]), b[1]))

    cfg = TuneConfig(steps_per_trial=2, rounds=1, warmup_steps=1, loader_batches_per_trial=4,
                     tune_batch=False, tune_precision=False, tune_kernels=False, reuse=False,
                     store_dir=str(tmp_path / "plans"))
    res = tune(setup, cfg)
    assert res.before.steps >= 2 and res.after.steps >= 2
    loader = res.plan.decisions[0]
    assert loader.knob == "data pipeline" and "failed" not in loader.reason
    assert isinstance(loader.details["trials"], int) and loader.details["trials"] >= 2
    assert "workers" in str(loader.details["autotune"])


def _with_a_lock_at_3(i: torch.Tensor) -> Any:
    import threading

    k = int(i[0])
    return {"x": i, "lock": threading.Lock()} if k == 3 else i


def test_an_unpicklable_sample_is_named_and_passes_through(tmp_path: Path) -> None:
    ds = CachedDataset(Numbers(8), _with_a_lock_at_3, store=tmp_path / "c")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        first = [ds[i] for i in range(8)]
        ds.flush()
        second = [ds[i] for i in range(8)]
    msgs = [str(w.message) for w in said]
    assert len(msgs) == 1 and "sample 3 (a dict) cannot be stored" in msgs[0]
    assert "lock" in msgs[0] and "pass through uncached" in msgs[0]
    for got in (first, second):
        assert isinstance(got[3], dict) and float(got[3]["x"][0]) == 3.0
        assert [float(got[i][0]) for i in range(8) if i != 3] == [i for i in range(8) if i != 3]
    st = ds.stats()
    assert (st.hits, st.misses, st.uncached) == (7, 9, 2)  # the other seven were cached


def test_a_stored_sample_that_cannot_be_read_back_is_computed_again(tmp_path: Path) -> None:
    ds = CachedDataset(Numbers(8), double, store=tmp_path / "c")
    ds.store.put_many([(ds._prefix + b"2", b"P1not a pickle")])
    with pytest.warns(RuntimeWarning, match="stored sample 2 cannot be read back"):
        assert float(ds[2][0]) == 4.0
        assert torch.cat(ds.__getitems__([1, 2]))[::4].tolist() == [2.0, 4.0]
    assert float(ds[1][0]) == 2.0


@pytest.mark.slow
def test_spawned_workers_read_and_count(tmp_path: Path) -> None:
    """A loader whose workers are spawned (``multiprocessing_context="spawn"``, the default
    on macOS): the dataset crosses into them pickled, counters and all."""
    ds = CachedDataset(Numbers(32), double, store=tmp_path / "c")
    loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="spawn")
    for _ in range(2):
        assert torch.cat(list(loader))[:, 0].tolist() == [2.0 * i for i in range(32)]
    s = ds.stats()
    assert (s.misses, s.hits, s.uncached) == (32, 32, 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_knows_its_own_process_id() -> None:
    """The cache's per-sample paths read the process id from a value renewed at fork: a child
    that kept its parent's would use the parent's writer thread and store handles."""
    from redline.data.stores import process_id

    assert process_id() == os.getpid()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's exit handlers
        os.write(w, f"{process_id()} {os.getpid()}".encode())
        os._exit(0)
    os.close(w)
    got = os.read(r, 64).decode().split()
    os.waitpid(pid, 0)
    os.close(r)
    assert got[0] == got[1] == str(pid)
