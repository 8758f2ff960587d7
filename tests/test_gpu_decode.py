"""JPEG decode on the device (redline.tune.knobs.gpu_decode, redline.data.device_decode), on the
CPU: the loader ships encoded JPEGs, the batch transform decodes and augments them; with the
same random state it makes the CPU path's samples; a device decoder that fails falls back to the
CPU for that batch; the knob is tried only where the device decodes and its pixels agree with
the CPU path's; a plan that decodes on the device is applied to a plain loop.

nvJPEG itself runs only on a CUDA machine (benchmarks/gpu_check.py, "GPU decode" rows). Here the
device decoder is the CPU fallback, or a stand-in decode function named as such in each test.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from redline.data.device_decode import (
    DeviceDecoder,
    EncodedBatch,
    EncodedJpegs,
    JpegSplit,
    collate_encoded,
    compare_paths,
    crop_box,
    decode_on_cpu,
    device_decode_unavailable,
)
from redline.data.prefetcher import map_tensors
from redline.tune import TrainSetup, apply_plan
from redline.tune.config import TuneConfig
from redline.tune.knobs import KNOBS, PATH, TunePlan
from redline.tune.knobs.decode_cache import DECODE_CACHE
from redline.tune.knobs.gpu_decode import GPU_DECODE, GPU_DECODE_RECORD
from redline.tune.path import TunePath, baseline_plan
from redline.tune.tuned import TunePlanMismatchError
from redline.workloads.vision import SyntheticJpegDataset, VisionConfig
from test_tune_path import speeds

CROP = 48


def _dataset(length: int = 24) -> SyntheticJpegDataset:
    return SyntheticJpegDataset(VisionConfig(num_images=6, length=length, crop=CROP))


def _cpu_decode_stand_in(blobs: list[torch.Tensor]) -> list[torch.Tensor]:
    """STAND-IN for nvJPEG on a CPU-only machine: Pillow's decode, as a device decoder."""
    return [decode_on_cpu(blob) for blob in blobs]


def test_the_crop_rule_stays_inside_the_image_and_falls_back_to_the_whole_image() -> None:
    rng = random.Random(3)
    for _ in range(500):
        left, top, width, height = crop_box(320, 240, (0.08, 1.0), (3 / 4, 4 / 3), rng)
        assert left >= 0 and left + width <= 320 and top >= 0 and top + height <= 240
        assert 0.08 * 320 * 240 * 0.9 <= width * height <= 320 * 240
    # an aspect ratio no crop of a 100 × 10 image can have at that area: the whole image
    assert crop_box(100, 10, (0.9, 1.0), (0.1, 0.1), rng) == (0, 0, 100, 10)


def test_the_loader_ships_encoded_jpegs_that_the_copy_to_the_device_leaves_alone() -> None:
    ds = _dataset()
    split = ds.jpeg_split()
    loader = DataLoader(EncodedJpegs(split, len(ds)), batch_size=8, num_workers=2,
                        collate_fn=collate_encoded)
    batches = list(loader)
    assert len(batches) == 3
    encoded, labels = batches[1]
    assert isinstance(encoded, EncodedBatch) and len(encoded) == 8
    assert labels.tolist() == [(i % 6) % 10 for i in range(8, 16)]  # image i mod 6's label
    assert encoded.blobs[0].dtype == torch.uint8 and encoded.blobs[0].dim() == 1
    assert bytes(encoded.blobs[0].numpy()) == ds.jpeg(8)
    moved = map_tensors(batches[1], lambda t: t.to("cpu", copy=True))
    assert moved[0] is encoded  # the bytes stay on the host, where nvJPEG reads them


def test_from_the_same_random_state_the_device_path_makes_the_cpu_paths_samples() -> None:
    """One sample after another in the main process (num_workers=0), the CPU path draws a box
    then a flip per sample; the device path draws them per image in the same order. Same seed,
    same samples (to the resize filters' rounding)."""
    ds = _dataset()
    split = ds.jpeg_split()
    random.seed(11)
    cpu = torch.stack([ds[i][0] for i in range(8)])
    decoder = DeviceDecoder(split, "cpu", decode=_cpu_decode_stand_in)
    batch = collate_encoded([EncodedJpegs(split, len(ds))[i] for i in range(8)])
    random.seed(11)
    images, labels = decoder(batch)
    assert images.shape == (8, 3, CROP, CROP) and images.dtype == torch.float32
    assert labels.tolist() == [ds[i][1] for i in range(8)]
    levels = ((images - cpu) * torch.tensor(split.std).view(1, 3, 1, 1) * 255).abs()
    assert float(levels.mean()) < 1.0 and float(levels.quantile(0.99)) < 4.0
    # a different seed makes other crops: the agreement above is not two blurred averages
    random.seed(12)
    other, _ = decoder(batch)
    assert float(((other - cpu) * 0.226 * 255).abs().mean()) > 10


