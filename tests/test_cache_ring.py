"""The fill's per-sample hand-over (redline.data.cache_ring): the compiled ring and the Python
one take the same tensors, refuse the same ones (the caller then encodes them), write the same
bytes where they go, and a fill through either stores every sample as computed."""

from __future__ import annotations

import gc
import mmap
import shutil
import sysconfig
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from factories import Numbers
from redline.data import CachedDataset, cache_child, cache_proc, cache_ring, sample_codec
from redline.data.sample_codec import LAYOUTS, decode, encode, fast_parts

KINDS = ["compiled", "python"] if cache_ring.COMPILED else ["python"]

HEADER = 64
RING = 4096


def _ring(kind: str, *, window: int = RING, batch: int = 4, send: int = 10**9,
          mem: Any = None) -> tuple[cache_ring.Ring, bytearray]:
    ring = cache_ring.new_ring(RING, window, HEADER, send, batch, compiled=kind == "compiled")
    buf = bytearray(HEADER + RING) if mem is None else mem
    ring.hold(buf)
    return ring, buf


def _records(buf: bytearray, start: int, end: int) -> list[tuple[bytes, bytes]]:
    """(key, value) of the records from ``start`` to ``end`` (no wrap in these tests)."""
    out, at = [], start
    while at < end:
        k, n = cache_child.RECORD.unpack_from(buf, HEADER + at)
        v0 = HEADER + at + 8 + k
        out.append((bytes(buf[v0 - k:v0]), bytes(buf[v0:v0 + n])))
        at += (8 + k + n + 7) & ~7
    return out


def _learned(t: torch.Tensor) -> torch.Tensor:
    fast_parts(t)  # what the caller's first encode of a layout does
    return t


def _complex_conj() -> torch.Tensor:
    return torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj()


