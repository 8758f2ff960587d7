"""A built-in workload: model, data, optimizer and the plain loop that trains it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader


@dataclass(slots=True)
class Workload:
    """Everything a training loop needs; built by a workload's ``build_*`` function."""

    name: str
    model: torch.nn.Module
    loader: DataLoader[Any]
    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[torch.nn.Module, Any, torch.device], torch.Tensor]
    """Forward and loss for one batch (moves the batch to the device)."""
    device: torch.device


def batches(loader: DataLoader[Any]) -> Iterator[Any]:
    """Endless batches, epoch after epoch (a new ``iter(loader)`` per epoch, as users write)."""
    while True:
        yield from loader


def train(w: Workload, steps: int) -> float:
    """The plain loop (no redline calls in it): returns the last loss."""
    w.model.train()
    loss = torch.zeros(())
    it = batches(w.loader)
    for _ in range(steps):
        batch = next(it)
        loss = w.loss_fn(w.model, batch, w.device)
        w.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        w.optimizer.step()
    return float(loss.detach())
