"""A larger effective batch, only where the user allows it (``redline tune
--allow-batch-change``): the optimization changes, so the learning rate is rescaled by a stated
rule and the result is checked against the user's batch over the same samples.

Rules (the ratio ``r`` = new effective batch ÷ the user's):

- **linear** for SGD (with or without momentum): learning rate × r, reached by a linear
  warm-up from the user's rate over the first 5 % of the run's steps (Goyal et al., "Accurate,
  Large Minibatch SGD: Training ImageNet in 1 Hour", 2017, §2.1–2.2: linear scaling with a
  gradual warm-up of 5 of 90 epochs).
- **square root** for the adaptive family (Adam, AdamW, Adamax, NAdam, RAdam, Adagrad,
  RMSprop): learning rate × √r (Malladi et al., "On the SDEs and Scaling Rules for Adaptive
  Gradient Algorithms", NeurIPS 2022; Hoffer et al., "Train longer, generalize better", 2017),
  no warm-up of its own.

Other optimizers have no stated rule here: the batch is not changed for them. Where the guard
refuses a ratio, half of it is tried, down to 2.

The guard trains the user's batch for ``k·r`` steps and the larger one for ``k`` steps from the
same weights, on the same samples (each larger batch is ``r`` of the user's, concatenated), and
reads the loss of both on the same held-out batch, and before either trained: the larger batch
passes if its loss fell by at least ``min_progress`` of what the user's batch's fell (a rate
too large to be stable makes it rise, or NaN).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from redline.data.prefetcher import map_tensors
from redline.tune.accumulate import train_step
from redline.tune.precision import restored

MAX_GROWTH = 8
"""The effective batch grows at most 8-fold: Goyal et al. kept ImageNet's accuracy to a 32-fold
growth (256 → 8k) with these rules, but closer to the user's batch the rules are better tested
on more models, and fewer steps per sample leave less room for a learning-rate schedule."""

GUARD_STEPS = 8
"""Steps of the larger batch in the guard (the user's batch takes ``r`` times as many): a
momentum buffer or Adam's moment estimates settle over steps, so fewer would hold the larger
batch's first steps against it."""

WARMUP_SHARE = 0.05
"""The linear rule's warm-up: 5 % of the run's steps (5 of Goyal et al.'s 90 epochs)."""

_ADAPTIVE = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "RMSprop")


@dataclass(frozen=True, slots=True, kw_only=True)
class LrRule:
    """How the learning rate follows the batch, and where the rule comes from."""

    name: str
    """'linear' or 'sqrt'."""
    source: str

    def scale(self, ratio: float) -> float:
        return ratio if self.name == "linear" else math.sqrt(ratio)

    def warmup_steps(self, run_steps: int) -> int:
        return max(1, round(WARMUP_SHARE * run_steps)) if self.name == "linear" else 0


LINEAR = LrRule(name="linear", source="Goyal et al. 2017, linear scaling with gradual warm-up")
SQRT = LrRule(name="sqrt", source="Malladi et al. 2022, square-root scaling for adaptive methods")


def lr_rule(optimizer: torch.optim.Optimizer) -> LrRule | None:
    """The rule for this optimizer's class (by its base classes' names too), or None."""
    names = {cls.__name__ for cls in type(optimizer).__mro__}
    if "SGD" in names:
        return LINEAR
    if names & set(_ADAPTIVE):
        return SQRT
    return None


def concat(batches: Sequence[Any]) -> Any:
    """One batch made of several (tensors concatenated along the batch dimension, nested in
    tuples, lists and dicts as the loader collates them). Raises TypeError for anything else."""
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(list(batches))
    if isinstance(first, tuple | list):
        return type(first)(concat([batch[index] for batch in batches])
                           for index in range(len(first)))
    if isinstance(first, dict):
        return {index: concat([batch[index] for batch in batches]) for index in first}
    raise TypeError(f"cannot join batches of {type(first).__name__}")


@dataclass(slots=True, kw_only=True)
class BatchChangeCheck:
    """The guard's verdict for one larger effective batch."""

    from_batch: int
    to_batch: int
    lr_scale: float
    samples: int
    """Samples both sides trained on before the held-out loss was read."""
    heldout_loss_start: float
    """The held-out loss before either side trained."""
    heldout_loss_before: float
    """…after the user's batch trained on the samples."""
    heldout_loss_after: float
    """…after the larger batch trained on the same samples."""
    progress: float
    """The larger batch's fall of the held-out loss ÷ the user's batch's."""
    passed: bool
    reason: str


def _heldout(model: torch.nn.Module, batch: Any,
             loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]) -> float:
    with torch.no_grad():
        return float(loss_fn(model, batch))


def check_batch_change(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                       batches: Sequence[Any], *, heldout: Any, effective: int, ratio: int,
                       micro: int, to_micro: int,
                       loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
                       lr_scale: float, min_progress: float,
                       device: torch.device | None = None) -> BatchChangeCheck:
    """Train on ``batches`` (the user's effective batches, a multiple of ``ratio`` of them) at
    the user's batch, then from the same start on the same samples ``ratio`` at a time with the
    learning rate × ``lr_scale`` (no warm-up: the scaled rate itself is what is checked);
    compare the held-out loss. Batches are moved to ``device`` as they are used (None: where
    they are). ``model`` and ``optimizer`` are left as they were."""
    def on(batch: Any) -> Any:
        return batch if device is None else map_tensors(batch, lambda tensor: tensor.to(device))

    used = len(batches) // ratio * ratio
    if used == 0:
        raise ValueError(f"need at least {ratio} batches, got {len(batches)}")
    heldout = on(heldout)
    start = _heldout(model, heldout, loss_fn)
    with restored(model, optimizer) as reset:
        for batch in batches[:used]:
            train_step(model, optimizer, on(batch), micro, loss_fn)
        before = _heldout(model, heldout, loss_fn)
        reset()
        for group in optimizer.param_groups:
            # undone on exit: the optimizer's state holds its rates
            group["lr"] = group["lr"] * lr_scale
        for first in range(0, used, ratio):
            train_step(model, optimizer, on(concat(batches[first:first + ratio])), to_micro,
                       loss_fn)
        after = _heldout(model, heldout, loss_fn)
    samples = used * effective
    fell = start - before
    if not math.isfinite(after):
        progress = -math.inf
    elif fell > 0:
        progress = (start - after) / fell
    else:  # the user's batch made no progress on these samples: the larger must not lose any
        progress = 1.0 if after <= start else -math.inf
    passed = math.isfinite(before) and progress >= min_progress
    common = (f"held-out loss {start:.4g} → {before:.4g} at the user's batch ({used} steps) and → "
              f"{after:.4g} at the larger one ({used // ratio} steps, learning rate × "
              f"{lr_scale:.3g}) over the same {samples:,} samples")
    reason = (f"{common}: {progress:.0%} of the user's progress (≥ {min_progress:.0%})"
              if passed else
              f"refused: {common}: " + ("not finite" if not math.isfinite(after) else
                                        f"{progress:.0%} of the user's progress")
              + f" (needs ≥ {min_progress:.0%})")
    return BatchChangeCheck(from_batch=effective, to_batch=effective * ratio, lr_scale=lr_scale,
                            samples=samples, heldout_loss_start=start, heldout_loss_before=before,
                            heldout_loss_after=after, progress=progress, passed=passed, reason=reason)
