"""DevicePrefetcher on CPU: a correct pass-through for every batch structure; normalization
gives the same numbers as doing it by hand. (The CUDA stream path runs in gpu_check.py.)"""

from __future__ import annotations

import dataclasses
from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import redline  # noqa: F401  (the package imports cleanly with the data subpackage)
from redline.data import DevicePrefetcher, map_tensors

Pair = namedtuple("Pair", "x y")


@dataclass
class Batch:
    image: torch.Tensor
    meta: dict
    name: str = "b"


def test_structures_are_preserved() -> None:
    batches = [
        (torch.ones(2, 3), torch.zeros(2)),
        [torch.ones(1), {"k": torch.arange(3)}],
        {"a": torch.ones(2), "b": [torch.zeros(1), "text"]},
        Pair(torch.ones(2), torch.zeros(2)),
        Batch(torch.ones(2, 3, 4, 4), {"id": torch.arange(2)}),
    ]
    out = list(DevicePrefetcher(batches, "cpu"))
    assert len(out) == len(batches)
    for a, b in zip(batches, out, strict=True):
        assert type(a) is type(b)
    assert isinstance(out[3], Pair) and torch.equal(out[3].x, batches[3].x)
    assert isinstance(out[4], Batch) and out[4].name == "b"
    assert torch.equal(out[4].meta["id"], torch.arange(2))
    assert out[2]["b"][1] == "text"


def test_uint8_masks_beside_the_images_are_left_as_they_are() -> None:
    imgs = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    masks = torch.randint(0, 5, (4, 8, 8), dtype=torch.uint8)  # class ids, N×H×W
    one = torch.randint(0, 5, (4, 1, 8, 8), dtype=torch.uint8)  # N×1×H×W
    three_rows = torch.randint(0, 5, (4, 3, 8), dtype=torch.uint8)  # dim 1 of 3: normalized
    (x, m, o, r), = list(DevicePrefetcher([(imgs, masks, one, three_rows)], "cpu",
                                          mean=(0.5, 0.4, 0.3), std=(0.2, 0.2, 0.2)))
    assert x.dtype == torch.float32 and x.shape == imgs.shape
    assert torch.equal(m, masks) and torch.equal(o, one)  # not broadcast to 3 channels
    assert r.dtype == torch.float32 and r.shape == three_rows.shape
    # one mean for every channel (as torchvision's Normalize broadcasts it): each is normalized
    (x1, o1), = list(DevicePrefetcher([(imgs, one)], "cpu", mean=(0.5,), std=(0.5,)))
    assert torch.allclose(x1, (imgs.float() / 255 - 0.5) / 0.5)
    assert torch.allclose(o1, (one.float() / 255 - 0.5) / 0.5)


def test_uint8_normalization_matches_manual() -> None:
    imgs = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    labels = torch.arange(4)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    (x, y), = list(DevicePrefetcher([(imgs, labels)], "cpu", mean=mean, std=std))
    want = (imgs.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(
        1, 3, 1, 1)
    assert x.dtype == torch.float32
    assert torch.allclose(x, want, atol=1e-6)
    assert torch.equal(y, labels)  # integer labels are not images: untouched


def test_with_a_dataloader_every_epoch() -> None:
    ds = TensorDataset(torch.arange(10).float().view(10, 1))
    pf = DevicePrefetcher(DataLoader(ds, batch_size=4), "cpu")
    assert len(pf) == 3
    for _ in range(2):
        got = torch.cat([b[0] for b in pf])
        assert torch.equal(got.view(-1), torch.arange(10).float())
    assert pf.stats.batches == 6


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="both mean and std"):
        DevicePrefetcher([], "cpu", mean=(0.5,))
    with pytest.raises(ValueError, match="must not contain 0"):
        DevicePrefetcher([], "cpu", mean=(0.5,), std=(0.0,))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            DevicePrefetcher([], "cuda")