REFUSED: dict[str, Callable[[], Any]] = {
    "not dense (a slice with gaps)": lambda: _learned(torch.arange(12.0).reshape(3, 4)[:, ::2]),
    "its negative bit set": lambda: _learned(
        torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj().imag),
    "its conjugate bit set": _complex_conj,
    "requiring grad": lambda: _learned(torch.ones(5)).requires_grad_(),
    "a subclass": lambda: torch.nn.Parameter(_learned(torch.ones(5)), requires_grad=False),
    "bfloat16": lambda: _learned(torch.ones(5, dtype=torch.bfloat16)),
    "sparse (no strides)": lambda: torch.eye(3).to_sparse(),
    "on the meta device": lambda: torch.ones(5, device="meta"),
    "quantized": lambda: torch.quantize_per_tensor(_learned(torch.ones(5)), 0.1, 0, torch.qint8),
    "a numpy array": lambda: np.ones(5, dtype=np.float32),
    "a tuple of tensors": lambda: (torch.ones(5),),
    "no values": lambda: torch.ones(0),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("what", list(REFUSED))
def test_what_the_general_path_must_encode_is_not_taken(kind: str, what: str) -> None:
    ring, buf = _ring(kind)
    value = REFUSED[what]()
    assert ring.put(b"k", value) == 0
    assert (ring.end, ring.unsettled) == (0, []) and not any(buf)


TAKEN: dict[str, Callable[[], torch.Tensor]] = {
    "float32, C order": lambda: torch.randn(3, 5, 4),
    "channels last (dense in another order)": lambda: torch.randn(2, 3, 4, 5).to(
        memory_format=torch.channels_last),
    "a transposed view": lambda: torch.randn(6, 4).t(),
    "a slice of a larger storage": lambda: torch.randn(10, 7)[3:6],
    "int64": lambda: torch.arange(9).reshape(3, 3),
    "bool": lambda: torch.tensor([True, False, True]),
    "uint8 scalar": lambda: torch.tensor(7, dtype=torch.uint8),
    "complex without the conjugate bit": lambda: torch.tensor([1 + 2j, -3j]),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("what", list(TAKEN))
def test_a_known_layout_is_copied_as_its_stored_form(kind: str, what: str) -> None:
    t = TAKEN[what]()
    LAYOUTS.pop((t.dtype, t.shape, t.stride()), None)  # its layout learnt at its first put
    ring, buf = _ring(kind)
    assert ring.put(b"key-1", t) == 1
    assert ring.unsettled == [b"key-1"] and ring.end % 8 == 0
    [(key, value)] = _records(buf, 0, ring.end)
    assert key == b"key-1" and value == encode(t)  # the caller's encode, byte for byte
    back = decode(value)
    assert type(back) is torch.Tensor and back.dtype == t.dtype and torch.equal(back, t)
    assert back.stride() == t.stride()


@pytest.mark.parametrize("kind", KINDS)
def test_the_end_is_due_after_a_batch_or_its_bytes(kind: str) -> None:
    t = _learned(torch.ones(4))
    ring, _ = _ring(kind, batch=3)
    assert [ring.put(b"%d" % i, t) for i in range(3)] == [1, 1, 2]
    ring.sent, ring.unsettled = ring.end, []  # what ProcessWriter._send does
    assert ring.put(b"x", t) == 1
    need = (8 + 1 + len(encode(t)) + 7) & ~7  # one record's bytes
    by_bytes, _ = _ring(kind, send=need + 1)
    assert [by_bytes.put(b"%d" % i, t) for i in range(3)] == [1, 2, 2]


@pytest.mark.parametrize("kind", KINDS)
def test_a_record_past_the_window_or_the_room_is_left_to_the_caller(kind: str) -> None:
    t = _learned(torch.ones(64))  # a record of 8 + 1 + 256 + header bytes
    need = (8 + 1 + len(encode(t)) + 7) & ~7
    ring, _ = _ring(kind, window=2 * need)
    assert [ring.put(b"a", t), ring.put(b"b", t), ring.put(b"c", t)] == [1, 1, 0]
    assert ring.end == 2 * need
    full, _ = _ring(kind)
    full.end, full.consumed = RING, 0  # a lap ahead of the writer process: no room
    assert full.put(b"a", t) == 0 and full.end == RING


@pytest.mark.parametrize("kind", KINDS)
def test_a_ring_not_holding_its_map_takes_nothing(kind: str) -> None:
    t = _learned(torch.ones(4))
    ring = cache_ring.new_ring(RING, RING, HEADER, 10**9, 4, compiled=kind == "compiled")
    assert ring.put(b"a", t) == 0
    buf = bytearray(HEADER + RING)
    ring.hold(buf)
    with pytest.raises(RuntimeError, match="held already"):
        ring.hold(buf)
    assert ring.put(b"a", t) == 1
    ring.release()
    ring.release()  # twice is fine (close after a lost writer process)
    assert ring.put(b"b", t) == 0 and ring.unsettled == [b"a"]
    with pytest.raises(ValueError, match="holds 100 bytes"):
        ring.hold(bytearray(100))


@pytest.mark.skipif(not cache_ring.COMPILED, reason="the compiled ring is not built here")
def test_the_compiled_ring_refuses_what_would_corrupt_it() -> None:
    ring, buf = _ring("compiled")
    with pytest.raises(TypeError):
        ring.put("a str key", torch.ones(2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a list"):
        ring.unsettled = None  # type: ignore[assignment]
    with pytest.raises(TypeError, match="must be a list"):
        del ring.unsettled
    with pytest.raises(OverflowError):
        ring.end = -48  # a position before the ring (in its header, or before the buffer)
    ring.consumed = RING * 5  # past the end: refused, not written anywhere
    assert ring.put(b"a", _learned(torch.ones(2))) == 0 and not any(buf)
    with pytest.raises(ValueError):
        cache_ring.new_ring(RING, RING + 8, HEADER, 1, 1, compiled=True)
    with pytest.raises(ValueError):  # header + ring past a Py_ssize_t: no size check wraps
        cache_ring.new_ring(2**62, 2**62, 2**62, 1, 1, compiled=True)
    with pytest.raises(BufferError):
        _ring("compiled", mem=b"\0" * (HEADER + RING))  # read-only


class _DuringStride(TorchFunctionMode):
    """Runs ``then`` when a tensor's ``stride`` is read (what a torch function mode, or
    another thread taking the interpreter meanwhile, may do in the middle of a put)."""

    def __init__(self, then: Callable[[], None]) -> None:
        super().__init__()
        self.then = then

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if getattr(func, "__name__", "") == "stride":
            self.then()
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", KINDS)
def test_a_map_released_and_closed_in_the_middle_of_a_put_is_not_written(kind: str) -> None:
    ring = cache_ring.new_ring(RING, RING, HEADER, 10**9, 4, compiled=kind == "compiled")
    mem = mmap.mmap(-1, HEADER + RING)
    ring.hold(mem)
    t = _learned(torch.ones(100))

    def close() -> None:
        ring.release()
        mem.close()  # (a close at exit, on another thread)

    with _DuringStride(close):
        got = ring.put(b"k", t)
    assert got == 0 and ring.end == 0 and ring.unsettled == []


@pytest.mark.parametrize("kind", KINDS)
def test_unsettled_replaced_in_the_middle_of_a_put_gets_the_key(kind: str) -> None:
    ring, _ = _ring(kind)
    t = _learned(torch.ones(3))
    other: list[bytes] = []

    def swap() -> None:
        ring.unsettled = other

    with _DuringStride(swap):
        assert ring.put(b"k", t) == 1
    assert other == [b"k"] and ring.unsettled is other


@pytest.mark.parametrize("kind", KINDS)
def test_a_tensor_method_that_raises_is_left_to_the_caller(kind: str) -> None:
    ring, _ = _ring(kind)

    def no_strides() -> None:
        raise TypeError("no strides here")

    t = _learned(torch.ones(3))
    with _DuringStride(no_strides):
        assert ring.put(b"k", t) == 0
    assert ring.end == 0


@pytest.mark.parametrize("kind", KINDS)
def test_with_the_layout_table_full_a_new_layout_is_learnt_once_a_sample(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataset of more shapes than the table keeps: each sample's layout is made once (by
    the ring, or by the caller's encode), not twice."""
    monkeypatch.setattr(sample_codec, "LAYOUTS", {})
    monkeypatch.setattr(cache_ring, "LAYOUTS", sample_codec.LAYOUTS)
    monkeypatch.setattr(sample_codec, "LAYOUTS_MAX", 0)
    monkeypatch.setattr(cache_ring, "LAYOUTS_MAX", 0)
    made: list[torch.Size] = []
    layout = sample_codec._layout
    monkeypatch.setattr(sample_codec, "_layout",
                        lambda t: made.append(t.shape) or layout(t))
    ring, _ = _ring(kind, window=RING)
    for n in range(1, 6):
        t = torch.ones(n)
        if not ring.put(b"%d" % n, t):
            assert sample_codec.encode_parts(t)[0]  # the caller's encode
    assert made == [torch.Size([n]) for n in range(1, 6)] and not sample_codec.LAYOUTS


@pytest.mark.parametrize("kind", KINDS)
def test_a_reference_cycle_through_the_held_map_is_collected(kind: str) -> None:
    class Map(bytearray):
        ring: Any

    ring = cache_ring.new_ring(RING, RING, HEADER, 10**9, 4, compiled=kind == "compiled")
    m = Map(HEADER + RING)
    m.ring = ring
    ring.hold(m)
    gone = weakref.ref(m)
    del ring, m
    gc.collect()
    assert gone() is None


def test_the_compiled_ring_is_built_wherever_a_c_compiler_and_pythons_headers_are() -> None:
    """setup.py builds it optionally: an install on a machine that could build it and silently
    fell back to the Python ring would be slower without saying so."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    buildable = shutil.which(cc) is not None and headers.is_file()
    assert buildable == cache_ring.COMPILED


@pytest.mark.parametrize("kind", KINDS)
def test_a_fill_through_either_ring_stores_every_sample_as_computed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    monkeypatch.setattr(cache_ring, "COMPILED", kind == "compiled")
    monkeypatch.setattr(cache_proc, "RING_BYTES", 64 * 1024)  # laps, wraps and no-room turns
    monkeypatch.setattr(cache_proc, "WINDOW_BYTES", 16 * 1024)
    monkeypatch.setattr(cache_proc, "SEND_BYTES", 4 * 1024)

    def det(i: int) -> Any:
        if i % 50 == 7:
            return {"a": torch.full((3,), float(i))}  # another kind: the general path
        shape = (40,) if i % 3 else (8, 5)
        return torch.full(shape, float(i))

    ds = CachedDataset(Numbers(1500), det, path=tmp_path / "c")
    first = []
    for i in range(1500):
        first.append(ds[i])
        if i % 100 == 0:
            ds.flush()  # the writer process keeps up whatever the host: every record laps
    w = ds._tally.writer
    assert isinstance(w, cache_proc.ProcessWriter)
    assert isinstance(w.ring, cache_ring.PyRing) == (kind == "python")
    assert w.ring.end > 3 * w.ring_bytes
    ds.flush()
    st = ds.stats()
    assert (st.misses, st.uncached, st.complete) == (1500, 0, True)
    assert st.bytes_written == sum(len(encode(v)) for v in first)
    w.close()
    back = CachedDataset(Numbers(1500), det, path=tmp_path / "c")
    for i in range(0, 1500, 7):
        got = back[i]
        want = det(i)
        assert (torch.equal(got["a"], want["a"]) if isinstance(want, dict)
                else torch.equal(got, want) and got.shape == want.shape)
    assert back.stats().misses == 0


def test_the_layouts_the_ring_reads_are_the_codecs() -> None:
    t = torch.randn(2, 9)
    fast_parts(t)
    layout = LAYOUTS[(t.dtype, t.shape, t.stride())]
    assert layout is not None
    _, first, arr, nbytes, is_complex = layout
    assert nbytes == t.nbytes and arr is not None and not is_complex
    assert first + t.numpy().tobytes() == encode(t)


@pytest.mark.skipif(not cache_ring.COMPILED, reason="the compiled ring is not built here")
def test_the_compiled_ring_does_what_the_python_one_does_on_random_cases() -> None:
    """Random tensors (dtypes, shapes, views), keys and ring states: the same answer, the same
    positions, the same bytes in the map."""
    g = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    dtypes = [torch.float32, torch.float64, torch.float16, torch.int8, torch.int32, torch.bool,
              torch.complex64, torch.bfloat16]
    answers = set()
    for case in range(400):
        dtype = dtypes[case % len(dtypes)]
        shape = tuple(int(x) for x in rng.integers(1, 6, size=int(rng.integers(0, 4))))
        t = torch.randint(0, 3, shape, generator=g).to(dtype)
        view = case % 5
        if view == 1 and t.dim() >= 2:
            t = t.transpose(0, 1)
        elif view == 2 and t.dim() >= 1 and t.shape[0] > 1:
            t = t[::2]
        elif view == 3 and dtype.is_complex:
            t = t.conj()
        elif view == 4:
            t = t.expand(2, *t.shape)  # a stride of 0: not dense
        window = int(rng.choice([256, 1024, RING]))
        end = int(rng.integers(0, 3 * RING)) & ~7
        consumed = max(0, end - int(rng.integers(0, RING + 1)))
        sent = max(consumed, end - int(rng.integers(0, 600)))
        key = bytes(rng.integers(97, 123, size=int(rng.integers(1, 30))).astype(np.uint8))
        out = []
        for kind in ("compiled", "python"):
            ring, buf = _ring(kind, window=window, batch=3, send=500)
            ring.end, ring.consumed, ring.sent = end, consumed, sent
            got = ring.put(key, t)
            out.append((got, ring.end, list(ring.unsettled), bytes(buf)))
        assert out[0] == out[1], (case, dtype, shape, view, window, end, consumed)
        answers.add(out[0][0])
    assert answers == {0, 1, 2}
