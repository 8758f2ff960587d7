"""CachedDataset (LMDB, node-local): hits and misses, the random tail re-run, concurrent
writers, a writer killed mid-write, a full store / full disk, a stale fingerprint."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from redline.data import CachedDataset, cache_proc


class Numbers(Dataset[int]):
    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def square(i: int) -> torch.Tensor:
    return torch.full((16,), float(i * i))


def cube(i: int) -> torch.Tensor:
    return torch.full((16,), float(i ** 3))


def test_hits_misses_and_random_tail(tmp_path: Path) -> None:
    calls: list[int] = []

    def det(i: int) -> torch.Tensor:
        calls.append(i)
        return square(i)

    ds = CachedDataset(Numbers(8), det, lambda t: t + torch.rand(1), path=tmp_path / "c")
    a = [ds[i] for i in range(8)]
    b = [ds[i] for i in range(8)]
    assert calls == list(range(8))  # computed once per sample
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert torch.allclose(x.floor(), torch.full((16,), float(i * i)))
        assert not torch.equal(x, y)  # the random tail ran again
    st = ds.stats()
    assert (st.hits, st.misses, st.uncached) == (8, 8, 0)
    assert st.bytes_written > 0 and st.bytes_read == st.bytes_written


def _fill(path: str, rank: int) -> None:
    ds = CachedDataset(Numbers(64), square, path=path)
    for _ in range(2):  # two epochs, two workers each
        for _ in DataLoader(ds, batch_size=4, num_workers=2, shuffle=True):
            pass



@pytest.mark.slow
def test_persistent_workers_hold_nothing_back_and_stats_are_current_each_epoch(
        tmp_path: Path) -> None:
    """Workers kept between epochs: after the first epoch every sample is stored (none is
    computed again later, whichever worker reads it) and stats() counts what the workers did
    while they still live."""
    ds = CachedDataset(Numbers(200), square, path=tmp_path / "c")
    loader = DataLoader(ds, batch_size=8, num_workers=2, shuffle=True, persistent_workers=True)
    seen = []
    for _ in range(3):
        seen.append(sorted(int(x[0].item()) for b in loader for x in b))
        st = ds.stats()
        assert st.hits + st.misses == 200 * len(seen)  # published before the epoch's end
    assert seen == [[i * i for i in range(200)]] * 3
    assert (st.misses, st.hits, st.uncached) == (200, 400, 0)  # computed once each


@pytest.mark.slow
def test_after_a_worker_epoch_the_main_process_reads_what_the_workers_stored(
        tmp_path: Path) -> None:
    """A few reads in the main process (its writer process starts, and the samples it never
    handed over are taken as not stored), an epoch through forked workers that store the
    rest, then an epoch in the main process (an evaluation pass): nothing is computed
    again."""
    calls: list[int] = []

    def det(i: int) -> torch.Tensor:
        calls.append(i)  # (the main process's calls only: a worker's list is its own)
        return square(i)

    ds = CachedDataset(Numbers(300), det, path=tmp_path / "c")
    for i in range(10):
        ds[i]
    for _ in DataLoader(ds, batch_size=16, num_workers=2):
        pass
    assert ds.stats().misses == 300
    del calls[:]
    assert all(torch.equal(ds[i], square(i)) for i in range(300))
    assert calls == [] and ds.stats().hits == 10 + 300  # (the workers read the first 10)

@pytest.mark.slow
def test_two_processes_with_two_workers_fill_one_store(tmp_path: Path) -> None:
    path = str(tmp_path / "c")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_fill, args=(path, r)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    ds = CachedDataset(Numbers(64), square, path=path)
    for i in range(64):
        assert torch.equal(ds[i], square(i))
    assert ds.stats().hits == 64 and ds.stats().misses == 0  # every sample stored, once


def _die_mid_write(path: str, key: bytes) -> None:
    import lmdb

    env = lmdb.open(path, map_size=2**24)
    txn = env.begin(write=True)
    txn.put(key, b"half-written")
    os.kill(os.getpid(), signal.SIGKILL)  # killed before commit


@pytest.mark.slow
def test_writer_killed_mid_write_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "c"
    ds = CachedDataset(Numbers(8), square, path=path, max_bytes=2**24)
    ds[0]
    ds.flush()  # written now (computed samples are otherwise written 32 at a time)
    key = ds._prefix + b"1"
    # spawn: a fresh interpreter (LMDB refuses a second handle on one path in a process)
    p = mp.get_context("spawn").Process(target=_die_mid_write, args=(str(path), key))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    fresh = CachedDataset(Numbers(8), square, path=path, max_bytes=2**24)
    assert torch.equal(fresh[1], square(1))  # recomputed, not the half-written bytes
    assert torch.equal(fresh[0], square(0))
    assert fresh.stats().hits == 1 and fresh.stats().misses == 1  # and the store still writes
    assert torch.equal(fresh[1], square(1)) and fresh.stats().hits == 2


def test_full_store_warns_once_and_passes_through(tmp_path: Path) -> None:
    big = CachedDataset(Numbers(64), lambda i: torch.zeros(50_000) + i, path=tmp_path / "c",
                        max_bytes=2**20)  # 1 MiB holds only a few 200 KB samples
    with pytest.warns(RuntimeWarning, match="fill-once policy") as rec:
        out = [big[i] for i in range(64)]
        big.flush()  # writes are in the background: the refusal is known by now at the latest
    assert len(rec) == 1
    assert all(float(o[0]) == i for i, o in enumerate(out))  # values right, cached or not
    st = big.stats()
    assert st.uncached > 0 and st.misses == 64


def test_disk_full_error_passes_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The store replaced in this process: the writer thread's path (the writer process's own
    # failures: tests/test_cache_proc.py).
    monkeypatch.setattr(cache_proc, "available", lambda: False)
    ds = CachedDataset(Numbers(8), square, path=tmp_path / "c")

    class FullDiskTxn:
        def __enter__(self) -> FullDiskTxn:
            return self

        def __exit__(self, *a: object) -> None:
            return None

        def get(self, key: bytes) -> None:
            return None

        def abort(self) -> None:
            return None

        def put(self, *a: object, **k: object) -> None:
            raise OSError(28, "No space left on device")

    class FullDiskEnv:
        def begin(self, **kw: object) -> FullDiskTxn:
            return FullDiskTxn()

    monkeypatch.setattr(ds.store, "_open", lambda: FullDiskEnv())
    with pytest.warns(RuntimeWarning, match="No space left on device"):
        assert torch.equal(ds[3], square(3))
        ds.flush()  # the write, batched, happens here
    assert torch.equal(ds[4], square(4)) and ds.stats().uncached == 2


def test_changed_transform_never_serves_stale_samples(tmp_path: Path) -> None:
    path = tmp_path / "c"
    a = CachedDataset(Numbers(8), square, path=path)
    assert [float(a[i][0]) for i in range(8)] == [i * i for i in range(8)]
    b = CachedDataset(Numbers(8), cube, path=path)  # same store, new pipeline
    assert a.fingerprint != b.fingerprint
    assert [float(b[i][0]) for i in range(8)] == [i ** 3 for i in range(8)]
    assert b.stats().hits == 0
    c = CachedDataset(Numbers(9), square, path=path)  # the dataset changed (length)
    assert c.fingerprint != a.fingerprint
    assert CachedDataset(Numbers(8), square, path=path).fingerprint == a.fingerprint


def test_bad_size() -> None:
    with pytest.raises(ValueError, match="at least 1 MiB"):
        CachedDataset(Numbers(), square, max_bytes=100)


def test_cache_statistics_reach_the_report(tmp_path: Path) -> None:
    import jsonschema

    import redline
    from redline.report.json_io import schema, to_dict

    ds = CachedDataset(Numbers(32), square, path=tmp_path / "c")
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(ds, batch_size=8)
    with redline.watch(warmup_steps=1, count_flops=False) as w:
        for _ in range(2):
            for x in loader:
                model(x).sum().backward()
                opt.step()
    rep = w.report(show=False)
    (li,) = rep.measurements.loaders
    assert li.cache is not None
    assert (li.cache["hits"], li.cache["misses"], li.cache["hit_rate"]) == (32, 32, 0.5)
    jsonschema.validate(to_dict(rep), schema())


class Boxes(torch.Tensor):
    """A tensor subclass with metadata, as torchvision's ``tv_tensors.BoundingBoxes``."""

    format: str