def test_map_tensors_leaves_non_tensors() -> None:
    assert map_tensors({"a": 1, "b": "s"}, lambda t: t * 2) == {"a": 1, "b": "s"}


class RecordingCuda:
    """Stands in for the CUDA calls (simulated; no GPU here): records their order."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.side_active = False
        outer = self

        class Event:
            n = 0

            def __init__(self) -> None:
                Event.n += 1
                self.id = Event.n
                self.t: float | None = None

            def record(self, stream: object) -> None:
                outer.log.append(f"record e{self.id} on {stream}")
                self.t = float(self.id)

            def query(self) -> bool:
                return True

            def elapsed_time(self, other: Event) -> float:
                return 2.0  # ms

        class Stream:
            def __init__(self, name: str) -> None:
                self.name = name

            def wait_stream(self, other: Stream) -> None:
                outer.log.append(f"{self.name} waits {other.name}")

            def __repr__(self) -> str:
                return self.name

        self.Event, self.side, self.main = Event, Stream("side"), Stream("main")

    def new_stream(self, device: object) -> object:
        return self.side

    def current_stream(self, device: object) -> object:
        return self.main

    def event(self) -> object:
        return self.Event()

    def on(self, stream: object):
        from contextlib import contextmanager

        @contextmanager
        def ctx():
            self.side_active = True
            yield
            self.side_active = False

        return ctx()

    def is_pinned(self, t: torch.Tensor) -> bool:
        return False

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        self.log.append("pin")
        assert self.side_active  # copies are issued on the side stream
        return t


def test_cuda_path_order_with_recorded_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path's logic, checked on CPU with recorded stand-ins (simulated device): each
    batch is copied on the side stream from pinned memory, the consumer's stream waits for it,
    every tensor is record_stream-ed on the consumer's stream, and the next copy is issued
    before the current batch is handed out."""
    recorded: list[str] = []
    monkeypatch.setattr(torch.Tensor, "record_stream",
                        lambda self, s: recorded.append(f"record_stream {s}"), raising=False)
    batches = [(torch.ones(2, 3) * i, torch.tensor([i])) for i in range(3)]
    pf = DevicePrefetcher(batches, "cpu")
    pf._cuda, cuda = True, RecordingCuda()
    pf._backend = cuda
    seen = []
    for k, (x, y) in enumerate(pf):
        assert torch.equal(x, torch.ones(2, 3) * k)
        # when batch k is handed out, the copy of batch k+1 has already been issued
        issued = sum(1 for e in cuda.log if e == "pin") // 2
        assert issued == min(k + 2, 3)
        seen.append(int(y))
    assert seen == [0, 1, 2]
    assert cuda.log.count("main waits side") == 3
    assert recorded == ["record_stream main"] * 6  # two tensors per batch
    assert pf.stats.batches == 3 and pf.stats.resolved == 3
    assert pf.stats.copy_s == pytest.approx(3 * 0.002) and pf.stats.hidden_fraction == 1.0
    assert pf.stats.bytes_copied == 3 * (6 * 4 + 8)


def _recorded(pf: DevicePrefetcher, monkeypatch: pytest.MonkeyPatch) -> RecordingCuda:
    """Put ``pf`` on its CUDA path with the recorded stand-ins (simulated device)."""
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: None, raising=False)
    pf._cuda, cuda = True, RecordingCuda()
    pf._backend = cuda
    return cuda