def test_without_a_cuda_device_the_decoder_decodes_on_the_cpu_and_says_why() -> None:
    ds = _dataset()
    split = ds.jpeg_split()
    decoder = DeviceDecoder(split, "cpu")
    images, labels = decoder(collate_encoded([EncodedJpegs(split, len(ds))[i] for i in range(4)]))
    assert images.shape == (4, 3, CROP, CROP) and labels.shape == (4,)
    assert decoder.stats.images_on_cpu == 4 and decoder.stats.images_on_device == 0
    assert decoder.stats.fallback_reason == device_decode_unavailable(torch.device("cpu"))
    assert "needs a CUDA device" in (decoder.stats.fallback_reason or "")


def test_a_batch_the_device_decoder_refuses_is_decoded_on_the_cpu() -> None:
    ds = _dataset()
    split = ds.jpeg_split()

    def refuses(blobs: list[torch.Tensor]) -> list[torch.Tensor]:
        raise RuntimeError("nvjpegDecodeBatched failed: NVJPEG_STATUS_BAD_JPEG")

    decoder = DeviceDecoder(split, "cpu", decode=refuses)
    batch = collate_encoded([EncodedJpegs(split, len(ds))[i] for i in range(4)])
    random.seed(5)
    images, _ = decoder(batch)
    random.seed(5)
    reference, _ = DeviceDecoder(split, "cpu", decode=_cpu_decode_stand_in)(batch)
    assert torch.equal(images, reference)  # the batch is not lost
    assert decoder.stats.images_on_cpu == 4
    assert "NVJPEG_STATUS_BAD_JPEG" in (decoder.stats.fallback_reason or "")


def test_already_decoded_batches_pass_through() -> None:
    decoder = DeviceDecoder(_dataset().jpeg_split(), "cpu")
    batch = (torch.zeros(2, 3, CROP, CROP), torch.zeros(2))
    assert decoder(batch) is batch
    assert decoder.stats.batches == 0


def test_the_pixel_check_passes_the_same_path_and_catches_a_wrong_one() -> None:
    split = _dataset().jpeg_split()
    same = compare_paths(split, "cpu", decoder=DeviceDecoder(split, "cpu",
                                                             decode=_cpu_decode_stand_in))
    assert same.close and same.images == 6 and same.mean_abs_levels < 1.0

    def channels_swapped(blobs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [decode_on_cpu(blob).flip(0) for blob in blobs]  # BGR: a real decoder bug

    swapped = compare_paths(split, "cpu", decoder=DeviceDecoder(split, "cpu",
                                                                decode=channels_swapped))
    assert not swapped.close and swapped.mean_abs_levels > 10


def test_the_split_refuses_what_it_cannot_use() -> None:
    source = _dataset().source
    with pytest.raises(TypeError, match="map-style dataset"):
        JpegSplit(source=iter([]), crop=8, mean=(0, 0, 0), std=(1, 1, 1))
    with pytest.raises(ValueError, match="std > 0"):
        JpegSplit(source=source, crop=8, mean=(0, 0, 0), std=(1, 0, 1))
    with pytest.raises(ValueError, match="scale"):
        JpegSplit(source=source, crop=8, mean=(0, 0, 0), std=(1, 1, 1), scale=(0.5, 1.5))
    with pytest.raises(ValueError, match="crop"):
        JpegSplit(source=source, crop=0, mean=(0, 0, 0), std=(1, 1, 1))
    with pytest.raises(TypeError, match="encoded JPEG"):
        EncodedJpegs(JpegSplit(source=[(3.0, 1)], crop=8, mean=(0, 0, 0), std=(1, 1, 1)), 1)[0]


# -- the knob --------------------------------------------------------------------------------

def _factory(length: int = 32) -> Any:
    def factory() -> TrainSetup:
        torch.manual_seed(0)
        ds = _dataset(length)
        model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=4), nn.Flatten(), nn.LazyLinear(10))
        model(torch.zeros(1, 3, CROP, CROP))
        return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                          loader=DataLoader(ds, batch_size=8, shuffle=True, drop_last=True),
                          loss_fn=lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]),
                          cache_split=ds.cache_split(), jpeg_split=ds.jpeg_split())
    return factory


def _path(tmp_path: Path) -> tuple[TunePath, TunePlan]:
    cfg = TuneConfig(run_steps=1000, rounds=1, steps_per_trial=2, warmup_steps=1, reuse=False,
                     store_dir=str(tmp_path))
    # decoding on the device: 0.05 s a step against 0.08 s (faked: the order, not the speed)
    p = TunePath(_factory(), cfg, lambda s: None,
                 speeds(lambda plan: 0.05 if plan.gpu_decode else 0.08))
    return p, baseline_plan(p.key, p.micro, p.effective, p.user_loader)


