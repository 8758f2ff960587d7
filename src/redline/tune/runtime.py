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

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from redline.data.autotune import rebuild_factory
from redline.data.cache_split import CacheSplit, cached_dataset
from redline.data.prefetcher import DevicePrefetcher, map_tensors
from redline.measure.ranks import rank_info
from redline.tune.accumulate import accumulate
from redline.tune.ddp import rewrap
from redline.tune.kernels import cudnn_benchmark
from redline.tune.plan import PlanError, PlanMismatchError, TunePlan, check_plan, plan_key
from redline.tune.precision import autocast_for, make_scaler, tf32


def rebuild_optimizer(optimizer: torch.optim.Optimizer, impl: str | None) -> torch.optim.Optimizer:
    """``optimizer`` switched, in place, to its ``fused=True`` or ``foreach=True``
    implementation (returned: the same object). Kept the same object so that what refers to
    it — a learning-rate scheduler, a GradScaler, the loop's own checkpoint code — goes on
    driving the optimizer that steps. Only before the first step: there is no state to carry.

    Raises:
        PlanError: the optimizer already holds state, or its class has no such
            implementation (or refuses it for these parameters: a probe built over the same
            parameter groups says why).
    """
    if impl is None:
        return optimizer
    if optimizer.state:
        raise PlanError(
            f"the plan switches the optimizer to its {impl} implementation and this "
            f"{type(optimizer).__name__} has already stepped (it holds state, kept per "
            "implementation): call apply_plan before the first optimizer step")
    accepted = inspect.signature(type(optimizer).__init__).parameters
    if impl not in accepted or impl not in optimizer.defaults:
        raise PlanError(f"{type(optimizer).__name__} has no {impl!r} implementation: set "
                        "optimizer_impl to null in the plan")
    groups = [{k: v for k, v in g.items() if k not in ("fused", "foreach")}
              for g in optimizer.param_groups]
    # defaults may hold entries the constructor does not take (AdamW's decoupled_weight_decay)
    defaults = {k: v for k, v in optimizer.defaults.items()
                if k in accepted and k not in ("fused", "foreach", "differentiable")}
    defaults[impl] = True
    if impl == "fused":
        defaults["foreach"] = None
    try:
        # the constructor validates the implementation for these parameters; its flags are
        # then what the step reads (each group's "fused"/"foreach" and a few attributes)
        probe = type(optimizer)(groups, **defaults)
    except (RuntimeError, ValueError, TypeError) as e:
        raise PlanError(f"{type(optimizer).__name__} refuses {impl}=True here ({e}): set "
                        "optimizer_impl to null in the plan") from None
    for g, pg in zip(optimizer.param_groups, probe.param_groups, strict=True):
        g["fused"], g["foreach"] = pg.get("fused"), pg.get("foreach")
    optimizer.defaults.update({k: probe.defaults.get(k) for k in ("fused", "foreach")})
    for k, v in vars(probe).items():
        if isinstance(v, bool) and k.startswith("_"):  # _step_supports_amp_scaling, ...
            setattr(optimizer, k, v)
    return optimizer


