"""The factory contract of ``redline tune``: what a training script hands over to be tuned.

A script exposes a function (default name ``redline_setup``) that takes no arguments and
returns a :class:`TrainSetup`. ``redline tune`` calls it once per isolated trial, so it must
build everything afresh (model, optimizer, loader) and should seed its RNGs: trials are then
compared from the same initial weights and data.

    def redline_setup() -> redline.tune.TrainSetup:
        torch.manual_seed(0)
        model = Net()
        return redline.tune.TrainSetup(
            model=model,
            optimizer=torch.optim.AdamW(model.parameters(), lr=3e-4),
            loader=DataLoader(ds, batch_size=32, shuffle=True),
            loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
            accumulation_steps=2,
        )

The script is loaded with ``__name__ == "__redline_tune__"``, so a ``if __name__ ==
"__main__":`` training block does not run; the user's files are only read, never written.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from redline.core.errors import RedlineError
from redline.data.cache_split import CacheSplit

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


class SetupError(RedlineError, RuntimeError):
    """The factory or what it returned cannot be used; the message says what to change."""


@dataclass(kw_only=True, slots=True)
class TrainSetup:
    """One training configuration, as the user's loop runs it."""

    model: torch.nn.Module
    """The model, already on ``device``."""
    optimizer: torch.optim.Optimizer
    """Its optimizer, built over ``model.parameters()`` and not yet stepped."""
    loader: DataLoader[Any]
    """The training DataLoader, with the user's settings (rebuilt with tuned ones)."""
    loss_fn: LossFn
    """``loss_fn(model, batch) -> loss``: forward and a *mean-reduced* loss for one batch that
    is already on ``device`` (the mean is what makes micro-batch weighting exact)."""
    device: str = "cpu"
    """Where the model trains: 'cpu', 'cuda', 'cuda:1'."""
    accumulation_steps: int = 1
    """Micro-batches per optimizer step in the user's loop: the effective batch is
    ``loader.batch_size × accumulation_steps`` and is kept exactly."""
    run_steps: int | None = None
    """Optimizer steps of the planned job: amortizes compile time and projects job time, cost
    and energy. None = 10,000 (said in the report)."""
    memory_limit_bytes: int | None = None
    """Device memory the batch finder may use. On CPU it is enforced by a simulated budget
    (:class:`redline.tune.MemoryBudget`); None on CPU = no memory limit (the micro-batch is
    then bounded only by the effective batch); None on CUDA = the device's free memory."""
    cache_split: CacheSplit | None = None
    """Which part of the dataset's per-sample work is deterministic (decode, resize) and which
    is random (:class:`redline.data.CacheSplit`): the path then tries serving the loader from
    a cache of the deterministic part (filled once, the fill counted against the planned
    run). None: the decode cache is not tried (it is not tried either for a dataset that is
    already a ``CachedDataset``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            raise SetupError(f"TrainSetup.model must be a torch.nn.Module, got "
                             f"{type(self.model).__name__}")
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise SetupError(f"TrainSetup.optimizer must be a torch.optim.Optimizer, got "
                             f"{type(self.optimizer).__name__}")
        if not isinstance(self.loader, DataLoader):
            raise SetupError(f"TrainSetup.loader must be a torch DataLoader, got "
                             f"{type(self.loader).__name__}")
        if self.loader.batch_size is None:
            raise SetupError("TrainSetup.loader has batch_size=None (a custom batch sampler): "
                             "redline needs a DataLoader built with batch_size=N to change the "
                             "micro-batch")
        if not callable(self.loss_fn):
            raise SetupError("TrainSetup.loss_fn must be callable as loss_fn(model, batch)")
        if self.accumulation_steps < 1:
            raise SetupError(f"accumulation_steps must be >= 1, got {self.accumulation_steps}")
        if self.run_steps is not None and self.run_steps < 1:
            raise SetupError(f"run_steps must be >= 1 or None, got {self.run_steps}")
        if self.memory_limit_bytes is not None and self.memory_limit_bytes <= 0:
            raise SetupError(f"memory_limit_bytes must be > 0 or None, got "
                             f"{self.memory_limit_bytes}")
        torch.device(self.device)  # raises on a malformed device string
        if self.cache_split is not None and not isinstance(self.cache_split, CacheSplit):
            raise SetupError(f"TrainSetup.cache_split must be a redline.data.CacheSplit, got "
                             f"{type(self.cache_split).__name__}")

    @property
    def micro_batch(self) -> int:
        assert self.loader.batch_size is not None
        return int(self.loader.batch_size)

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.accumulation_steps


Factory = Callable[[], TrainSetup]


def call_factory(factory: Factory, what: str = "the factory") -> TrainSetup:
    """Call ``factory`` and check what it returned; any error becomes a :class:`SetupError`
    that names the factory and the original error."""
    try:
        setup = factory()
    except SetupError:
        raise
    except Exception as e:
        raise SetupError(f"{what} raised {type(e).__name__}: {e}. redline calls it with no "
                         "arguments once per trial; fix the error (run the script alone to "
                         "see the full traceback)") from e
    if not isinstance(setup, TrainSetup):
        raise SetupError(f"{what} returned {type(setup).__name__}, expected "
                         "redline.tune.TrainSetup(model=..., optimizer=..., loader=..., "
                         "loss_fn=...)")
    return setup


def load_factory(script: str, name: str = "redline_setup") -> Factory:
    """The factory function ``name`` of the script at ``script`` (run as a module whose
    ``__name__`` is ``"__redline_tune__"``: its ``__main__`` block does not run)."""
    if not os.path.isfile(script):
        raise SetupError(f"no such script: {script!r} (expected a Python file that defines "
                         f"{name}() returning a redline.tune.TrainSetup)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        ns = runpy.run_path(script, run_name="__redline_tune__")
    except SystemExit as e:
        raise SetupError(f"{script} called sys.exit({e.code}) while being imported; move the "
                         "training code under `if __name__ == \"__main__\":`") from None
    except Exception as e:
        raise SetupError(f"importing {script} raised {type(e).__name__}: {e}") from e
    finally:
        sys.path.pop(0)
    fn = ns.get(name)
    if fn is None or not callable(fn):
        found = sorted(k for k, v in ns.items() if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == "__redline_tune__")
        raise SetupError(f"{script} defines no function {name}(); expected one that returns "
                         f"redline.tune.TrainSetup (functions found: {', '.join(found) or 'none'}"
                         "; pick one with --factory)")
    return fn  # type: ignore[no-any-return]