def test_the_knob_is_not_tried_without_a_device_decoder(tmp_path: Path) -> None:
    p, base = _path(tmp_path)
    plan = GPU_DECODE.run(p, base)
    (d,) = plan.decisions
    assert d.knob == GPU_DECODE_RECORD.label and not d.kept and not plan.gpu_decode
    assert d.reason == "not tried: decoding JPEGs on the device needs a CUDA device " \
                       "(training on cpu)"


def test_the_knob_is_kept_when_faster_and_the_decode_cache_is_then_not_tried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import redline.tune.knobs.gpu_decode as knob_module

    monkeypatch.setattr(knob_module, "device_decode_unavailable", lambda device: None)
    monkeypatch.setattr(knob_module, "DeviceDecoder",
                        functools.partial(DeviceDecoder, decode=_cpu_decode_stand_in))
    p, base = _path(tmp_path)
    try:
        plan = GPU_DECODE.run(p, base)
        (d,) = plan.decisions
        assert d.kept and plan.gpu_decode and d.measured == "end to end"
        assert isinstance(d.details["mean_abs_levels"], float)
        assert d.details["mean_abs_levels"] < 1 and d.details["images_compared"] == 6
        plan = DECODE_CACHE.run(p, plan)
        assert not plan.decisions[-1].kept
        assert "decoded on the device" in plan.decisions[-1].reason
        assert p.cache_store is None  # nothing filled
    finally:
        p.close()


