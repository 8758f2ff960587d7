"""A DistributedDataParallel or FSDP2 model's own statistics, read once at watch exit.

DDP keeps runtime logging data (``DistributedDataParallel._get_ddp_logging_data``, a
prototype API sampled by DDP itself: the first iterations, then one in 100): its settings,
bucket sizes, and the mean communication and overlap time of a backward pass. Read here with
the flight recorder's count of all-reduces, they show the knobs that cost a job collectives.
"""

from __future__ import annotations

from typing import Any

import torch

from redline.core.measurements import DdpStats, FsdpStats
from redline.measure.collectives import Arrival


def ddp_stats(roots: list[Any], arrivals: list[Arrival], measured_steps: int,
              counts: dict[str, int]) -> DdpStats | None:
    """The first DDP model among ``roots`` (the loop's outermost modules), or None."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return None
    ddp = next((m for m in roots if isinstance(m, DistributedDataParallel)), None)
    if ddp is None:
        return None
    try:
        d: dict[str, Any] = ddp._get_ddp_logging_data()
    except Exception:  # a prototype API: absent or changed in this torch
        return None

    def ns(key: str) -> float | None:
        v = d.get(key)
        return v / 1e9 if isinstance(v, int) and v > 0 else None

    sizes = [int(x) for x in str(d.get("bucket_sizes", "")).replace(" ", "").split(",") if x]
    return DdpStats(
        backend=str(d.get("backend_name", "")),
        find_unused_parameters=bool(d.get("find_unused_parameters", 0)),
        unused_parameter_bytes=int(d.get("unused_parameter_size", 0) or 0),
        gradient_as_bucket_view=bool(d.get("gradient_as_bucket_view", 0)),
        bucket_cap_bytes=int(d.get("bucket_cap_bytes", 0) or 0),
        bucket_sizes_bytes=sizes,
        parameter_bytes=int(d.get("total_parameter_size_bytes", 0) or 0),
        backward_comm_s=ns("avg_backward_comm_time"),
        backward_overlap_s=ns("avg_backward_compute_comm_overlap_time"),
        backward_per_step=_backward_per_step(counts),
        all_reduces_per_step=_per_step(arrivals, measured_steps, ("all_reduce",)),
        static_graph=bool(getattr(ddp, "static_graph", False)),
    )


def _backward_per_step(counts: dict[str, int]) -> float | None:
    opt = counts.get("optimizer_step", 0)
    return counts.get("backward", 0) / opt if opt else None


def _per_step(arrivals: list[Arrival], measured_steps: int,
              kinds: tuple[str, ...]) -> float | None:
    """Collectives of these kinds this rank enqueued per measured step (None: none read)."""
    if not arrivals or not measured_steps:
        return None
    return sum(1 for a in arrivals if any(k in a.name for k in kinds)) / measured_steps


def fsdp_stats(roots: list[Any], arrivals: list[Arrival], measured_steps: int,
               counts: dict[str, int]) -> FsdpStats | None:
    """The first FSDP2 (``fully_shard``) model among ``roots``, or None: its parameter groups
    and the gradient reductions per optimizer step (all-reduces count: gloo has no
    reduce-scatter, and FSDP2 reduces with all-reduce there)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return None
    root = next((m for m in roots if isinstance(m, FSDPModule)), None)
    if root is None:
        return None
    modules = root.modules() if isinstance(root, torch.nn.Module) else []
    return FsdpStats(
        groups=sum(1 for m in modules if isinstance(m, FSDPModule)),
        backward_per_step=_backward_per_step(counts),
        reductions_per_step=_per_step(arrivals, measured_steps, ("reduce_scatter", "all_reduce")))
