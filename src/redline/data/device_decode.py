"""JPEG decode and augmentation on the device: the loader ships each sample's encoded bytes, and
the device decodes them (nvJPEG, through ``torchvision.io.decode_jpeg(..., device="cuda")``,
one batched call) and takes the random resized crop, the flip and the normalization.

Why: on a data-centre GPU the CPUs' JPEG decode is often what binds an image model's step (an
H200 trains ResNet-50 faster than 16 vCPUs decode ImageNet-sized JPEGs); NVIDIA DALI and
torchvision's own ``decode_jpeg(device="cuda")`` move the decode to the device for that reason.
Here the setup declares how its samples are made (:class:`JpegSplit`), so the same samples,
with the same random augmentation (:func:`crop_box` is the one crop rule of both paths), come
out of either path; ``redline tune`` checks the device path's pixels against the CPU path's
(:func:`compare_paths`) and keeps it only where it is faster end to end.

Where the device cannot decode (no CUDA, no torchvision, an image nvJPEG refuses), the same
transform decodes on the CPU (Pillow) and says so in its :class:`DecodeStats`: the batch is
never lost.
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset, default_collate

CropBox = tuple[int, int, int, int]
"""(left, top, width, height) of a crop, in pixels of the decoded image."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JpegSplit:
    """How a dataset's samples are made from JPEGs: sample ``i`` is the image
    ``source[index(i)][0]`` (encoded JPEG bytes) decoded to RGB, cropped at a random box
    (:func:`crop_box`) and resized to ``crop`` × ``crop`` (bilinear, antialiased), flipped
    left-right with probability ``flip_p``, scaled to [0, 1] and normalized by ``mean`` and
    ``std`` per channel; its label is ``source[index(i)][1]``. The CPU path that does this per
    sample and the device path that does it per batch draw from the same distribution."""

    source: Any
    """A map-style dataset of (encoded JPEG bytes, label) items."""
    crop: int
    """Side in pixels of the square the crop is resized to."""
    mean: tuple[float, float, float]
    """Per-channel mean of the normalization (after scaling pixels to [0, 1])."""
    std: tuple[float, float, float]
    """Per-channel standard deviation of the normalization."""
    scale: tuple[float, float] = (0.08, 1.0)
    """Range of the crop's area as a share of the image's (torchvision's RandomResizedCrop
    default)."""
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    """Range of the crop's aspect ratio (width / height), drawn log-uniformly."""
    flip_p: float = 0.5
    """Probability of a left-right flip."""
    index: Callable[[int], int] | None = None
    """The source item of the loader's sample ``i`` (None: the same index). Picklable (a
    module-level function or class) where the loader spawns its workers."""

    def __post_init__(self) -> None:
        if not hasattr(self.source, "__getitem__") or not hasattr(self.source, "__len__"):
            raise TypeError(f"JpegSplit.source must be a map-style dataset of (JPEG bytes, "
                            f"label) items, got {type(self.source).__name__}")
        if self.crop < 1:
            raise ValueError(f"JpegSplit.crop must be >= 1 pixel, got {self.crop}")
        if len(self.mean) != 3 or len(self.std) != 3 or any(s <= 0 for s in self.std):
            raise ValueError(f"JpegSplit.mean and std need 3 channels, std > 0; got mean "
                             f"{self.mean}, std {self.std}")
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"JpegSplit.scale must satisfy 0 < low <= high <= 1, got "
                             f"{self.scale}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"JpegSplit.ratio must satisfy 0 < low <= high, got {self.ratio}")
        if not 0 <= self.flip_p <= 1:
            raise ValueError(f"JpegSplit.flip_p must be in [0, 1], got {self.flip_p}")
        if self.index is not None and not callable(self.index):
            raise TypeError(f"JpegSplit.index must be callable or None, got "
                            f"{type(self.index).__name__}")


def crop_box(width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float],
             rng: random.Random | None = None) -> CropBox:
    """A random crop of a ``width`` × ``height`` image: area a uniform share ``scale`` of the
    image's, aspect ratio log-uniform in ``ratio``, position uniform; ten tries, then the whole
    image (the rule of torchvision's ``RandomResizedCrop.get_params``, Szegedy et al. 2015,
    "Going deeper with convolutions", §6, with the whole image as the fallback).

    Args:
        width: the decoded image's width in pixels.
        height: its height in pixels.
        scale: range of the crop's area as a share of the image's.
        ratio: range of the crop's width / height.
        rng: the random source; None = the ``random`` module (seeded per DataLoader worker by
            torch).

    Returns:
        (left, top, width, height) of the crop.
    """
    draw: Any = rng if rng is not None else random
    for _ in range(10):
        area = draw.uniform(*scale) * width * height
        aspect = math.exp(draw.uniform(math.log(ratio[0]), math.log(ratio[1])))
        crop_w, crop_h = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < crop_w <= width and 0 < crop_h <= height:
            return (draw.randint(0, width - crop_w), draw.randint(0, height - crop_h),
                    crop_w, crop_h)
    return 0, 0, width, height