def test_the_knob_refuses_a_device_path_whose_pixels_differ(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import redline.tune.knobs.gpu_decode as knob_module

    def channels_swapped(blobs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [decode_on_cpu(blob).flip(0) for blob in blobs]

    monkeypatch.setattr(knob_module, "device_decode_unavailable", lambda device: None)
    monkeypatch.setattr(knob_module, "DeviceDecoder",
                        functools.partial(DeviceDecoder, decode=channels_swapped))
    p, base = _path(tmp_path)
    plan = GPU_DECODE.run(p, base)
    (d,) = plan.decisions
    assert not d.kept and not plan.gpu_decode
    assert d.reason.startswith("not tried: the device path's pixels differ")


def test_the_knob_comes_first_in_the_data_stage() -> None:
    order = [visit.knob.name for visit in PATH]
    assert order.index("gpu_decode") < order.index("decode_cache") < order.index("batch")
    assert [k.name for k in KNOBS].index("gpu_decode") == 1  # its transform applies first


def test_a_plan_that_decodes_on_the_device_trains_a_plain_loop(tmp_path: Path) -> None:
    _, base = _path(tmp_path)
    plan = dataclasses.replace(base, gpu_decode=True)
    s = _factory()()
    with pytest.raises(TunePlanMismatchError, match="no JPEG split was given"):
        apply_plan(plan, s.model, s.optimizer, s.loader, s.loss_fn)
    tuned = apply_plan(plan, s.model, s.optimizer, s.loader, s.loss_fn,
                       jpeg_split=s.jpeg_split)
    assert isinstance(tuned.dataloader.dataset, EncodedJpegs)
    losses = [float(tuned.step(batch)) for batch in tuned.loader]
    assert len(losses) == 32 // 8 and all(torch.isfinite(torch.tensor(losses)))
    decoder = tuned._transforms[0]
    assert isinstance(decoder, DeviceDecoder)
    # on this CPU-only machine every image was decoded on the CPU, and the loop said why
    assert decoder.stats.images_on_cpu == 32 and decoder.stats.batches == 4
    tuned.close()


def test_a_plan_written_before_the_knob_reads_as_decoding_on_the_cpu(tmp_path: Path) -> None:
    _, base = _path(tmp_path)
    doc = base.to_dict()
    del doc["gpu_decode"]
    assert TunePlan.from_dict(doc).gpu_decode is False


def test_not_faster_at_first_it_is_measured_again_once_the_step_got_faster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the step is slow the CPUs keep up and the device decode does not pay; once a later
    knob (here bf16) made the step faster, the decode binds and the second visit keeps it.
    (Speeds faked: this tests the path's order, not this machine's timings.)"""
    import redline.tune.knobs.gpu_decode as knob_module
    from redline.tune.decision import Decision

    monkeypatch.setattr(knob_module, "device_decode_unavailable", lambda device: None)
    monkeypatch.setattr(knob_module, "DeviceDecoder",
                        functools.partial(DeviceDecoder, decode=_cpu_decode_stand_in))
    cfg = TuneConfig(run_steps=1000, rounds=1, steps_per_trial=2, warmup_steps=1, reuse=False,
                     store_dir=str(tmp_path))

    def step_s(plan: TunePlan) -> float:
        compute = 0.02 if plan.precision == "bf16" else 0.08
        decode = 0.03 if plan.gpu_decode else 0.05  # the CPUs' decode, hidden under a slow step
        return max(compute, decode) + (0.005 if plan.gpu_decode else 0.0)

    p = TunePath(_factory(), cfg, lambda s: None, speeds(step_s))
    base = baseline_plan(p.key, p.micro, p.effective, p.user_loader)
    plan = GPU_DECODE.run(p, base)
    assert not plan.gpu_decode and plan.decisions[-1].measured == "end to end"
    assert GPU_DECODE.again(p, plan) is plan  # no later knob kept: nothing to look at again
    plan = dataclasses.replace(plan, precision="bf16", decisions=[
        *plan.decisions, Decision(knob="precision", value_in_label=True, kept=True, reason="faster")])
    plan = GPU_DECODE.again(p, plan)
    d = plan.decisions[-1]
    assert d.knob == GPU_DECODE_RECORD.label and d.again and d.kept and plan.gpu_decode
    assert d.details["images_compared"] == 6  # the pixel check's figures carried over
    # refused before measuring (no device decoder): no second visit either
    q, base = _path(tmp_path)
    refused = GPU_DECODE.run(q, base)
    refused.decisions.append(Decision(knob="precision", value_in_label=True, kept=True, reason="faster"))
    monkeypatch.undo()
    assert GPU_DECODE.again(q, refused) is refused


def test_the_second_visit_comes_before_the_loaders_last() -> None:
    again = [visit.knob.name for visit in PATH if visit.again]
    assert again[-2:] == ["gpu_decode", "loader"]


def _jpeg(width: int, height: int, mode: str, seed: int) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    rgb = np.stack([(xx * 255 // max(1, width - 1)), (yy * 255 // max(1, height - 1)),
                    rng.integers(0, 255, (height, width))], -1).astype(np.uint8)
    img = Image.fromarray(rgb).convert(mode)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=85)
    return buf.getvalue()


class _UserFolder:
    """A user's own dataset, unlike the built-in workload's: JPEG files of different sizes and
    aspect ratios on disk, a grayscale and a CMYK one among them, read as (bytes, label)."""

    def __init__(self, root: Path) -> None:
        shapes = [(640, 480, "RGB"), (200, 300, "RGB"), (97, 61, "L"), (333, 333, "CMYK"),
                  (1024, 200, "RGB"), (48, 64, "RGB")]
        self.paths = []
        for k, (width, height, mode) in enumerate(shapes):
            path = root / f"{k}.jpg"
            path.write_bytes(_jpeg(width, height, mode, k))
            self.paths.append(path)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, k: int) -> tuple[bytes, int]:
        return self.paths[k].read_bytes(), k % 3


def test_a_users_folder_of_mixed_jpegs_trains_through_the_device_path(tmp_path: Path) -> None:
    """Sizes from 48 × 64 to 1024 × 200, a grayscale and a CMYK JPEG, read from files, into a
    model that is not a CNN: every sample comes out 3 × crop × crop, close to the CPU path's
    pixels, and a plan that decodes on the device trains on it."""
    source = _UserFolder(tmp_path)
    split = JpegSplit(source=source, crop=32, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    agreement = compare_paths(split, "cpu", samples=6, decoder=DeviceDecoder(
        split, "cpu", decode=_cpu_decode_stand_in))
    assert agreement.images == 6 and agreement.close

    class Folder(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
        """The same files decoded on the CPU, as the user's script reads them."""

        def __len__(self) -> int:
            return len(source)

        def __getitem__(self, k: int) -> tuple[torch.Tensor, int]:
            blob, label = source[k]
            image = decode_on_cpu(torch.frombuffer(bytearray(blob), dtype=torch.uint8))
            x = torch.nn.functional.interpolate(image[None].float() / 255, size=(32, 32))[0]
            return (x - 0.5) / 0.25, label

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 64), nn.GELU(), nn.Linear(64, 3))
    opt = torch.optim.AdamW(model.parameters())
    loader = DataLoader(Folder(), batch_size=3, shuffle=True)
    from redline.tune.tuned import plan_key

    key = plan_key(model, torch.device("cpu"), "fp32", next(iter(DataLoader(Folder(), 1))))
    plan = TunePlan(key=key, effective_batch=3, micro_batch=3, source_batch_size=3,
                    gpu_decode=True)
    tuned = apply_plan(plan, model, opt, loader,
                       lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]), jpeg_split=split)
    losses = [float(tuned.step(batch)) for _ in range(3) for batch in tuned.loader]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    assert tuned._transforms[0].stats.images_on_cpu == 18  # no CUDA here: the CPU decoded
    tuned.close()
