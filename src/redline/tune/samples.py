"""What the tuning path reads from a setup: a fresh one per trial, its first batches, a batch of
any size built from its largest sample, and the tensors that persist between its steps."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.utils.data import DataLoader

from redline.core.loader import LoaderSettings
from redline.data.autotune import rebuild_factory
from redline.data.prefetcher import map_tensors
from redline.measure.loader import batch_nbytes
from redline.tune.setup import Factory, SetupError, TrainSetup, call_factory


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Tensors that persist between steps: parameters, buffers, optimizer state."""
    tensors = list(model.parameters()) + list(model.buffers())
    for state in optimizer.state.values():
        tensors += [value for value in state.values() if isinstance(value, torch.Tensor)]
    return tensors


def fresh(factory: Factory) -> TrainSetup:
    return call_factory(factory, "the setup factory")


def endless(loader: Any) -> Any:
    while True:
        count = 0
        for batch in loader:
            count += 1
            yield batch
        if count == 0:
            raise SetupError("the DataLoader yielded no batch (an empty dataset, or drop_last "
                             "with fewer samples than one effective batch)")


def first_batches(loader: DataLoader[Any], batch_size: int, count: int) -> list[Any]:
    """The first ``n`` batches of ``batch_size`` from a worker-less copy of the user's loader
    (its dataset, sampler and collate; again from the start when it runs out), on the host."""
    plain = rebuild_factory(loader, batch_size=batch_size)(LoaderSettings())
    return list(itertools.islice(endless(plain), count))



def probe_batch(setup: TrainSetup, device: torch.device, scan: int = 256,
                ) -> tuple[Any, str]:
    """A maker of batches of any size built from the dataset's largest sample (by bytes), and
    how it was found. Variable-length data then cannot exceed what the batch finder probed."""
    dataset = setup.loader.dataset
    collate = setup.loader.collate_fn
    length = (len(dataset) if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
              else None)
    if length:
        scanned = min(length, scan)
        idx = sorted({round(i * (length - 1) / max(1, scanned - 1)) for i in range(scanned)})
        sizes = [(batch_nbytes(dataset[i]), i) for i in idx]
        size, best = max(sizes)
        sample = dataset[best]
        how = (f"largest of {len(idx)} samples scanned of {length} (index {best}, "
               f"{size / 1024:,.1f} KiB)")
    else:
        first = next(iter(DataLoader(dataset, batch_size=1, collate_fn=lambda samples: samples)))
        sample = first[0]
        how = "first sample of an iterable dataset (sizes cannot be scanned)"

    def make(batch_size: int) -> Any:
        with torch.no_grad():
            return map_tensors(collate([sample] * batch_size),
                               lambda tensor: tensor.to(device, non_blocking=True))

    return make, how