class EncodedBatch:
    """A batch's encoded JPEGs, as 1-D uint8 CPU tensors (nvJPEG reads its input from host
    memory). Deliberately not a tensor container that ``map_tensors`` walks: the loader's
    pinning and the tuned loop's copy to the device leave it on the host."""

    __slots__ = ("blobs",)

    def __init__(self, blobs: list[torch.Tensor]) -> None:
        self.blobs = blobs

    def __len__(self) -> int:
        return len(self.blobs)


def _blob_tensor(blob: Any) -> torch.Tensor:
    if isinstance(blob, torch.Tensor):
        return blob.reshape(-1).to(torch.uint8)
    if not isinstance(blob, bytes | bytearray | memoryview | np.ndarray):
        raise TypeError(f"a JpegSplit source item must start with the encoded JPEG (bytes or a "
                        f"uint8 tensor), got {type(blob).__name__}")
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8)


class EncodedJpegs(Dataset[tuple[torch.Tensor, Any]]):
    """The loader's dataset when the device decodes: sample ``i`` is (its encoded bytes as a
    uint8 tensor, its label), ``length`` samples over the split's source."""

    def __init__(self, split: JpegSplit, length: int) -> None:
        self.split, self.length = split, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, Any]:
        k = int(i) if self.split.index is None else self.split.index(int(i))
        blob, label = self.split.source[k]
        return _blob_tensor(blob), label


def collate_encoded(items: Sequence[tuple[torch.Tensor, Any]]) -> tuple[EncodedBatch, Any]:
    """The loader's collate when the device decodes: the encoded images kept apart (they differ
    in length), the labels collated as the default collate does.

    Args:
        items: (encoded bytes, label) samples from :class:`EncodedJpegs`.

    Returns:
        (the batch's encoded images, its labels).
    """
    return EncodedBatch([blob for blob, _ in items]), default_collate([lab for _, lab in items])


def pillow_rgb(data: bytes) -> Image.Image:
    """An encoded image opened with Pillow (libjpeg-turbo for JPEG) and converted to RGB.

    Args:
        data: the encoded image.

    Returns:
        The RGB image.
    """
    return Image.open(io.BytesIO(data)).convert("RGB")


def pillow_resized_crop(img: Image.Image, box: CropBox, side: int) -> Image.Image:
    """``img`` cropped at ``box`` and resized to ``side`` × ``side`` with Pillow's bilinear
    filter (antialiased when it shrinks): the CPU path's crop.

    Args:
        img: the decoded image.
        box: (left, top, width, height) of the crop.
        side: the output's side in pixels.

    Returns:
        The resized crop.
    """
    left, top, width, height = box
    return img.resize((side, side), Image.Resampling.BILINEAR,
                      box=(left, top, left + width, top + height))


def decode_on_cpu(blob: torch.Tensor) -> torch.Tensor:
    """One JPEG decoded to RGB on the CPU with Pillow (libjpeg-turbo), as the CPU path does.

    Args:
        blob: the encoded image, a 1-D uint8 tensor.

    Returns:
        The pixels, 3 × H × W uint8.
    """
    pixels = np.asarray(pillow_rgb(blob.numpy().tobytes()))
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1)


def device_decode_unavailable(device: torch.device) -> str | None:
    """Why JPEGs cannot be decoded on ``device``, or None where they can.

    Args:
        device: where the model trains.

    Returns:
        The reason in words (what is missing and what to do), or None.
    """
    if device.type != "cuda":
        return f"decoding JPEGs on the device needs a CUDA device (training on {device.type})"
    if not torch.cuda.is_available():
        return "CUDA is not available in this process"
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception as e:  # ImportError, or a torchvision built for another torch
        return (f"torchvision.io.decode_jpeg cannot be imported ({type(e).__name__}: {e}); "
                "install the torchvision built for this torch (pip install torchvision)")
    return None


@dataclass(slots=True, kw_only=True)
class DecodeStats:
    """What a :class:`DeviceDecoder` did."""

    batches: int = 0
    images_on_device: int = 0
    """Images nvJPEG decoded."""
    images_on_cpu: int = 0
    """Images decoded on the CPU instead (no device decoder, or the batch it refused)."""
    fallback_reason: str | None = None
    """Why the last CPU decode happened, or None."""


