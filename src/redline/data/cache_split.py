"""The decode cache as a tuning knob: a dataset's per-sample work split into the part that is
the same every epoch (decode, resize) and the part that is not (crop, flip), so the first can
be kept in a :class:`~redline.data.cache.CachedDataset` and the loader served from it.

A training setup declares the split (:class:`CacheSplit`); ``redline tune`` fills a store once,
times the fill (:func:`fill`), measures the cached pipeline against the uncached one and keeps
it only when the planned run is shorter with the fill included, as for ``torch.compile``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

from redline.data.cache import CachedDataset
from redline.data.stores import Store


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheSplit:
    """How a dataset's samples are made: ``random(deterministic(source[index(i)]))`` is sample
    ``i`` of the training loader's dataset (the same distribution: the random part may draw
    other numbers)."""

    source: Any
    """A map-style dataset of the raw items (encoded images and their labels, token files):
    what the deterministic part starts from."""
    deterministic: Callable[[Any], Any]
    """The part whose output is the same every time for the same item (decode, resize): it
    runs once per item and its output is stored. It must not draw random numbers."""
    random: Callable[[Any], Any] | None = None
    """The part that runs on every access, after the cache (random crop, flip, normalize)."""
    index: Callable[[int], int] | None = None
    """The source item of the loader's sample ``i``, for a dataset that visits its items more
    than once per epoch (None: the same index). Picklable (a module-level function or class)
    where the loader spawns its workers."""

    def __post_init__(self) -> None:
        src = self.source
        # A class (not an instance), a string (a path, not its dataset) and an IterableDataset
        # (torch's Dataset base gives it a __getitem__ that raises) all have both methods.
        if (isinstance(src, type | str | bytes | IterableDataset)
                or not hasattr(src, "__getitem__") or not hasattr(src, "__len__")):
            got = f"the class {src.__name__}" if isinstance(src, type) else type(src).__name__
            raise TypeError(f"CacheSplit.source must be a map-style dataset (an instance with "
                            f"__getitem__ and __len__), got {got}")
        if not callable(self.deterministic):
            raise TypeError(f"CacheSplit.deterministic must be callable, got "
                            f"{type(self.deterministic).__name__}")
        for name in ("random", "index"):
            f = getattr(self, name)
            if f is not None and not callable(f):
                raise TypeError(f"CacheSplit.{name} must be callable or None, got "
                                f"{type(f).__name__}")


class Reindexed(Dataset[Any]):
    """Sample ``i`` is ``dataset[index(i)]``, over ``length`` samples."""

    def __init__(self, dataset: Any, length: int, index: Callable[[int], int]) -> None:
        self.dataset, self.length, self.index = dataset, length, index

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        return self.dataset[self.index(int(i))]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """A batch in one read of the dataset's batched path where it has one (a
        CachedDataset's: one store round trip), as the DataLoader asks for it."""
        many = getattr(self.dataset, "__getitems__", None)
        if many is None:
            return [self[i] for i in indices]
        return list(many([self.index(int(i)) for i in indices]))


def cached_dataset(split: CacheSplit, length: int,
                   store: str | os.PathLike[str] | Store | None = None) -> Any:
    """The training dataset served through a cache of the deterministic part: ``length``
    samples (the loader's dataset's length), the store at ``store`` (default: CachedDataset's,
    :func:`redline.data.store_place.default_placement`)."""
    cached = CachedDataset(split.source, split.deterministic, split.random, store=store)
    if split.index is None:
        if len(cached) != length:
            raise ValueError(
                f"the cache split's source has {len(cached):,} items and the loader's dataset "
                f"{length:,} samples: give CacheSplit an index (the source item of each "
                "sample) when the dataset visits its items more than once")
        return cached
    return Reindexed(cached, length, split.index)


class _Fill(Dataset[int]):
    def __init__(self, cached: CachedDataset) -> None:
        self.cached = cached

    def __len__(self) -> int:
        return len(self.cached)

    def __getitem__(self, k: int) -> int:
        self.cached.get_deterministic(int(k))  # computes and stores the deterministic part once
        return 0


def fill(dataset: Any, num_workers: int = 0) -> tuple[float, int]:
    """Compute and store the deterministic part of every source item once (``num_workers``
    processes, as the loader would); returns (wall seconds, items). ``dataset`` is what
    :func:`cached_dataset` returned."""
    cached: CachedDataset = dataset.dataset if isinstance(dataset, Reindexed) else dataset
    t0 = time.perf_counter()
    loader = DataLoader(_Fill(cached), batch_size=None, num_workers=num_workers)
    for _ in loader:
        pass
    cached.flush()
    return time.perf_counter() - t0, len(cached)
