"""``vision``: a small CNN on synthetic JPEGs decoded and augmented per sample with Pillow
(``vision-large``: ResNet-50 on the same data, for GPUs).

The JPEGs are made once, in memory (no download); every ``__getitem__`` decodes one, takes a
random resized crop, maybe flips it and normalizes it, which is real CPU preprocessing of the
kind an ImageNet loader does. The defaults are deliberately naive (num_workers=0, small batch,
fp32), as found in many scripts.
"""

from __future__ import annotations

import io
import os
import random
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

from redline.core.loader import LoaderSettings
from redline.data.cache_split import CacheSplit
from redline.data.device_decode import JpegSplit, crop_box, pillow_resized_crop, pillow_rgb
from redline.workloads.base import Workload
from redline.workloads.resnet import ResNet50

MEAN_RGB = (0.485, 0.456, 0.406)
STD_RGB = (0.229, 0.224, 0.225)
"""ImageNet's per-channel statistics, the normalization of both decode paths."""
MEAN = torch.tensor(MEAN_RGB).view(3, 1, 1)
STD = torch.tensor(STD_RGB).view(3, 1, 1)
FLIP_P = 0.5
"""Probability of a left-right flip."""
AREA = (0.35, 1.0)
"""The random crop's area as a share of the image's."""
RATIO = (3 / 4, 4 / 3)
"""The random crop's aspect ratio range."""


@dataclass(kw_only=True, slots=True)
class VisionConfig:
    """Knobs of the vision workload; the defaults are the naive configuration."""

    num_images: int = 128
    """Distinct JPEGs encoded at start-up."""
    length: int = 2048
    """Samples per epoch (indices wrap over the distinct images)."""
    stored_size: tuple[int, int] = (320, 240)
    """Width, height of the stored JPEGs."""
    crop: int = 96
    """Side of the random resized crop fed to the model."""
    quality: int = 90
    batch_size: int = 16
    loader: LoaderSettings = field(default_factory=LoaderSettings)
    """The DataLoader's settings (naive: no workers, nothing pinned)."""
    accumulation_steps: int = 4
    """Micro-batches per optimizer step: the naive script accumulates small micro-batches
    (written for a small GPU), so its effective batch is batch_size × 4."""
    lr: float = 0.05
    seed: int = 0
    storage_latency_ms: float = 0.0
    """> 0: the JPEGs live in files (written to a temporary folder at start-up) and every read
    first waits this long — SIMULATED storage latency (a network file system, an object
    store): the data path is then storage-bound rather than decode-bound."""
    model: str = "small"
    """'small': three conv blocks, sized for a CPU demo. 'resnet50': ResNet-50, sized for a GPU
    (the ``vision-large`` workload): a fast GPU finishes the small CNN before the CPUs can
    decode its next batch, so only a GPU-sized model shows what tuning does to device busy."""

    def __post_init__(self) -> None:
        if self.accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {self.accumulation_steps}")
        if self.num_images < 1 or self.length < 1:
            raise ValueError("num_images and length must be >= 1")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.model not in ("small", "resnet50"):
            raise ValueError(f"model must be 'small' or 'resnet50', got {self.model!r}")
        if self.storage_latency_ms < 0:
            raise ValueError(f"storage_latency_ms must be >= 0, got {self.storage_latency_ms}")


def _make_jpeg(rng: np.random.Generator, w: int, h: int, quality: int) -> bytes:
    # Smooth gradients + blobs + mild noise: compresses like a photo (tens of KiB), not like noise.
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.zeros((h, w, 3), np.float32)
    for c in range(3):
        fx, fy = (float(v) for v in rng.uniform(0.005, 0.05, 2))
        ph = float(rng.uniform(0, 6.28))
        img[..., c] = 127 + 100 * np.sin(xx * fx + yy * fy + ph)
    for _ in range(6):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(10, 60)
        mask = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
        img[mask] = rng.uniform(0, 255, 3)
    img += rng.normal(0, 6, img.shape)
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def decode(item: tuple[bytes, int]) -> tuple[np.ndarray, int]:
    """The deterministic part of a sample: the JPEG decoded to RGB pixels (H × W × 3 uint8),
    with its label."""
    blob, label = item
    return np.asarray(pillow_rgb(blob)), label


