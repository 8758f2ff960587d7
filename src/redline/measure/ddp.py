"""A DistributedDataParallel or FSDP2 model's own statistics, read once at watch exit.

DDP keeps runtime logging data (``DistributedDataParallel._get_ddp_logging_data``, a
prototype API sampled by DDP itself: the first iterations, then one in 100): its settings,
bucket sizes, and the mean communication and overlap time of a backward pass. Read here with
the flight recorder's count of all-reduces, they show the knobs that cost a job collectives.

The instrumentation keeps a strong reference to such a model from the first forward it sees
until the watch closes, and :func:`snapshot` reads it then: the report is built after the
block, when a script whose training ran inside ``main()`` has dropped its last reference and
the model (known to the hooks only weakly, so that redline never keeps a user's model alive)
may be gone.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from redline.core.measurements import DdpStats, FsdpStats
from redline.measure.collectives import Arrival
from redline.measure.optional import optional_section


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelSnapshot:
    """What the loop's DDP or FSDP2 model said about itself when the watch closed."""

    ddp_logging: dict[str, Any] | None = None
    """DDP's logging data (``_get_ddp_logging_data``); None: no DDP model, or that prototype
    API is absent or failed in this torch."""
    static_graph: bool = False
    """The DDP model was built with ``static_graph=True``."""
    fsdp_groups: int | None = None
    """``fully_shard`` groups under the first FSDP2 model; None: no FSDP2 model."""


def _unwrapped(module: Any) -> Any:
    """The module a ``torch.compile`` wrapper holds (``OptimizedModule._orig_mod``), else it."""
    inner = getattr(module, "_orig_mod", None)
    return inner if isinstance(inner, torch.nn.Module) else module


def _fsdp_type() -> type | None:
    """FSDP2's module class, None while ``torch.distributed.fsdp`` is not imported (then no
    module can be sharded yet, and importing it here would cost time on every watch)."""
    mod = sys.modules.get("torch.distributed.fsdp")
    fsdp_type = getattr(mod, "FSDPModule", None) if mod is not None else None
    return fsdp_type if isinstance(fsdp_type, type) else None


def is_parallel(module: Any) -> bool:
    """A DDP or FSDP2 model (possibly inside a ``torch.compile`` wrapper)."""
    inner = _unwrapped(module)
    fsdp = _fsdp_type()
    return isinstance(inner, torch.nn.parallel.DistributedDataParallel) or (
        fsdp is not None and isinstance(inner, fsdp))


def snapshot(roots: list[Any]) -> ParallelSnapshot:
    """Read the first DDP and the first FSDP2 model among ``roots`` (the loop's outermost
    modules), while they are alive."""
    mods = [_unwrapped(root) for root in roots]
    ddp = next((root for root in mods if isinstance(root, torch.nn.parallel.DistributedDataParallel)),
               None)
    logging: dict[str, Any] | None = None
    if ddp is not None:
        try:
            logging = dict(ddp._get_ddp_logging_data())
        except Exception:  # a prototype API: absent or changed in this torch
            logging = None
    fsdp_t = _fsdp_type()
    groups: int | None = None
    if fsdp_t is not None:
        fsdp = next((root for root in mods if isinstance(root, fsdp_t)), None)
        if isinstance(fsdp, torch.nn.Module):
            groups = sum(1 for root in fsdp.modules() if isinstance(root, fsdp_t))
    return ParallelSnapshot(ddp_logging=logging,
                            static_graph=bool(getattr(ddp, "static_graph", False)),
                            fsdp_groups=groups)


@optional_section("DDP")
def ddp_stats(snap: ParallelSnapshot, arrivals: list[Arrival], measured_steps: int,
              counts: dict[str, int]) -> DdpStats | None:
    """DDP's statistics with the counted collectives, or None without a DDP model."""
    ddp_logging = snap.ddp_logging
    if ddp_logging is None:
        return None

    def ns(key: str) -> float | None:
        value = ddp_logging.get(key)
        return value / 1e9 if isinstance(value, int) and value > 0 else None

    sizes = [int(size) for size in str(ddp_logging.get("bucket_sizes", "")).replace(" ", "").split(",")
             if size]
    return DdpStats(
        backend=str(ddp_logging.get("backend_name", "")),
        find_unused_parameters=bool(ddp_logging.get("find_unused_parameters", 0)),
        unused_parameter_bytes=int(ddp_logging.get("unused_parameter_size", 0) or 0),
        gradient_as_bucket_view=bool(ddp_logging.get("gradient_as_bucket_view", 0)),
        bucket_cap_bytes=int(ddp_logging.get("bucket_cap_bytes", 0) or 0),
        bucket_sizes_bytes=sizes,
        parameter_bytes=int(ddp_logging.get("total_parameter_size_bytes", 0) or 0),
        backward_comm_s=ns("avg_backward_comm_time"),
        backward_overlap_s=ns("avg_backward_compute_comm_overlap_time"),
        backward_per_step=_backward_per_step(counts),
        all_reduces_per_step=_per_step(arrivals, measured_steps, ("all_reduce",)),
        static_graph=snap.static_graph,
    )


def _backward_per_step(counts: dict[str, int]) -> float | None:
    opt = counts.get("optimizer_step", 0)
    return counts.get("backward", 0) / opt if opt else None


def _per_step(arrivals: list[Arrival], measured_steps: int,
              kinds: tuple[str, ...]) -> float | None:
    """Collectives of these kinds this rank enqueued per measured step (None: none read)."""
    if not arrivals or not measured_steps:
        return None
    return sum(1 for arrival in arrivals if any(k in arrival.name for k in kinds)) / measured_steps


@optional_section("FSDP")
def fsdp_stats(snap: ParallelSnapshot, arrivals: list[Arrival], measured_steps: int,
               counts: dict[str, int]) -> FsdpStats | None:
    """The FSDP2 (``fully_shard``) model's parameter groups and the gradient reductions per
    optimizer step (all-reduces count: gloo has no reduce-scatter, and FSDP2 reduces with
    all-reduce there), or None without one."""
    if snap.fsdp_groups is None:
        return None
    return FsdpStats(
        groups=snap.fsdp_groups,
        backward_per_step=_backward_per_step(counts),
        reductions_per_step=_per_step(arrivals, measured_steps, ("reduce_scatter", "all_reduce")))