def draw_augmentations(split: JpegSplit, images: Sequence[torch.Tensor],
                       rng: random.Random | None = None) -> tuple[list[CropBox], list[bool]]:
    """Each image's crop box and flip, drawn image by image in the order the CPU path draws
    them for one sample after another (box, then flip): from the same random state both paths
    make the same samples.

    Args:
        split: the crop rule and flip probability.
        images: the decoded images (… × H × W).
        rng: the random source; None = the ``random`` module.

    Returns:
        (one box per image, one flip flag per image).
    """
    draw: Any = rng if rng is not None else random
    boxes: list[CropBox] = []
    flips: list[bool] = []
    for image in images:
        boxes.append(crop_box(int(image.shape[-1]), int(image.shape[-2]), split.scale,
                              split.ratio, rng))
        flips.append(draw.random() < split.flip_p)
    return boxes, flips


class DeviceDecoder:
    """The batch transform of the device path: ``(EncodedBatch, labels)`` in, ``(images,
    labels)`` out, images ``N × 3 × crop × crop`` float32 on ``device``, normalized. Batches of
    any other form (already decoded) pass through unchanged.

    Args:
        split: how the samples are made (crop size and rule, flip, normalization).
        device: where to decode and augment.
        decode: decodes a list of encoded images to 3 × H × W uint8 tensors on ``device``;
            None = nvJPEG on a CUDA device where it is available, else Pillow on the CPU.
    """

    def __init__(self, split: JpegSplit, device: torch.device | str,
                 decode: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None) -> None:
        self.split = split
        self.device = torch.device(device)
        self.stats = DecodeStats()
        self._decode = decode
        self._why_cpu = device_decode_unavailable(self.device) if decode is None else None
        # on the device once: a copy from host memory per batch would wait for the device
        self._mean = torch.tensor(split.mean, dtype=torch.float32,
                                  device=self.device).view(1, 3, 1, 1)
        self._std = torch.tensor(split.std, dtype=torch.float32,
                                 device=self.device).view(1, 3, 1, 1)

    def decode(self, blobs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The batch's images decoded on the device (on the CPU where it cannot, counted).

        Args:
            blobs: the encoded images, 1-D uint8 CPU tensors.

        Returns:
            3 × H × W uint8 tensors on the decoder's device.
        """
        if self._decode is not None:
            try:
                images = self._decode(blobs)
                self.stats.images_on_device += len(blobs)
                return images
            except RuntimeError as e:  # nvJPEG refuses an image (CMYK, corrupt, unsupported)
                self.stats.fallback_reason = f"the device decoder failed: {e}"[:300]
        elif self._why_cpu is None:
            from torchvision.io import ImageReadMode, decode_jpeg

            try:
                decoded = decode_jpeg(blobs, mode=ImageReadMode.RGB, device=self.device)
                self.stats.images_on_device += len(blobs)
                return list(decoded)
            except RuntimeError as e:  # the whole batch is lost to nvJPEG; decode it here
                self.stats.fallback_reason = f"nvJPEG failed on a batch: {e}"[:300]
        else:
            self.stats.fallback_reason = self._why_cpu
        self.stats.images_on_cpu += len(blobs)
        return [decode_on_cpu(blob).to(self.device, non_blocking=True) for blob in blobs]

    def augment(self, images: list[torch.Tensor], boxes: list[CropBox],
                flips: list[bool]) -> torch.Tensor:
        """Crop each image at its box, resize it to the split's crop (bilinear, antialiased:
        the filter Pillow's resize applies when it shrinks), flip the chosen ones, scale to
        [0, 1] and normalize.

        Args:
            images: 3 × H × W uint8 tensors on the device.
            boxes: one (left, top, width, height) per image.
            flips: one left-right flip flag per image.

        Returns:
            The batch, N × 3 × crop × crop float32 on the device.
        """
        side = self.split.crop
        out = torch.empty(len(images), 3, side, side, dtype=torch.float32, device=self.device)
        for k, (image, (left, top, width, height), flip) in enumerate(
                zip(images, boxes, flips, strict=True)):
            region = image[:, top:top + height, left:left + width].unsqueeze(0).float()
            resized = F.interpolate(region, size=(side, side), mode="bilinear",
                                    align_corners=False, antialias=True)[0]
            # flipped image by image: an index tensor of the flipped rows would be a copy from
            # host memory, which waits for the device
            out[k] = resized.flip(-1) if flip else resized
        return out.div_(255.0).sub_(self._mean).div_(self._std)

    def __call__(self, batch: Any) -> Any:
        if not (isinstance(batch, tuple | list) and len(batch) == 2
                and isinstance(batch[0], EncodedBatch)):
            return batch
        encoded, labels = batch
        images = self.decode(encoded.blobs)
        boxes, flips = draw_augmentations(self.split, images)
        self.stats.batches += 1
        if isinstance(labels, torch.Tensor):
            labels = labels.to(self.device, non_blocking=True)
        return self.augment(images, boxes, flips), labels


def cpu_sample(split: JpegSplit, blob: torch.Tensor, box: CropBox, flip: bool) -> torch.Tensor:
    """One sample as the CPU path makes it (Pillow decode, crop and resize, flip, normalize),
    for the given box and flip: what the device path is compared with.

    Args:
        split: how the samples are made.
        blob: the encoded image.
        box: (left, top, width, height) of the crop.
        flip: whether to flip it left-right.

    Returns:
        3 × crop × crop float32, normalized.
    """
    img = pillow_resized_crop(pillow_rgb(blob.numpy().tobytes()), box, split.crop)
    if flip:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    x = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float().div_(255)
    mean = torch.tensor(split.mean).view(3, 1, 1)
    std = torch.tensor(split.std).view(3, 1, 1)
    return (x - mean) / std


@dataclass(frozen=True, slots=True, kw_only=True)
class PathAgreement:
    """The device path's samples against the CPU path's, same boxes and flips, in 8-bit pixel
    levels (the normalization undone)."""

    images: int
    mean_abs_levels: float
    """Mean |device − CPU| over every pixel and channel."""
    max_abs_levels: float
    """Largest |device − CPU| of any pixel and channel."""
    p99_abs_levels: float
    """99th percentile of |device − CPU|."""
    worst_image_mean_levels: float
    """The largest of the images' own mean |device − CPU|."""

    @property
    def close(self) -> bool:
        """Within what two JPEG decoders and two resize filters differ by (see
        :data:`MEAN_LEVELS_MAX`, :data:`P99_LEVELS_MAX`, :data:`IMAGE_MEAN_LEVELS_MAX`)."""
        return (self.mean_abs_levels <= MEAN_LEVELS_MAX and self.p99_abs_levels <= P99_LEVELS_MAX
                and self.worst_image_mean_levels <= IMAGE_MEAN_LEVELS_MAX)


# Two correct paths differ by the decoders' IDCT rounding (a level or two) and, at hard colour
# edges, by their chroma upsampling: JPEG stores colour at half resolution (4:2:0) and
# libjpeg-turbo, under Pillow, interpolates it ("fancy upsampling", its default) where nvJPEG
# replicates it, so pixels on such an edge differ by up to half the colour step. On an H200,
# nvJPEG against Pillow over vision-large's JPEGs (hard-edged blobs on gradients) measured a mean
# of 1.0 level and a 99th percentile of 9.7. A wrong channel order, crop or flip moves the mean
# by tens of levels, and a wrong image within the batch moves its own mean as much.
MEAN_LEVELS_MAX = 2.0
"""Largest mean |device − CPU| pixel difference, in 8-bit levels, for the paths to agree."""
P99_LEVELS_MAX = 16.0
"""Largest 99th-percentile |device − CPU| pixel difference, in 8-bit levels."""
IMAGE_MEAN_LEVELS_MAX = 4.0
"""Largest mean |device − CPU| of any one image, in 8-bit levels."""


def compare_paths(split: JpegSplit, device: torch.device | str, samples: int = 8,
                  seed: int = 0, decoder: DeviceDecoder | None = None) -> PathAgreement:
    """Make the first ``samples`` samples through both paths with the same random boxes and
    flips, and measure how far the device path's pixels are from the CPU path's.

    Args:
        split: how the samples are made.
        device: where the device path runs.
        samples: how many samples to compare (fewer if the source has fewer).
        seed: seeds the boxes and flips.
        decoder: the device path to check; None = a :class:`DeviceDecoder` on ``device``.

    Returns:
        The differences, in 8-bit levels.
    """
    decoder = decoder or DeviceDecoder(split, device)
    data = EncodedJpegs(split, len(split.source))
    blobs = [data[k][0] for k in range(min(samples, len(data)))]
    images = decoder.decode(blobs)
    boxes, flips = draw_augmentations(split, images, random.Random(seed))
    on_device = decoder.augment(images, boxes, flips).cpu()
    on_cpu = torch.stack([cpu_sample(split, blob, box, flip)
                          for blob, box, flip in zip(blobs, boxes, flips, strict=True)])
    std = torch.tensor(split.std).view(1, 3, 1, 1)
    per_image = ((on_device - on_cpu) * std * 255).abs()
    diff = per_image.flatten()
    return PathAgreement(images=len(blobs), mean_abs_levels=float(diff.mean()),
                         max_abs_levels=float(diff.max()),
                         p99_abs_levels=float(torch.quantile(diff[:2**24].float(), 0.99)),
                         worst_image_mean_levels=float(per_image.flatten(1).mean(1).max()))
