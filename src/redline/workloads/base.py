"""A built-in workload: model, data, optimizer and the plain loop that trains it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from redline.data.cache_split import CacheSplit
from redline.data.device_decode import JpegSplit


@dataclass(slots=True, kw_only=True)
class Workload:
    """Everything a training loop needs; built by a workload's ``build_*`` function."""

    name: str
    model: torch.nn.Module
    loader: DataLoader[Any]
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[torch.nn.Module, Any, torch.device], torch.Tensor]
    """Forward and loss for one batch (moves the batch to the device)."""
    device: torch.device
    accumulation_steps: int = 1
    """Micro-batches per optimizer step (effective batch = loader batch × this)."""
    cache_split: CacheSplit | None = None
    """The dataset's deterministic and random parts, where it declares them (the decode
    cache knob of ``redline tune``)."""
    jpeg_split: JpegSplit | None = None
    """How the samples are made from JPEGs, where they are (the GPU decode knob of
    ``redline tune``)."""


def batches(loader: DataLoader[Any]) -> Iterator[Any]:
    """Endless batches, epoch after epoch (a new ``iter(loader)`` per epoch, as users write)."""
    while True:
        yield from loader


def train(w: Workload, steps: int) -> float:
    """The plain loop (no redline calls in it), with gradient accumulation as users write it:
    ``steps`` optimizer steps; returns the last micro-batch's loss.

    Args:
        w: the workload (model, loader, optimizer, loss, accumulation steps).
        steps: optimizer steps to run.

    Returns:
        The last micro-batch's loss, unscaled by the accumulation (0.0 when ``steps`` is 0).
    """
    w.model.train()
    loss = torch.zeros(())
    it = batches(w.loader)
    for _ in range(steps):
        w.optimizer.zero_grad(set_to_none=True)
        for _ in range(w.accumulation_steps):
            loss = w.loss_fn(w.model, next(it), w.device)
            (loss / w.accumulation_steps).backward()
        w.optimizer.step()
    return float(loss.detach())
