"""Mixed precision, switched on only when the numbers stay the same.

Candidates: bf16 autocast (CUDA with bf16 support, and CPU); fp16 autocast + GradScaler where
bf16 is not supported (pre-Ampere GPUs); TF32 matmuls on Ampere and newer (compute capability
≥ 8.0, where tensor cores run TF32). Lightning and Accelerate only check device support
(``Trainer(precision=...)``, ``Accelerator(mixed_precision=...)``); here each candidate is
also run for N steps against fp32 from the same initial weights and batches
(:func:`check_numerics`) and refused with the reason when its losses or gradient norms drift,
or when it overflows.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from redline.core.errors import RedlineError
from redline.tune.accumulate import accumulate
from redline.tune.config import NumericsTolerance

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
"""The precisions a plan trains in: TF32 matmuls in fp32 storage, or autocast to 16 bits."""
SIXTEEN_BIT = ("bf16", "fp16")
"""The 16-bit precisions (activations about half the bytes of fp32 ones)."""


class NonFiniteLossError(RedlineError, RuntimeError):
    """The loss is NaN/inf already in fp32: a bug in the model or data, not in precision."""


@dataclass(slots=True, kw_only=True)
class NumericsCheck:
    precision: str
    steps: int
    loss_fp32: list[float]
    loss_candidate: list[float]
    grad_norm_fp32: list[float]
    grad_norm_candidate: list[float]
    overflow_steps: int
    max_loss_rel: float
    max_grad_norm_rel: float
    passed: bool
    reason: str
    tolerance: NumericsTolerance = field(default_factory=NumericsTolerance)


def worst_check(checks: list[NumericsCheck]) -> NumericsCheck:
    """The job's verdict from every rank's check (in rank order): the first failing rank's, named
    in its reason (a precision is kept only if every rank's shard trains safely in it), else the
    rank with the largest loss deviation."""
    if len(checks) == 1:
        return checks[0]
    for rank, check in enumerate(checks):
        if not check.passed:
            return dataclasses.replace(check, reason=f"rank {rank}: {check.reason}")
    rank, check = max(enumerate(checks), key=lambda ranked: ranked[1].max_loss_rel)
    return dataclasses.replace(check, reason=f"{check.reason} (every one of {len(checks)} ranks passed; "
                               f"rank {rank} deviated most)")


def supported(device: torch.device) -> dict[str, str | None]:
    """Each precision → None if usable on ``device``, else why not."""
    out: dict[str, str | None] = {"fp32": None}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        ampere = major >= 8
        out["tf32"] = None if ampere else f"TF32 needs compute capability >= 8.0, have {major}.{minor}"
        bf16_ok = torch.cuda.is_bf16_supported()
        out["bf16"] = None if bf16_ok else "this GPU has no bf16 support"
        out["fp16"] = ("bf16 is supported: fp16 + GradScaler is only tried where it is not"
                       if bf16_ok else None)
    else:
        out["tf32"] = "TF32 is a CUDA tensor-core mode"
        out["bf16"] = None  # CPU autocast runs bf16 (fast with AMX / AVX512-BF16)
        out["fp16"] = "CPU: bf16 autocast is used instead of fp16"
    return out


AutocastFactory = Callable[[], contextlib.AbstractContextManager[Any]]


def autocast_for(precision: str, device: torch.device) -> AutocastFactory | None:
    """A factory of autocast contexts for the precision (None for fp32/tf32)."""
    if precision not in ("bf16", "fp16"):
        return None
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device.type, dtype=dtype)


def make_scaler(precision: str, device: torch.device) -> Any:
    """A GradScaler for fp16 (None otherwise): fp16's range overflows without loss scaling."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


@contextlib.contextmanager
def tf32(enabled: bool) -> Any:
    """TF32 matmuls and convolutions on (restored on exit: no state survives the call)."""
    prev = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


def _grad_norm(params: Sequence[torch.nn.Parameter]) -> float:
    norms = [param.grad.detach().float().norm() for param in params if param.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def _run(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Sequence[Any], *,
         micro: int, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
         precision: str, device: torch.device, seed: int) -> tuple[list[float], list[float], int]:
    torch.manual_seed(seed)  # same dropout masks in both runs
    autocast = autocast_for(precision, device)
    scaler = make_scaler(precision, device)
    losses, norms, overflow = [], [], 0
    params = [param for group in optimizer.param_groups for param in group["params"]]
    with tf32(precision == "tf32") if device.type == "cuda" else contextlib.nullcontext():
        for batch in batches:
            backward = (lambda loss: scaler.scale(loss).backward()) if scaler else None
            loss = accumulate(model, batch, micro, loss_fn, autocast, backward)
            if scaler is not None:
                scaler.unscale_(optimizer)
            norm = _grad_norm(params)
            if scaler is not None:
                scale = scaler.get_scale()
                scaler.step(optimizer)
                scaler.update()
                overflow += scaler.get_scale() < scale
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss))
            norms.append(norm)
    return losses, norms, overflow