def test_cuda_path_hands_out_every_good_batch_before_the_loader_s_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The next batch's copy is issued before the current one is handed out: a loader that
    fails on batch 4 still delivers batches 0–3, then its error, as the pass-through does."""
    def loader():
        for i in range(4):
            yield torch.tensor([i])
        raise RuntimeError("bad sample")

    for cuda_path in (False, True):
        pf = DevicePrefetcher(loader(), "cpu")
        if cuda_path:
            _recorded(pf, monkeypatch)
        got = []
        with pytest.raises(RuntimeError, match="bad sample"):
            for b in pf:
                got.append(int(b))
        assert got == [0, 1, 2, 3] and pf.stats.batches == 4


def test_mean_and_std_go_to_the_device_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Moved per batch, they would be a blocking copy from pageable memory on the side
    stream: the host would wait for the batch's own copy before handing out the previous."""
    pf = DevicePrefetcher([torch.zeros(2, 3, 4, 4, dtype=torch.uint8)] * 3, "cpu",
                          mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    _recorded(pf, monkeypatch)
    moved: list[int] = []
    to = torch.Tensor.to

    def counting_to(self: torch.Tensor, *a: object, **k: object) -> torch.Tensor:
        if self is pf._mean or self is pf._std:
            moved.append(id(self))
        return to(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    out = list(pf)
    assert len(out) == 3 and all(torch.allclose(x, torch.full_like(x, -2.0)) for x in out)
    assert len(moved) == 2  # mean and std, once each


def test_a_tensor_already_on_the_device_is_read_after_the_consumer_s_work(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A loader that decodes on the device hands over tensors made on the consumer's stream:
    the side stream waits for it before reading them, once a batch, and they are not counted
    as copied. (The meta device stands for the target here.)"""
    batches = [(torch.ones(2), torch.ones(3, device="meta")) for _ in range(2)]
    pf = DevicePrefetcher(batches, "meta")
    cuda = _recorded(pf, monkeypatch)
    out = list(pf)
    assert len(out) == 2 and all(x.device.type == "meta" for b in out for x in b)
    assert cuda.log.count("side waits main") == 2
    assert pf.stats.bytes_copied == 2 * 2 * 4  # the host tensors only


def test_a_pass_through_says_nothing_of_hidden_copies() -> None:
    pf = DevicePrefetcher([torch.ones(2)] * 3, "cpu")
    assert len(list(pf)) == 3
    assert pf.stats.batches == 3 and pf.stats.prefetched == 0
    assert pf.stats.hidden_fraction is None  # nothing was copied ahead: not "0 % hidden"


class Keyed(dict):  # type: ignore[type-arg]
    """A dict subclass whose constructor takes another argument."""

    def __init__(self, tag: str, *a: object) -> None:
        super().__init__(*a)
        self.tag = tag


@dataclass
class Masked:
    x: torch.Tensor
    mask: torch.Tensor = dataclasses.field(init=False)
    calls: int = 0

    def __post_init__(self) -> None:
        self.mask = torch.ones(1)
        self.calls += 1


def test_map_tensors_keeps_containers_that_take_more_than_their_items() -> None:
    """Each kept as its type, every tensor mapped: what a DataLoader's collate or a user's
    batch class gives, moved to a device (PyTorch's pin_memory keeps them too)."""
    import collections

    add = lambda t: t + 100  # noqa: E731
    t = torch.zeros(1)
    dd = map_tensors(collections.defaultdict(list, x=t), add)
    assert type(dd) is collections.defaultdict and dd.default_factory is list
    assert dd["x"].item() == 100
    k = map_tensors(Keyed("tag", {"x": t}), add)
    assert type(k) is Keyed and k.tag == "tag" and k["x"].item() == 100
    for seq in (collections.UserList([t]), collections.deque([t], maxlen=3)):
        out = map_tensors(seq, add)
        assert type(out) is type(seq) and out[0].item() == 100
    assert map_tensors(collections.deque([t], maxlen=3), add).maxlen == 3
    assert [x.item() for x in map_tensors({t}, add)] == [100]
    assert map_tensors("text", add) == "text" and map_tensors(torch.Size([2, 3]), add) == (2, 3)
    m = Masked(t)
    m.mask = torch.full((1,), 7.0)
    out = map_tensors(m, add)
    assert (out.x.item(), out.mask.item(), out.calls) == (100, 107, 1)  # no __post_init__ again