class Augment:
    """The random part: a random resized crop to ``crop`` pixels, a flip half the time, and
    ImageNet's normalization, on decoded pixels."""

    def __init__(self, crop: int) -> None:
        self.crop = crop

    def __call__(self, item: tuple[np.ndarray, int]) -> tuple[torch.Tensor, int]:
        pixels, label = item
        img = random_resized_crop(Image.fromarray(pixels), self.crop)
        if random.random() < FLIP_P:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        x = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        x = x.view(self.crop, self.crop, 3).permute(2, 0, 1).float().div_(255)
        return (x - MEAN) / STD, label


class Modulo:
    """Sample ``i`` is image ``i mod n``: an epoch visits each distinct image several times."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, i: int) -> int:
        return i % self.n


class JpegSource(Dataset[tuple[bytes, int]]):
    """The distinct images as stored: (encoded JPEG, label), one item per image."""

    def __init__(self, images: SyntheticJpegDataset, fingerprint: str) -> None:
        self.images = images
        self.fingerprint = fingerprint
        """Names the images (count, size, quality, seed) for the cache's keys."""

    def __len__(self) -> int:
        return self.images.num_images

    def __getitem__(self, k: int) -> tuple[bytes, int]:
        return self.images.jpeg(k), k % 10


class SyntheticJpegDataset(Dataset[tuple[torch.Tensor, int]]):
    """In-memory JPEGs, decoded and augmented on every access: sample ``i`` is
    ``Augment(decode(image i mod num_images))``, labelled by its image.

    The encoded bytes live in one numpy buffer with offsets, not a list of ``bytes``, so forked
    DataLoader workers share its pages instead of copying them (pytorch#13246).
    """

    def __init__(self, cfg: VisionConfig) -> None:
        rng = np.random.default_rng(cfg.seed)
        blobs = [_make_jpeg(rng, *cfg.stored_size, cfg.quality) for _ in range(cfg.num_images)]
        self.offsets = np.cumsum([0] + [len(b) for b in blobs])
        self.data = np.frombuffer(b"".join(blobs), dtype=np.uint8)
        self.length = cfg.length
        self.crop = cfg.crop
        self.num_images = cfg.num_images
        self.augment = Augment(cfg.crop)
        self.source = JpegSource(self, f"synthetic-jpeg:{cfg.num_images}:"
                                       f"{cfg.stored_size[0]}x{cfg.stored_size[1]}:"
                                       f"q{cfg.quality}:seed{cfg.seed}")

    def __len__(self) -> int:
        return self.length

    def jpeg(self, i: int) -> bytes:
        k = i % self.num_images
        blob: bytes = self.data[self.offsets[k]:self.offsets[k + 1]].tobytes()
        return blob

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.augment(decode(self.source[i % self.num_images]))

    def cache_split(self) -> CacheSplit:
        """The decode as the deterministic part, the augmentation as the random one: what
        ``redline tune`` needs to try serving this dataset from a decode cache."""
        return CacheSplit(source=self.source, deterministic=decode, random=self.augment,
                          index=Modulo(self.num_images))

    def jpeg_split(self) -> JpegSplit:
        """How each sample is made from its JPEG, so ``redline tune`` can try decoding and
        augmenting on the device (the same crop rule, flip and normalization)."""
        return JpegSplit(source=self.source, crop=self.crop, mean=MEAN_RGB, std=STD_RGB,
                         scale=AREA, ratio=RATIO, flip_p=FLIP_P, index=Modulo(self.num_images))


class StoredJpegDataset(SyntheticJpegDataset):
    """The same JPEGs in files, each read after a wait: SIMULATED storage latency (the files
    are local; the wait stands for a network file system or an object store). The folder is
    removed when the dataset is collected or the process exits."""

    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__(cfg)
        self.latency_s = cfg.storage_latency_ms / 1e3
        self.root = tempfile.mkdtemp(prefix="redline-vision-storage-")
        for k in range(self.num_images):
            with open(os.path.join(self.root, f"{k:05d}.jpg"), "wb") as f:
                f.write(super().jpeg(k))
        del self.data  # read from the files only
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.root, True)

    def jpeg(self, i: int) -> bytes:
        time.sleep(self.latency_s)  # SIMULATED storage latency
        with open(os.path.join(self.root, f"{i % self.num_images:05d}.jpg"), "rb") as f:
            return f.read()


