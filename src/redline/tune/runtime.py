"""Apply a plan to a plain PyTorch loop: a few lines, no framework.

    plan = redline.tune.load_plan("redline-plan.json")
    tuned = redline.tune.apply_plan(plan, model, optimizer, loader, loss_fn, device="cuda")
    for batch in tuned.loader:           # effective batches, on the device
        loss = tuned.step(batch)         # micro-batches, autocast/scaler, optimizer step

``tuned.model`` / ``tuned.optimizer`` are what to save in checkpoints (the compiled or
channels-last model shares its parameters with ``model``; ``tuned.optimizer`` is ``optimizer``
itself, switched in place to a fused or foreach implementation before any step, so a learning
rate scheduler built on it keeps driving it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from redline.data.autotune import rebuild_factory
from redline.data.cache_split import CacheSplit
from redline.data.device_decode import JpegSplit
from redline.data.prefetcher import DevicePrefetcher, map_tensors
from redline.measure.ranks import rank_info
from redline.tune.accumulate import train_step
from redline.tune.knob import LoopParts
from redline.tune.knobs import KNOBS
from redline.tune.knobs.batch_change import lr_factor
from redline.tune.tuned import TunePlanMismatchError, check_plan, plan_key

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


def _schedulers_to_scale(plan: TunePlan, optimizer: torch.optim.Optimizer,
                         schedulers: Iterable[Any]) -> list[Any]:
    """The schedulers whose base rates the plan's ``lr_scale`` scales; refuses one built on
    another optimizer, and, where the plan scales the rate, a scheduler already built on
    ``optimizer`` (every torch scheduler sets its groups' ``initial_lr``) and not passed."""
    passed = list(schedulers)
    for sch in passed:
        if getattr(sch, "optimizer", None) is not optimizer:
            raise TunePlanMismatchError(
                f"the scheduler {type(sch).__name__} passed to apply_plan was built on another "
                "optimizer: pass the schedulers of the optimizer given to apply_plan")
    # a plan applied before set initial_lr itself, to the scaled rate (see _scale_schedulers)
    ours = getattr(optimizer, "_redline_lr_scale", None) is not None
    if plan.lr_scale != 1.0 and not passed and not ours and any(
            "initial_lr" in group for group in optimizer.param_groups):
        raise TunePlanMismatchError(
            f"the plan scales the learning rate × {plan.lr_scale:.4g} (its effective batch is "
            f"{plan.effective_batch}) and a learning-rate scheduler was already built on this "
            "optimizer: its base rates are the unscaled ones, so its next step would undo the "
            "scale. Pass it, apply_plan(..., schedulers=[your_scheduler]), to have its base "
            "rates scaled too, or build it after apply_plan")
    return passed


def _scale_schedulers(plan: TunePlan, tuned: TunedLoop, schedulers: list[Any]) -> None:
    """Scale the passed schedulers' base rates (once each), and set every group's
    ``initial_lr`` — where a scheduler built later reads its base rate — to the scaled rate
    (the same on a second apply_plan: nothing is scaled twice)."""
    if tuned._target_lrs is None:
        return
    optimizer = tuned.optimizer
    optimizer._redline_lr_scale = plan.lr_scale  # type: ignore[attr-defined]
    for group, target in zip(optimizer.param_groups, tuned._target_lrs, strict=True):
        group["initial_lr"] = target
    for sch in schedulers:
        if hasattr(sch, "base_lrs") and not getattr(sch, "_redline_lr_scaled", False):
            sch.base_lrs = [base_lr * plan.lr_scale for base_lr in sch.base_lrs]
            sch._redline_lr_scaled = True


class _OnDevice(Iterable[Any]):
    """Moves CPU batches to the device (the non-CUDA counterpart of DevicePrefetcher)."""

    def __init__(self, loader: Iterable[Any], device: torch.device) -> None:
        self.loader, self.device = loader, device

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield map_tensors(batch, lambda tensor: tensor.to(self.device, non_blocking=True))

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]