def _boxes(scale: float = 1.0) -> Boxes:
    b = torch.tensor([[0.0, 0.0, 10.0, 10.0]]).mul(scale).as_subclass(Boxes)
    b.format = "XYXY"
    return b


@pytest.mark.parametrize("value", [
    torch.arange(12, dtype=torch.uint8).view(2, 2, 3), torch.randn(3, 4),
    torch.randn(5).to(torch.bfloat16), torch.arange(4, dtype=torch.int64),
    torch.empty(0, 3), torch.tensor(3.5), torch.randn(4, 6)[:, ::2],
    {"image": [1, 2], "label": "cat"},
    (torch.randn(3, 8, 8), 7), [torch.randn(4, 6)[:, ::2], torch.empty(0), "x"],
    {"img": torch.randn(2, 2).to(torch.bfloat16), "mask": torch.ones(3, dtype=torch.bool),
     "nested": (torch.arange(3), {"k": torch.tensor(2.5)}), "label": 1},
    (torch.nn.Parameter(torch.ones(2)), torch.ones(2, requires_grad=True)),
    # alone, too: what the raw form would drop (the type and its attributes, the flag, the
    # scale and zero point) comes back
    torch.nn.Parameter(torch.ones(2)), torch.ones(2, requires_grad=True), _boxes(),
    torch.quantize_per_tensor(torch.tensor([0.5, -1.0, 2.0]), 0.1, 3, torch.qint8),
    # dense in another order than C's: stored as they lie, decoded with the same strides
    torch.randn(8, 6, 3).permute(2, 0, 1), torch.randn(2, 3, 4, 5).to(
        memory_format=torch.channels_last), torch.randn(5, 7).t(),
    torch.randn(4, 5).to(torch.bfloat16).t(), (torch.randn(6, 4, 3).permute(2, 0, 1), 1),
    torch.randn(4, 1, 3).permute(1, 2, 0), torch.randn(6, 4, 3).permute(2, 0, 1)[:, ::2],
    # read from the data pointer: a view that starts inside its storage, a dimension of size 1
    # with a stride no C tensor has, and views whose memory holds other numbers than they read
    # as (a negative bit on a real tensor, a conjugate bit): the last two take the general path
    torch.arange(10.0)[3:7], torch.arange(20.0).as_strided((1, 4), (100, 1)),
    torch.randn(3, dtype=torch.cfloat).conj().imag, torch.randn(3, dtype=torch.cfloat).conj(),
])
def test_encode_decode_round_trip(value: object) -> None:
    from redline.data.sample_codec import decode, encode

    blob = encode(value)
    if isinstance(value, tuple | list | dict) and "tensor(" in repr(value) and (
            "Parameter" not in repr(value)):
        assert blob[:2] == b"S2"  # tensors in a structure stored raw, not through torch.save
    for b in (blob, memoryview(blob)):  # LMDB hands out views into its map
        _same_value(decode(b), value)