def random_resized_crop(img: Image.Image, size: int, area: tuple[float, float] = AREA,
                        ratio: tuple[float, float] = RATIO) -> Image.Image:
    """torchvision-style RandomResizedCrop with Pillow only, at the box :func:`crop_box` draws
    (the rule the device path draws its boxes with too)."""
    return pillow_resized_crop(img, crop_box(*img.size, area, ratio), size)


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()

        def block(i: int, o: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(i, o, 3, stride=2, padding=1, bias=False),
                                 nn.BatchNorm2d(o), nn.ReLU(inplace=True))

        self.features = nn.Sequential(block(3, 32), block(32, 64), block(64, 128))
        self.head = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x).mean(dim=(2, 3)))
        return out


def _loss(model: nn.Module, batch: Any, device: torch.device) -> torch.Tensor:
    x, y = batch
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    loss: torch.Tensor = nn.functional.cross_entropy(model(x), y)
    return loss


def build_vision(cfg: VisionConfig | None = None, device: torch.device | None = None) -> Workload:
    """The synthetic vision workload: JPEGs decoded and augmented in the DataLoader (read from
    files after a simulated storage latency when ``cfg.storage_latency_ms`` > 0), a small CNN
    or ResNet-50 trained with SGD and momentum.

    Args:
        cfg: the model, data and loop settings; None = :class:`VisionConfig`'s defaults
            (``vision``).
        device: where the model trains; None = the CPU.

    Returns:
        The :class:`Workload` ("vision", "vision-large" or "vision-storage"), with the
        dataset's cache split.
    """
    cfg = cfg or VisionConfig()
    device = device or torch.device("cpu")
    torch.manual_seed(cfg.seed)
    ds = StoredJpegDataset(cfg) if cfg.storage_latency_ms > 0 else SyntheticJpegDataset(cfg)
    loader = DataLoader(ds, batch_size=cfg.batch_size, shuffle=True, drop_last=True,
                        **cfg.loader.loader_kwargs())
    model = (SmallCNN() if cfg.model == "small" else ResNet50()).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    name = ("vision-large" if cfg.model == "resnet50" else
            "vision-storage" if cfg.storage_latency_ms > 0 else "vision")
    return Workload(name=name, model=model, loader=loader, optimizer=opt, loss_fn=_loss, device=device,
                    accumulation_steps=cfg.accumulation_steps,
                    cache_split=ds.cache_split(), jpeg_split=ds.jpeg_split())


def vision_large_config() -> VisionConfig:
    """The ``vision-large`` preset: ResNet-50 on 224-pixel crops (ImageNet's training size) of
    the same JPEGs, with the same naive loop (no workers, 16 × 4 accumulation, fp32, SGD with
    momentum); sized for a GPU: 24 GFLOP of training per sample (torch.utils.flop_counter), 180×
    the small CNN's at 96 pixels, while the decode per sample costs about the same.

    Returns:
        The preset's :class:`VisionConfig` (ResNet-50, 224-pixel crops, lr 0.01, 65,536
        samples).
    """
    # lr 0.01: 0.1 per 256 samples (He et al., 2015) scaled to the effective batch of 64 gives
    # 0.025; 0.01 keeps fp32 and bf16 within the numerics guard's tolerance from step 1.
    # length 65,536 (1,024 steps of 64): every epoch start waits for the workers to decode a
    # whole batch again (~2 ms of decode a sample per worker), which in a 32-step epoch of
    # ~15 ms tuned steps would idle the device ~20 % — a cost of the tiny synthetic
    # epoch, not of a job that trains on an ImageNet-sized one (1.28 M samples per epoch).
    return VisionConfig(model="resnet50", crop=224, lr=0.01, length=65_536)


def vision_storage_config() -> VisionConfig:
    """The ``vision-storage`` preset: the small CNN's naive loop on JPEGs read from files
    after 8 ms of SIMULATED storage latency each (a network file system's or an object
    store's order of magnitude): 128 ms of waiting per batch of 16 against a few ms of decode,
    so the data path waits on storage, not on the CPUs — the other kind of starvation.

    Returns:
        The preset's :class:`VisionConfig` (8 ms of storage latency per sample).
    """
    return VisionConfig(storage_latency_ms=8.0)