class TunedLoop:
    """The tuned pieces of a loop: ``loader`` (effective batches on the device), ``model``,
    ``optimizer`` and :meth:`step`. Every knob of the path applies its part of the plan, stage
    by stage (data, model, optimizer, step: :data:`redline.tune.knob.APPLY_STAGES`), in path
    order."""

    def __init__(self, plan: TunePlan, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loader: DataLoader[Any], loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
                 device: torch.device, cache_split: CacheSplit | None = None,
                 jpeg_split: JpegSplit | None = None) -> None:
        self.plan, self.device, self.loss_fn = plan, device, loss_fn
        parts = LoopParts(plan=plan, device=device, user_loader=loader, cache_split=cache_split,
                          jpeg_split=jpeg_split,
                          dataset=loader.dataset, loader_settings=plan.loader,
                          loader_batch_size=plan.effective_batch, micro_batch=plan.micro_batch,
                          model=model, optimizer=optimizer)
        self._stack = parts.stack
        for knob in KNOBS:
            knob.apply_data(parts)
        self.dataloader = rebuild_factory(loader, batch_size=parts.loader_batch_size,
                                          dataset=parts.dataset,
                                          collate_fn=parts.collate_fn)(parts.loader_settings)
        self._prefetch = parts.prefetch_to_device
        self.loader: Iterable[Any] = self.on_device(self.dataloader)
        for knob in KNOBS:
            knob.apply_model(parts)
        self.model: torch.nn.Module = parts.model
        parts.forward_model = parts.model
        for knob in KNOBS:
            knob.apply_optimizer(parts)
        self.optimizer = parts.optimizer
        self._target_lrs = parts.target_lrs
        for knob in KNOBS:
            knob.apply_step(parts)
        self.forward_model: Any = parts.forward_model
        self._autocast, self.scaler = parts.autocast, parts.scaler
        self._micro_batch = parts.micro_batch
        self._transforms, self._before_step = parts.batch_transforms, parts.before_step
        self._steps = 0

    def on_device(self, batches: Iterable[Any]) -> Iterable[Any]:
        """``batches`` (a loader, or one epoch's iterator of it) delivered on the device the
        way ``loader`` delivers them."""
        if self._prefetch and self.device.type == "cuda":
            return DevicePrefetcher(batches, self.device)
        return _OnDevice(batches, self.device)

    def lr_factor(self, step: int) -> float:
        """The share of the scaled learning rate at optimizer step ``step`` (from 0): it rises
        linearly from the user's rate (1 / lr_scale) to 1 over the plan's warm-up."""
        return lr_factor(self.plan, step)

    def step(self, batch: Any, micro_batch: int | None = None) -> torch.Tensor:
        """One optimizer step over an effective batch; returns its mean loss (detached, on
        the device: reading it with ``float()`` syncs, so log it only every N steps)."""
        for before in self._before_step:
            before(self._steps)
        self._steps += 1
        for transform in self._transforms:
            batch = transform(batch)
        return train_step(self.forward_model, self.optimizer, batch,
                          micro_batch or self._micro_batch, self.loss_fn,
                          autocast=self._autocast, scaler=self.scaler)

    def close(self) -> None:
        """Undo process-wide settings (TF32 and cudnn.benchmark flags, thread count)."""
        self._stack.close()

    def __enter__(self) -> TunedLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def apply_plan(plan: TunePlan, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               loader: DataLoader[Any], loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
               device: str | torch.device = "cpu", check: bool = True,
               cache_split: CacheSplit | None = None,
               schedulers: Iterable[Any] = (),
               jpeg_split: JpegSplit | None = None) -> TunedLoop:
    """Apply ``plan`` to a plain loop's pieces (see the module docstring). A plan that keeps
    the decode cache needs the dataset's ``cache_split``, one that decodes JPEGs on the device
    its ``jpeg_split`` (the ones the tuned setup declared).

    The optimizer stays the one given (a fused or foreach implementation is switched in
    place), so a learning-rate scheduler built on it before or after goes on driving the
    optimizer the loop steps. Where the plan scales the learning rate (a larger effective
    batch), pass the schedulers already built on ``optimizer`` as ``schedulers``: their base
    rates are scaled too (a scheduler built after apply_plan reads the scaled rate itself).
    During the plan's warm-up (``lr_warmup_steps``) the plan sets the rate; after it, the
    schedulers do.

    Args:
        plan: the plan to apply (:func:`load_plan`, or ``TuneResult.plan``).
        model: the model, as the plan's setup built it.
        optimizer: the optimizer over ``model``'s parameters, not yet stepped.
        loader: the DataLoader of the plan's source batch size; the tuned loop rebuilds it at
            the effective batch.
        loss_fn: ``loss_fn(model, batch) -> mean loss``.
        device: where the model trains.
        check: compare the plan's key (model, device, precision, input shapes, world size) and
            source batch size with these pieces first; False skips both checks.
        cache_split: the dataset's cache split, needed when the plan keeps the decode cache;
            None = none declared.
        schedulers: learning-rate schedulers already built on ``optimizer`` whose base rates
            the plan's learning-rate scaling must scale too.
        jpeg_split: how the dataset's samples are made from JPEGs, needed when the plan
            decodes them on the device; None = none declared.

    Returns:
        The :class:`TunedLoop`: its ``loader``, ``model``, ``optimizer`` and ``step``.

    Raises:
        TunePlanMismatchError: the plan was made for another model, device or input shapes, or for
            a loader of another batch size (the effective batch would change); a scheduler
            of another optimizer; a scheduler built before, not passed, on a plan that scales
            the rate.
        TunePlanError: the optimizer has already stepped, or cannot take the plan's
            implementation.
    """
    dev = torch.device(device)
    if check and plan.source_batch_size is not None and loader.batch_size != plan.source_batch_size:
        raise TunePlanMismatchError(
            f"this DataLoader has batch_size={loader.batch_size}; the plan was made for "
            f"batch_size={plan.source_batch_size}, an effective batch of "
            f"{plan.effective_batch} ({plan.source_batch_size} × "
            f"{plan.effective_batch // plan.source_batch_size} accumulation steps), and "
            f"rebuilds the loader at {plan.effective_batch}: applied here it would change your "
            f"effective batch. Build the loader with batch_size={plan.source_batch_size}, or "
            "run `redline tune` for this configuration.")
    if check:
        first = next(iter(DataLoader(loader.dataset, batch_size=1,
                                     collate_fn=loader.collate_fn)))
        check_plan(plan, plan_key(model, dev, plan.key.precision, first,
                                  rank_info().world_size))

    to_scale = _schedulers_to_scale(plan, optimizer, schedulers)
    tuned = TunedLoop(plan, model, optimizer, loader, loss_fn, device=dev,
                      cache_split=cache_split, jpeg_split=jpeg_split)
    _scale_schedulers(plan, tuned, to_scale)
    return tuned
