"""DistributedDataParallel knobs, measured like the others: the user's DDP model re-wrapped with
other gradient-bucket settings.

DDP all-reduces gradients bucket by bucket as backward produces them, so communication overlaps
the rest of backward only when there is more than one bucket; each bucket is one collective
launch (PyTorch DDP notes, "Internal design"; Li et al., "PyTorch Distributed", VLDB 2020, §3.2
on bucket size). ``gradient_as_bucket_view`` makes gradients views into the buckets: one copy
of every gradient less (DDP's documentation of the argument).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

DDP_DEFAULT_BUCKET_MB = 25.0
"""DistributedDataParallel's default ``bucket_cap_mb``."""
MIN_BUCKETS_FOR_OVERLAP = 4
"""A model whose gradients fit one bucket is tried with buckets of a quarter of them."""
LARGER_BUCKET_FACTOR = 4
"""A model of many buckets is tried with buckets this many times larger."""

@dataclass(frozen=True, slots=True, kw_only=True)
class DdpSettings:
    """DistributedDataParallel settings the tuned loop re-wraps the user's DDP model with
    (:func:`redline.tune.ddp.rewrap`); None keeps what the user built."""

    bucket_cap_mb: float | None = None
    """Gradient bucket capacity in MiB (DDP's default is 25): smaller buckets start
    all-reducing earlier in the backward pass, larger ones launch fewer collectives."""
    gradient_as_bucket_view: bool | None = None
    """Gradients as views into the communication buckets: one copy of every gradient less in
    memory and no copy into the buckets per step."""

    def __post_init__(self) -> None:
        if self.bucket_cap_mb is not None and not self.bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be > 0 or None, got {self.bucket_cap_mb}")


# Constructor arguments that DDP keeps as attributes of the same name (torch ≥ 2.1).
_KEPT = ("device_ids", "output_device", "dim", "process_group", "find_unused_parameters",
         "gradient_as_bucket_view", "static_graph", "mixed_precision")


def as_ddp(model: torch.nn.Module) -> Any | None:
    """``model`` if it is a DistributedDataParallel, else None."""
    from torch.nn.parallel import DistributedDataParallel

    return model if isinstance(model, DistributedDataParallel) else None


def cannot_rewrap(ddp: Any) -> str | None:
    """Why the model cannot be re-wrapped without losing something of the user's, or None."""
    if getattr(ddp, "_comm_hooks", None):
        return ("a communication hook is registered (register_comm_hook): a re-wrapped model "
                "would run without it")
    if getattr(ddp, "_delay_all_reduce_params", None):
        return "delay_all_reduce_named_params is set: not carried over by a re-wrap"
    caps = set(getattr(ddp, "bucket_bytes_cap_list", []) or [])
    if len(caps) > 1:
        return "per-bucket capacities are set (bucket_cap_mb_list)"
    return None


def gradient_bytes(model: torch.nn.Module) -> int:
    return sum(param.numel() * param.element_size() for param in model.parameters()
               if param.requires_grad)


def bucket_candidate(ddp: Any) -> tuple[float, str] | None:
    """(bucket_cap_mb to try, why), or None when neither direction applies."""
    cap = int(getattr(ddp, "bucket_bytes_cap", DDP_DEFAULT_BUCKET_MB * 2**20))
    grads = gradient_bytes(ddp.module)
    if grads <= cap:
        bucket_mb = grads / MIN_BUCKETS_FOR_OVERLAP / 2**20
        return bucket_mb, (f"all {grads / 2**20:,.2f} MiB of gradients fit one "
                           f"{cap / 2**20:g} MiB bucket, so their all-reduce starts only after "
                           f"the whole backward: {MIN_BUCKETS_FOR_OVERLAP} buckets let it overlap")
    if grads >= LARGER_BUCKET_FACTOR * cap:
        bucket_mb = LARGER_BUCKET_FACTOR * cap / 2**20
        return bucket_mb, (f"{grads / 2**20:,.0f} MiB of gradients in {cap / 2**20:g} MiB "
                           f"buckets: about {grads // cap} all-reduce launches per step; larger "
                           "buckets launch fewer")
    return None


def rewrap(model: torch.nn.Module, settings: DdpSettings) -> torch.nn.Module:
    """``model`` re-wrapped with ``settings`` if it is a DDP model and they change something;
    every other constructor argument as the user gave it. The new wrapper broadcasts rank 0's
    parameters and buffers, as the user's did when it was built (a collective: every rank
    re-wraps at the same point)."""
    ddp = as_ddp(model)
    if ddp is None or settings == DdpSettings():
        return model
    why = cannot_rewrap(ddp)
    if why is not None:
        raise ValueError(f"cannot apply the plan's DDP settings: {why}")
    from torch.nn.parallel import DistributedDataParallel

    accepted = inspect.signature(DistributedDataParallel.__init__).parameters
    kwargs: dict[str, Any] = {name: getattr(ddp, name) for name in _KEPT
                              if name in accepted and hasattr(ddp, name)}
    # Buffer syncing: ``forward_sync_buffers`` in newer torch, ``broadcast_buffers`` before.
    for name in ("forward_sync_buffers", "broadcast_buffers"):
        if name in accepted and hasattr(ddp, name):
            kwargs[name] = getattr(ddp, name)
            break
    kwargs["bucket_cap_mb"] = (settings.bucket_cap_mb if settings.bucket_cap_mb is not None
                               else ddp.bucket_bytes_cap / 2**20)
    if settings.gradient_as_bucket_view is not None:
        kwargs["gradient_as_bucket_view"] = settings.gradient_as_bucket_view
    # The old wrapper's gradient hooks stay registered but idle: DDP's reducer only reduces
    # after its own forward prepared the backward, which is never called again.
    return DistributedDataParallel(ddp.module, **kwargs)