def _schedulers_to_scale(plan: TunePlan, optimizer: torch.optim.Optimizer,
                         schedulers: Iterable[Any]) -> list[Any]:
    """The schedulers whose base rates the plan's ``lr_scale`` scales; refuses one built on
    another optimizer, and, where the plan scales the rate, a scheduler already built on
    ``optimizer`` (every torch scheduler sets its groups' ``initial_lr``) and not passed."""
    passed = list(schedulers)
    for sch in passed:
        if getattr(sch, "optimizer", None) is not optimizer:
            raise PlanMismatchError(
                f"the scheduler {type(sch).__name__} passed to apply_plan was built on another "
                "optimizer: pass the schedulers of the optimizer given to apply_plan")
    # a plan applied before set initial_lr itself, to the scaled rate (see _scale_schedulers)
    ours = getattr(optimizer, "_redline_lr_scale", None) is not None
    if plan.lr_scale != 1.0 and not passed and not ours and any(
            "initial_lr" in g for g in optimizer.param_groups):
        raise PlanMismatchError(
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
    for g, target in zip(optimizer.param_groups, tuned._target_lrs, strict=True):
        g["initial_lr"] = target
    for sch in schedulers:
        if hasattr(sch, "base_lrs") and not getattr(sch, "_redline_lr_scaled", False):
            sch.base_lrs = [b * plan.lr_scale for b in sch.base_lrs]
            sch._redline_lr_scaled = True


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any, micro: int,
               loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
               autocast: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
               scaler: Any = None) -> torch.Tensor:
    """Forward/backward in micro-batches, optimizer step (through the GradScaler for fp16),
    gradients set to None: the next step's activations do not share memory with them."""
    backward = (lambda loss: scaler.scale(loss).backward()) if scaler is not None else None
    loss = accumulate(model, batch, micro, loss_fn, autocast, backward)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def _to_channels_last(batch: Any) -> Any:
    return map_tensors(batch, lambda t: t.contiguous(memory_format=torch.channels_last)
                       if t.dim() == 4 and t.is_floating_point() else t)


class _OnDevice(Iterable[Any]):
    """Moves CPU batches to the device (the non-CUDA counterpart of DevicePrefetcher)."""

    def __init__(self, loader: Iterable[Any], device: torch.device) -> None:
        self.loader, self.device = loader, device

    def __iter__(self) -> Iterator[Any]:
        for b in self.loader:
            yield map_tensors(b, lambda t: t.to(self.device, non_blocking=True))

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]


def plan_dataset(plan: TunePlan, loader: DataLoader[Any], cache_split: CacheSplit | None) -> Any:
    """The dataset the tuned loader reads: the loader's own, or, where the plan keeps the
    decode cache, the same samples served from a cache of their deterministic part."""
    if not plan.decode_cache:
        return loader.dataset
    if cache_split is None:
        raise PlanMismatchError(
            "the plan serves the loader from a decode cache (decode_cache: true) and no cache "
            "split was given: pass cache_split=redline.data.CacheSplit(...) (the setup's) to "
            "apply_plan, or set decode_cache to false in the plan to train without the cache")
    return cached_dataset(cache_split, len(loader.dataset),  # type: ignore[arg-type]
                          plan.decode_cache_store)


class TunedLoop:
    """The tuned pieces of a loop: ``loader`` (effective batches on the device), ``model``,
    ``optimizer`` and :meth:`step`."""

    def __init__(self, plan: TunePlan, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loader: DataLoader[Any], loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
                 device: torch.device, cache_split: CacheSplit | None = None) -> None:
        self.plan, self.device, self.loss_fn = plan, device, loss_fn
        settings = dataclasses.replace(
            plan.loader, pin_memory=plan.loader.pin_memory and device.type == "cuda")
        base = rebuild_factory(loader, batch_size=plan.effective_batch,
                               dataset=plan_dataset(plan, loader, cache_split))(settings)
        self.dataloader = base
        self.loader: Iterable[Any] = self.on_device(base)
        if plan.channels_last:
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.model: torch.nn.Module = rewrap(model, plan.ddp)
        model = self.model
        self.optimizer = rebuild_optimizer(optimizer, plan.optimizer_impl)
        self._steps = 0
        self._target_lrs: list[Any] | None = None
        if plan.lr_scale != 1.0:
            # a larger effective batch: the scaled rates, reached over the plan's warm-up
            self._target_lrs = [g["lr"] * plan.lr_scale for g in self.optimizer.param_groups]
            self._warm_lr()
        self.forward_model: Any = (torch.compile(model, mode=plan.compile_mode) if plan.compile
                                   else model)
        self._autocast = autocast_for(plan.precision, device)
        self.scaler = make_scaler(plan.precision, device)
        self._stack = contextlib.ExitStack()
        if plan.precision == "tf32" and device.type == "cuda":
            self._stack.enter_context(tf32(True))
        if plan.cudnn_benchmark:
            self._stack.enter_context(cudnn_benchmark(True))
        if plan.torch_threads is not None:
            self._threads = torch.get_num_threads()
            torch.set_num_threads(plan.torch_threads)

    def on_device(self, batches: Iterable[Any]) -> Iterable[Any]:
        """``batches`` (a loader, or one epoch's iterator of it) delivered on the device the
        way ``loader`` delivers them."""
        if self.plan.prefetch_to_device and self.device.type == "cuda":
            return DevicePrefetcher(batches, self.device)
        return _OnDevice(batches, self.device)

    def lr_factor(self, step: int) -> float:
        """The share of the scaled learning rate at optimizer step ``step`` (from 0): it rises
        linearly from the user's rate (1 / lr_scale) to 1 over the plan's warm-up."""
        w, s = self.plan.lr_warmup_steps, self.plan.lr_scale
        return 1.0 if step >= w else (1 + (s - 1) * step / w) / s

    def _warm_lr(self) -> None:
        if self._target_lrs is None or self._steps > self.plan.lr_warmup_steps:
            return
        f = self.lr_factor(self._steps)
        for g, lr in zip(self.optimizer.param_groups, self._target_lrs, strict=True):
            g["lr"] = lr * f

    def step(self, batch: Any, micro_batch: int | None = None) -> torch.Tensor:
        """One optimizer step over an effective batch; returns its mean loss (detached, on
        the device: reading it with ``float()`` syncs, so log it only every N steps)."""
        self._warm_lr()
        self._steps += 1
        if self.plan.channels_last:
            batch = _to_channels_last(batch)
        return train_step(self.forward_model, self.optimizer, batch,
                          micro_batch or self.plan.micro_batch, self.loss_fn, self._autocast,
                          self.scaler)

    def close(self) -> None:
        """Undo process-wide settings (TF32 and cudnn.benchmark flags, thread count)."""
        self._stack.close()
        if self.plan.torch_threads is not None:
            torch.set_num_threads(self._threads)

    def __enter__(self) -> TunedLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def apply_plan(plan: TunePlan, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               loader: DataLoader[Any], loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
               device: str | torch.device = "cpu", check: bool = True,
               cache_split: CacheSplit | None = None,
               schedulers: Iterable[Any] = ()) -> TunedLoop:
    """Apply ``plan`` to a plain loop's pieces (see the module docstring). A plan that keeps
    the decode cache needs the dataset's ``cache_split`` (the one the tuned setup declared).

    The optimizer stays the one given (a fused or foreach implementation is switched in
    place), so a learning-rate scheduler built on it before or after goes on driving the
    optimizer the loop steps. Where the plan scales the learning rate (a larger effective
    batch), pass the schedulers already built on ``optimizer`` as ``schedulers``: their base
    rates are scaled too (a scheduler built after apply_plan reads the scaled rate itself).
    During the plan's warm-up (``lr_warmup_steps``) the plan sets the rate; after it, the
    schedulers do.

    Raises:
        PlanMismatchError: the plan was made for another model, device or input shapes, or for
            a loader of another batch size (the effective batch would change); a scheduler
            of another optimizer; a scheduler built before, not passed, on a plan that scales
            the rate.
        PlanError: the optimizer has already stepped, or cannot take the plan's
            implementation.
    """
    dev = torch.device(device)
    if check and plan.source_batch_size is not None and loader.batch_size != plan.source_batch_size:
        raise PlanMismatchError(
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
    tuned = TunedLoop(plan, model, optimizer, loader, loss_fn, dev, cache_split)
    _scale_schedulers(plan, tuned, to_scale)
    return tuned
