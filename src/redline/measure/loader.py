"""What a DataLoader is configured to do, and what its batches look like."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from redline.core.loader import LoaderSettings

COPY_ON_ACCESS_MIN_ITEMS = 100_000
"""A Python container this long in a Dataset is flagged when workers fork: reading each item
bumps its refcount and dirties its page, so each worker ends up with a private copy
(pytorch#13246)."""


@dataclass(slots=True, kw_only=True)
class ContainerAttr:
    """A Python container attribute of a dataset, a candidate for copy-on-access."""

    path: str
    """Attribute path from the dataset, e.g. 'dataset.samples'."""
    type: str
    items: int
    est_bytes: int
    """Estimated bytes of the container and its items (sampled sys.getsizeof)."""


@dataclass(slots=True, kw_only=True)
class LoaderInfo:
    """Configuration and behaviour of one DataLoader seen by the watch."""

    batch_size: int | None
    settings: LoaderSettings
    dataset_type: str
    multiprocessing_context: str | None
    iterators: int = 0
    """How many times ``iter(loader)`` ran (epochs, roughly)."""
    worker_starts: int = 0
    """How many of those started worker processes."""
    startup_s: list[float] = field(default_factory=list)
    """Per started iterator: seconds in iter() plus the first batch (worker start-up)."""
    worker_pids: set[int] = field(default_factory=set)
    """Process ids of the worker processes its iterators started (told apart from the job's
    other child processes, which compete with it for CPUs)."""
    batch_bytes: int | None = None
    """Tensor bytes of the first batch seen."""
    containers: list[ContainerAttr] = field(default_factory=list)
    cache: Any = None
    """The loader's redline.data.CachedDataset, if it reads through one (for its statistics)."""
    evaluation_iterators: int = 0
    """Of ``iterators``, those whose first batch fed an evaluation forward (a validation
    loader's): never the loader the report describes while a training one was seen."""
    training: bool = False
    """Named the training loader by the caller (a framework callback that knows it), so it
    is the one the report describes even when another loader was iterated first."""
    loader: Any = None
    """The DataLoader itself, kept only when asked (``WatchConfig.keep_loaders``), to rebuild it
    with other settings after the run."""


def _sizeof_container(obj: Any, sample: int = 64) -> int:
    n_items = len(obj)
    base = sys.getsizeof(obj)
    if n_items == 0:
        return base
    items = list(obj.items())[:sample] if isinstance(obj, dict) else list(obj)[:sample]
    per = sum(sys.getsizeof(i) for i in items) / len(items)
    return int(base + per * n_items)


def find_python_containers(dataset: Any, min_items: int = COPY_ON_ACCESS_MIN_ITEMS,
                           depth: int = 2, prefix: str = "dataset") -> list[ContainerAttr]:
    """Large list/dict/tuple/set attributes of a dataset (and of datasets it wraps)."""
    found: list[ContainerAttr] = []
    try:
        attrs = vars(dataset)
    except TypeError:
        return found
    for name, value in attrs.items():
        path = f"{prefix}.{name}"
        if isinstance(value, list | tuple | dict | set) and len(value) >= min_items:
            found.append(ContainerAttr(path=path, type=type(value).__name__, items=len(value),
                                       est_bytes=_sizeof_container(value)))
        elif depth > 0 and isinstance(value, torch.utils.data.Dataset):
            found.extend(find_python_containers(value, min_items, depth - 1, path))
    return found


def loader_info(loader: DataLoader[Any]) -> LoaderInfo:
    num_workers = int(loader.num_workers)
    ctx = loader.multiprocessing_context
    ctx_name = None
    if num_workers > 0:
        ctx_name = ctx.get_start_method() if ctx is not None else _default_start_method()
    return LoaderInfo(
        batch_size=loader.batch_size,
        settings=LoaderSettings.of(loader),
        dataset_type=type(loader.dataset).__name__,
        multiprocessing_context=ctx_name,
        containers=find_python_containers(loader.dataset) if num_workers > 0 else [],
        cache=loader.dataset if hasattr(loader.dataset, "stats") and hasattr(
            loader.dataset, "fingerprint") else None,
    )


def _default_start_method() -> str | None:
    import multiprocessing

    return multiprocessing.get_start_method(allow_none=True) or "fork"


def first_tensor(batch: Any, depth: int = 4) -> torch.Tensor | None:
    """The first tensor in a (nested) batch: its leading dimension is the batch size."""
    if isinstance(batch, torch.Tensor):
        return batch
    if depth == 0:
        return None
    if isinstance(batch, Mapping):
        for item in batch.values():
            found = first_tensor(item, depth - 1)
            if found is not None:
                return found
    elif isinstance(batch, list | tuple):
        for item in batch:
            found = first_tensor(item, depth - 1)
            if found is not None:
                return found
    elif hasattr(batch, "__dataclass_fields__"):
        for name in batch.__dataclass_fields__:
            found = first_tensor(getattr(batch, name), depth - 1)
            if found is not None:
                return found
    return None


def batch_samples(batch: Any) -> int | None:
    """The batch's leading dimension (None for a batch without a tensor, or a 0-d one)."""
    # This runs at every fetch: the usual batches (a tensor, a tuple or list of tensors, a dict
    # of them) are read without the recursion and its abstract-base-class checks.
    lead = batch
    kind = type(lead)
    if (kind is tuple or kind is list) and lead:
        lead = lead[0]
    elif kind is dict and lead:
        lead = next(iter(lead.values()))
    if type(lead) is not torch.Tensor:
        lead = first_tensor(batch)
    if lead is None or lead.dim() == 0:
        return None
    return int(lead.shape[0])


def batch_nbytes(batch: Any, depth: int = 4) -> int:
    """Bytes of all tensors in a (nested) batch."""
    if isinstance(batch, torch.Tensor):
        return batch.numel() * batch.element_size()
    if depth == 0:
        return 0
    if isinstance(batch, Mapping):
        return sum(batch_nbytes(item, depth - 1) for item in batch.values())
    if isinstance(batch, list | tuple):
        return sum(batch_nbytes(item, depth - 1) for item in batch)
    if hasattr(batch, "__dataclass_fields__"):
        return sum(batch_nbytes(getattr(batch, field), depth - 1) for field in batch.__dataclass_fields__)
    return 0