@contextlib.contextmanager
def restored(model: torch.nn.Module,
             optimizer: torch.optim.Optimizer) -> Iterator[Callable[[], None]]:
    """The model's weights and the optimizer's state (its rates included) as they were on
    entry, again on exit; the yielded function brings them back inside the block (to train a
    second candidate from the same start). Gradients are cleared each time."""
    model_state = copy.deepcopy(model.state_dict())
    optimizer_state = copy.deepcopy(optimizer.state_dict())

    def reset() -> None:
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        optimizer.zero_grad(set_to_none=True)

    try:
        yield reset
    finally:
        reset()


def check_numerics(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   batches: Sequence[Any], micro: int,
                   loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], precision: str,
                   device: torch.device, tolerance: NumericsTolerance | None = None,
                   seed: int = 0) -> NumericsCheck:
    """Train ``len(batches)`` steps in fp32 and in ``precision`` from the same weights,
    optimizer state and batches; compare. ``model`` and ``optimizer`` are left as they were.

    Args:
        model: the model, on ``device``.
        optimizer: its optimizer; its state is restored after both runs.
        batches: the batches of the compared steps, one effective batch each.
        micro: samples per micro-batch.
        loss_fn: ``loss_fn(model, batch) -> mean loss``.
        precision: the candidate ("bf16", "fp16" or "tf32").
        device: where the model trains.
        tolerance: the accepted relative differences and overflow steps; None = the defaults
            of :class:`NumericsTolerance`.
        seed: the RNG seed set before each run (the same dropout masks in both).

    Returns:
        A :class:`NumericsCheck`: both runs' losses and gradient norms, the largest relative
        differences (fractions), the overflow steps, and whether the candidate passed and why.

    Raises:
        NonFiniteLossError: fp32 itself produces a NaN/inf loss.
    """
    tol = tolerance or NumericsTolerance()
    with restored(model, optimizer) as reset:
        ref = _run(model, optimizer, batches, micro=micro, loss_fn=loss_fn, precision="fp32",
                   device=device, seed=seed)
        bad = [i for i, loss in enumerate(ref[0]) if not math.isfinite(loss)]
        if bad:
            raise NonFiniteLossError(
                f"the loss is {ref[0][bad[0]]} in fp32 already (step {bad[0] + 1} of "
                f"{len(batches)}): this is not a precision problem. Check the data (NaN/inf "
                "inputs, labels out of range), the learning rate and the loss function; "
                "torch.autograd.set_detect_anomaly(True) names the op that produced it.")
        reset()
        cand = _run(model, optimizer, batches, micro=micro, loss_fn=loss_fn,
                    precision=precision, device=device, seed=seed)

    def rel(a: float, b: float) -> float:
        if not math.isfinite(b):
            return math.inf
        return abs(b - a) / max(abs(a), 1e-12)

    loss_rel = max(rel(a, b) for a, b in zip(ref[0], cand[0], strict=True))
    grad_norm_rel = max(rel(a, b) for a, b in zip(ref[1], cand[1], strict=True) if a > 0 or b > 0) \
        if any(ref[1]) else 0.0
    reasons = []
    if loss_rel > tol.loss_rel:
        reasons.append(f"loss differs from fp32 by up to {loss_rel:.1%} (tolerance {tol.loss_rel:.0%})")
    if grad_norm_rel > tol.grad_norm_rel:
        reasons.append(f"gradient norm differs by up to {grad_norm_rel:.1%} (tolerance "
                       f"{tol.grad_norm_rel:.0%})")
    if cand[2] > tol.max_overflow_steps:
        reasons.append(f"{cand[2]} of {len(batches)} steps overflowed (GradScaler skipped them;"
                       f" tolerance {tol.max_overflow_steps})")
    passed = not reasons
    reason = (f"{precision} matches fp32 over {len(batches)} steps: loss within {loss_rel:.2%}, "
              f"gradient norm within {grad_norm_rel:.2%}, {cand[2]} overflow steps") if passed else \
        f"{precision} refused: " + "; ".join(reasons)
    return NumericsCheck(precision=precision, steps=len(batches), loss_fp32=ref[0],
                         loss_candidate=cand[0], grad_norm_fp32=ref[1], grad_norm_candidate=cand[1],
                         overflow_steps=cand[2],
                         max_loss_rel=loss_rel, max_grad_norm_rel=grad_norm_rel, passed=passed,
                         reason=reason, tolerance=tol)