def test_a_subclass_comes_back_from_the_store_with_its_type_and_attributes(
        tmp_path: Path) -> None:
    """A v2 transform treats a ``tv_tensors`` sample by its type: a hit must be the sample
    the miss returned, not a plain tensor of the same numbers."""
    ds = CachedDataset(Numbers(2), lambda x: _boxes(x), path=tmp_path / "c",
                       fingerprint="boxes")
    miss = ds[1]
    ds.flush()
    hit = ds[1]
    assert ds.stats().hits == 1
    assert type(hit) is Boxes and hit.format == "XYXY" and torch.equal(hit, miss)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_reads_the_same_store_and_counts_its_own_reads(tmp_path: Path, how: str) -> None:
    """``copy.deepcopy`` (a validation copy) and a pickle kept or sent elsewhere work: the
    copy reads what the original stored, counted from zero, apart from the original's."""
    import copy
    import pickle

    ds = CachedDataset(Numbers(4), square, path=tmp_path / "c")
    for i in range(4):
        ds[i]
    twin = copy.deepcopy(ds) if how == "deepcopy" else pickle.loads(pickle.dumps(ds))
    assert all(torch.equal(twin[i], square(i)) for i in range(4))
    assert (twin.stats().hits, twin.stats().misses) == (4, 0)
    assert (ds.stats().hits, ds.stats().misses) == (0, 4)
    twin[1]
    assert twin.stats().hits == 5 and ds.stats().hits == 0


def test_indices_are_integers_of_any_kind_and_a_float_is_refused(tmp_path: Path) -> None:
    """What samplers give (ints, numpy integers, one-element integer tensors) is one index;
    a float is refused, not cut to another sample's index."""
    import numpy as np

    ds = CachedDataset(Numbers(8), square, path=tmp_path / "c")
    for i in (3, np.int64(3), torch.tensor(3), torch.tensor([3])):
        assert torch.equal(ds[i], square(3))
    assert [t[0].item() for t in ds.__getitems__([np.int32(2), torch.tensor(5)])] == [4, 25]
    assert (ds.stats().misses, ds.stats().hits) == (3, 3)
    for bad in (2.7, torch.tensor(2.7), "3"):
        with pytest.raises(TypeError, match="CachedDataset indexes samples by integer"):
            ds[bad]

def test_a_negative_index_is_the_sample_it_stands_for(tmp_path: Path) -> None:
    """ds[-1] is ds[len - 1], as a list reads it: one sample computed and stored once."""
    calls: list[int] = []

    def det(i: int) -> torch.Tensor:
        calls.append(i)
        return square(i)

    ds = CachedDataset(list(range(8)), det, path=tmp_path / "c")
    assert torch.equal(ds[-1], square(7)) and torch.equal(ds[7], square(7))
    assert [t[0].item() for t in ds.__getitems__([-2, 0])] == [36, 0]
    assert torch.equal(ds[6], square(6))
    assert calls == [7, 6, 0]
    assert (ds.stats().misses, ds.stats().hits) == (3, 2)
    with pytest.raises(IndexError):
        ds[-9]  # past the start: the dataset says so
    for i in range(8):
        ds[i]
    assert ds.stats().complete


def test_a_tensor_without_storage_is_refused_and_teaches_no_layout() -> None:
    from redline.data.sample_codec import decode, encode

    with pytest.raises(RuntimeError):  # the dataset says so once and passes it through
        encode(torch._efficientzerotensor(5))
    for _ in range(2):  # the same dtype, shape and strides still take the raw path
        blob = encode(torch.ones(5))
        assert blob[:2] == b"T1" and torch.equal(decode(blob), torch.ones(5))


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t`` is a permutation of a C-contiguous tensor (no gaps)."""
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    return t.permute(order).is_contiguous()


def _same_value(got: object, value: object) -> None:
    assert type(got) is type(value)
    if isinstance(value, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert got.dtype == value.dtype and got.shape == value.shape
        assert got.requires_grad == value.requires_grad
        assert getattr(got, "format", None) == getattr(value, "format", None)
        if value.is_quantized:
            assert (got.q_scale(), got.q_zero_point()) == (value.q_scale(), value.q_zero_point())
            got, value = got.dequantize(), value.dequantize()
        assert torch.equal(got.detach(), value.detach())
        if _dense(value):  # the same strides (a dimension of size 1 has any)
            assert [st for st, n in zip(got.stride(), got.shape, strict=True) if n > 1] == [
                st for st, n in zip(value.stride(), value.shape, strict=True) if n > 1]
        else:
            assert got.is_contiguous()
        if got.numel() and not got.requires_grad:
            got.zero_()  # writable, owns its memory
    elif isinstance(value, tuple | list):
        assert isinstance(got, tuple | list) and len(got) == len(value)
        for g, v in zip(got, value, strict=True):
            _same_value(g, v)
    elif isinstance(value, dict):
        assert isinstance(got, dict) and list(got) == list(value)
        for k in value:
            _same_value(got[k], value[k])
    else:
        assert got == value


def test_a_store_of_another_format_is_not_read(tmp_path: Path) -> None:
    from redline.data.sample_codec import encode

    ds = CachedDataset(Numbers(4), square, path=tmp_path / "c")
    old_key = ds.fingerprint.encode() + b":" + b"2"  # the key before formats were versioned
    ds.store.put_many([(old_key, encode(torch.zeros(16)))])
    assert torch.equal(ds[2], square(2)) and ds.stats().misses == 1


def test_a_miss_renews_its_snapshot_after_our_own_write_or_once_it_is_old(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from redline.data import stores

    mine = stores.LmdbStore(tmp_path / "s", 2**24)
    other = stores.LmdbStore(tmp_path / "s", 2**24)  # its writes are not counted by `mine`
    assert mine.get(b"a") is None  # the snapshot begins here
    other.put_many([(b"a", b"1")])
    # a fill epoch's misses: believed for SNAPSHOT_S, no new transaction each
    began = mine._txn_began
    assert mine.get(b"a") is None and mine._txn_began == began
    mine.put_many([(b"b", b"2")])  # our own write is never missed
    assert mine.get(b"d") is None and mine._txn_began == began  # nor waited for elsewhere
    assert bytes(mine.get(b"b") or b"") == b"2" and mine._txn_began > began
    began = mine._txn_began
    mine.put_many([(b"e", b"5")])
    assert [bytes(v or b"") for v in mine.get_many([b"d", b"e"])] == [b"", b"5"]
    assert mine._txn_began > began
    other.put_many([(b"c", b"3")])
    assert mine.get(b"c") is None
    monkeypatch.setattr(stores, "SNAPSHOT_S", 0.0)  # the snapshot is now old: look again
    assert bytes(mine.get(b"c") or b"") == b"3"
    assert [bytes(v or b"") for v in mine.get_many([b"a", b"c"])] == [b"1", b"3"]


def test_the_process_that_makes_the_dataset_loads_lmdb_for_its_forked_workers(
        tmp_path: Path) -> None:
    """Made before any read, the dataset has already loaded lmdb: a DataLoader's forked
    workers inherit it instead of loading it each epoch."""
    import subprocess
    import sys

    code = ("import sys; from redline.data import CachedDataset; "
            f"CachedDataset(list(range(4)), abs, path={str(tmp_path / 'c')!r}, "
            "fingerprint='f'); print('lmdb' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr
