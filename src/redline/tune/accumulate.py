"""Exact effective batch: split an effective batch into micro-batches whose gradients add up to
the gradient of the whole batch.

With a mean-reduced loss, ∇ mean(B) = Σᵢ (nᵢ / |B|) · ∇ mean(Bᵢ) for any partition of B into
micro-batches Bᵢ of nᵢ samples, so an uneven last micro-batch is weighted by its size, not by
1/k (as Composer's automatic micro-batching does; a split that floors ``batch // micro`` and
drops the rest changes the effective batch). Under DDP every micro-batch but the last
runs inside ``no_sync()`` (FSDP2: with ``set_requires_gradient_sync(False)``), so gradients are
reduced once per optimizer step.

BatchNorm statistics are computed per micro-batch, so a model with BatchNorm sees other
running statistics when the micro-batch changes; :func:`batchnorm_modules` lets callers say so.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from redline.measure.loader import batch_samples
from redline.tune.setup import SetupError


def micro_sizes(effective: int, micro: int) -> list[int]:
    """Sizes of the micro-batches of an effective batch: as many full ``micro`` as fit, then
    the remainder. ``micro_sizes(64, 24) == [24, 24, 16]``.

    Args:
        effective: samples in the effective batch (>= 1).
        micro: samples per micro-batch (>= 1; above ``effective``, one micro-batch).

    Returns:
        Samples per micro-batch, summing to ``effective``.

    Raises:
        ValueError: ``effective`` or ``micro`` is below 1.
    """
    if effective < 1 or micro < 1:
        raise ValueError(f"effective batch and micro-batch must be >= 1, got {effective}, {micro}")
    micro = min(micro, effective)
    full, rest = divmod(effective, micro)
    return [micro] * full + ([rest] if rest else [])


def _slice(obj: Any, start: int, stop: int, total: int) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj[start:stop] if obj.dim() > 0 and obj.shape[0] == total else obj
    if isinstance(obj, Mapping):
        return type(obj)({key: _slice(value, start, stop, total) for key, value in obj.items()})  # type: ignore[call-arg]
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_slice(value, start, stop, total) for value in obj))
    if isinstance(obj, tuple):
        return tuple(_slice(value, start, stop, total) for value in obj)
    if isinstance(obj, list):
        # A list of length n is per-sample data (strings, ids); any other list is structure.
        if len(obj) == total and not any(
                isinstance(value, torch.Tensor | Mapping | list | tuple) for value in obj):
            return obj[start:stop]
        return [_slice(value, start, stop, total) for value in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{fld.name: _slice(getattr(obj, fld.name), start, stop, total)
                                           for fld in dataclasses.fields(obj) if fld.init})
    return obj


def split_batch(batch: Any, micro: int) -> list[tuple[Any, int]]:
    """``[(micro_batch, samples), ...]``: ``batch`` cut along its first dimension into pieces of
    ``micro`` samples (the last may be smaller). Tensors (and per-sample lists) whose first
    dimension is the batch size are sliced; anything else is passed to every piece.

    Args:
        batch: a tensor or a nested batch (dict, list, tuple, dataclass) holding tensors.
        micro: samples per piece (>= 1).

    Returns:
        Each piece with its number of samples, in order.

    Raises:
        ValueError: the batch holds no tensor with a batch dimension, or ``micro`` is below 1.
    """
    samples = batch_samples(batch)
    if samples is None:
        raise ValueError("cannot split a batch that holds no tensor with a batch dimension")
    out, start = [], 0
    for size in micro_sizes(samples, micro):
        out.append((_slice(batch, start, start + size, samples), size))
        start += size
    return out


@contextlib.contextmanager
def _fsdp2_no_sync(model: Any) -> Any:
    # FSDP2 (fully_shard) has no no_sync(): gradient reduction is switched off for the
    # module and every sharded submodule, then on again for the last micro-batch (torch's
    # FSDPModule.set_requires_gradient_sync).
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _no_sync(model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
    """No gradient synchronization for a micro-batch that is not the last: DDP's (and FSDP1's)
    no_sync(), FSDP2's set_requires_gradient_sync; a plain module needs none."""
    no_sync = getattr(model, "no_sync", None)
    if callable(no_sync):
        return no_sync()  # type: ignore[no-any-return]
    if callable(getattr(model, "set_requires_gradient_sync", None)):
        return _fsdp2_no_sync(model)
    return contextlib.nullcontext()



def _scalar(loss: Any, loss_fn: Any) -> torch.Tensor:
    """The loss, if it is what accumulation needs: a scalar tensor (the batch's mean loss)
    that backward can run from."""
    name = getattr(loss_fn, "__qualname__", type(loss_fn).__qualname__)
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        if loss.requires_grad or not torch.is_grad_enabled():
            return loss
        raise SetupError(
            f"loss_fn ({name}) returned a loss that does not require grad, so there is no "
            "backward to run: it was detached (.detach(), .item(), torch.tensor(loss)), "
            "computed under torch.no_grad(), or no trainable parameter of the model reaches it "
            "(all frozen). Return the loss as computed from the model's output.")
    got = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else
           f"a {type(loss).__qualname__}")
    raise SetupError(
        f"loss_fn ({name}) returned {got}; expected a scalar tensor, the batch's mean loss "
        "(e.g. F.cross_entropy(logits, labels), whose reduction is 'mean'; for a per-sample "
        "loss, return loss.mean()). Micro-batches are weighted by their size, which is exact "
        "only for a mean.")


def accumulate(model: torch.nn.Module, batch: Any, micro: int,
               loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
               autocast: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
               backward: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
    """Forward and backward of one effective batch in micro-batches of ``micro``; gradients
    accumulate into ``.grad`` exactly as one pass over the whole batch would leave them.

    Args:
        model: the (possibly DDP-wrapped) model.
        batch: the effective batch, already on the device.
        micro: samples per micro-batch.
        loss_fn: ``loss_fn(model, micro_batch) -> mean loss``.
        autocast: a context-manager factory entered around each forward (mixed precision).
        backward: called with each weighted loss (a GradScaler's ``scale(loss).backward()``);
            default ``loss.backward()``.

    Returns:
        The effective batch's mean loss, detached, on the device (not synced).
    """
    n_all = batch_samples(batch)
    if n_all is not None and n_all <= micro:
        # One micro-batch: no slicing, no weighting kernel (a launch-bound GPU step pays for
        # every extra launch on the host).
        with autocast() if autocast is not None else contextlib.nullcontext():
            loss = _scalar(loss_fn(model, batch), loss_fn)
        if backward is not None:
            backward(loss)
        else:
            loss.backward()
        return loss.detach().float()
    pieces = split_batch(batch, micro)
    total = sum(size for _, size in pieces)
    acc: torch.Tensor | None = None
    for i, (piece, size) in enumerate(pieces):
        last = i == len(pieces) - 1
        with contextlib.nullcontext() if last else _no_sync(model):
            with autocast() if autocast is not None else contextlib.nullcontext():
                loss = _scalar(loss_fn(model, piece), loss_fn)
            weighted = loss * (size / total)
            if backward is not None:
                backward(weighted)
            else:
                weighted.backward()
        # Summed on the device: reading it here would add a host sync per micro-batch.
        weight = weighted.detach().float()
        acc = weight if acc is None else acc + weight
    assert acc is not None
    return acc


def batchnorm_modules(model: torch.nn.Module) -> list[str]:
    """Names of BatchNorm layers, whose statistics depend on the micro-batch size."""
    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)]


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Any, micro: int,
               loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
               autocast: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
               scaler: Any = None) -> torch.Tensor:
    """Forward/backward in micro-batches, optimizer step (through the GradScaler for fp16),
    gradients set to None: the next step's activations do not share memory with them.

    Args:
        model: the (possibly DDP-wrapped) model.
        optimizer: its optimizer.
        batch: the effective batch, already on the device.
        micro: samples per micro-batch.
        loss_fn: ``loss_fn(model, micro_batch) -> mean loss``.
        autocast: a context-manager factory entered around each forward (mixed precision);
            None = none.
        scaler: a ``torch.amp.GradScaler`` (fp16); None = plain ``backward`` and
            ``optimizer.step``.

    Returns:
        The effective batch's mean loss, detached, on the device (not synced).
    """
    backward = (lambda loss: scaler.scale(loss).backward()) if scaler is not None else None
    loss = accumulate(model, batch, micro, loss_fn, autocast, backward)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss
