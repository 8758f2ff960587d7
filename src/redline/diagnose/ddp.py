"""DistributedDataParallel (and FSDP2) knobs that cost collectives, each from counted evidence:
DDP's own statistics and the flight recorder's gradient reductions per optimizer step."""

from __future__ import annotations

from redline.core.findings import Finding, ceiling_speedup, severity_for
from redline.core.measurements import Measurements
from redline.diagnose.thresholds import (
    DDP_BUCKET_COPY_MIN_BYTES,
    DDP_DEFAULT_BUCKET_BYTES,
    DDP_SMALL_BUCKETS_MIN_COUNT,
)

_MIB = 2**20


def _size(n: int) -> str:
    """A bucket cap as the user sets it: MiB, or KiB below one (``bucket_cap_mb=0.01``)."""
    return f"{n / _MIB:.1f} MiB" if n >= _MIB else f"{n / 1024:.0f} KiB"


def sync_every_microbatch(m: Measurements) -> list[Finding]:
    """Gradient accumulation without ``no_sync()`` (DDP) or
    ``set_requires_gradient_sync(False)`` (FSDP2): every micro-batch's backward reduces the
    gradients, where only the last one's needs to."""
    if m.ddp is None and m.fsdp is not None:
        return _fsdp_sync_every_microbatch(m)
    d = m.ddp
    step = m.timing.step_time_mean_s
    if d is None or d.backward_per_step is None or d.all_reduces_per_step is None or not step:
        return []
    k, buckets = d.backward_per_step, max(1, len(d.bucket_sizes_bytes))
    if k < 1.5 or d.all_reduces_per_step < (k - 0.5) * buckets:
        return []
    extra = d.all_reduces_per_step - buckets
    exposed = (None if d.backward_comm_s is None else
               max(0.0, d.backward_comm_s - (d.backward_overlap_s or 0.0)))
    removable = None if exposed is None else (k - 1) * exposed
    share = None if removable is None else min(0.99, removable / step)
    return [Finding(
        id="sync_every_microbatch", severity=severity_for(share) if share is not None else "medium",
        title=f"Gradients are all-reduced after each of the {k:.0f} micro-batches of a step: "
        f"{d.all_reduces_per_step:.1f} all-reduces per step where {buckets} would do",
        evidence={"backward_per_step": round(k, 2), "all_reduces_per_step": round(d.all_reduces_per_step, 2),
         "buckets": buckets, "extra_all_reduces_per_step": round(extra, 2),
         "extra_mb_per_step": round((k - 1) * d.parameter_bytes / 1e6, 3),
         "exposed_comm_ms_per_backward": None if exposed is None else round(exposed * 1e3, 3),
         "comm_source": "DDP's own logging data (sampled iterations)"},
        ceiling_speedup=None if share is None else ceiling_speedup(share),
        fix="Skip the gradient sync on all but the last micro-batch: `with model.no_sync():` around "
        "their forward and backward (DDP), or `model.set_requires_gradient_sync(is_last)` "
        "(FSDP2); gradients then accumulate locally and are all-reduced once per step "
        "(redline.tune.accumulate does this).")]


def _fsdp_sync_every_microbatch(m: Measurements) -> list[Finding]:
    f = m.fsdp
    if f is None or f.backward_per_step is None or f.reductions_per_step is None:
        return []
    k, groups = f.backward_per_step, max(1, f.groups)
    if k < 1.5 or f.reductions_per_step < (k - 0.5) * groups:
        return []
    return [Finding(
        id="sync_every_microbatch", severity="medium",
        title=f"Gradients are reduced after each of the {k:.0f} micro-batches of a step: "
        f"{f.reductions_per_step:.1f} gradient reductions per step where {groups} would do "
        f"(one per fully_shard group)",
        evidence={"backward_per_step": round(k, 2), "reductions_per_step": round(f.reductions_per_step, 2),
         "fully_shard_groups": groups,
         "extra_reductions_per_step": round(f.reductions_per_step - groups, 2),
         "comm_source": "flight recorder: reduce-scatters (all-reduces on gloo) enqueued"},
        ceiling_speedup=None,
        fix="Skip the gradient sync on all but the last micro-batch: "
        "`model.set_requires_gradient_sync(is_last)` before each micro-batch's backward "
        "(FSDP2); gradients then accumulate unsharded locally and are reduced once per step.")]


def unused_parameter_search(m: Measurements) -> list[Finding]:
    """``find_unused_parameters=True`` on a model that uses all its parameters."""
    d = m.ddp
    if d is None or not d.find_unused_parameters or d.unused_parameter_bytes:
        return []
    return [Finding(
        id="unused_parameter_search", severity="low",
        title="DDP searches the autograd graph for unused parameters every step, and finds none",
        evidence={"find_unused_parameters": True, "unused_parameter_bytes": d.unused_parameter_bytes,
         "parameter_mb": round(d.parameter_bytes / 1e6, 3)},
        ceiling_speedup=None,
        fix="DistributedDataParallel(..., find_unused_parameters=False): the search walks the "
        "autograd graph after every forward and adds an all-reduce of the used-parameter map "
        "to every step (PyTorch warns of the cost); static_graph=True where control flow "
        "skips parameters the same way every step. Re-measure after the change.")]


def static_graph(m: Measurements) -> list[Finding]:
    """``find_unused_parameters=True`` without ``static_graph`` on a model that does skip
    parameters: the search runs every step."""
    d = m.ddp
    if d is None or not d.find_unused_parameters or d.static_graph \
            or not d.unused_parameter_bytes:
        return []
    return [Finding(
        id="ddp_static_graph", severity="low",
        title=f"DDP searches the autograd graph every step for the {d.unused_parameter_bytes / 1e6:,.3f}"
        f" MB of parameters the forward skips",
        evidence={"find_unused_parameters": True, "static_graph": False,
         "unused_parameter_bytes": d.unused_parameter_bytes,
         "parameter_mb": round(d.parameter_bytes / 1e6, 3),
         "source": "DDP's own logging data (_get_ddp_logging_data: unused_parameter_size)"},
        ceiling_speedup=None,
        fix="If the forward skips the same parameters every step, "
        "DistributedDataParallel(..., static_graph=True): DDP records the used parameters in "
        "the first iteration and stops searching the graph after every forward (the "
        "static_graph argument's documentation); it also allows reentrant activation "
        "checkpointing. If what is skipped changes from step to step, keep the search. "
        "Re-measure after the change.")]


def small_ddp_buckets(m: Measurements) -> list[Finding]:
    """Many small gradient buckets: each all-reduce pays a fixed latency."""
    d = m.ddp
    if (d is None or d.bucket_cap_bytes >= DDP_DEFAULT_BUCKET_BYTES
            or len(d.bucket_sizes_bytes) < DDP_SMALL_BUCKETS_MIN_COUNT):
        return []
    n = len(d.bucket_sizes_bytes)
    return [Finding(
        id="small_ddp_buckets", severity="low",
        title=f"{n} gradient buckets of at most {_size(d.bucket_cap_bytes)} for "
        f"{d.parameter_bytes / _MIB:,.0f} MiB of parameters: {n} all-reduces per step",
        evidence={"buckets": n, "bucket_cap_mib": round(d.bucket_cap_bytes / _MIB, 2),
         "parameter_mib": round(d.parameter_bytes / _MIB, 1)},
        ceiling_speedup=None,
        fix=f"Raise bucket_cap_mb (default {DDP_DEFAULT_BUCKET_BYTES // _MIB}): a small message "
        "runs far below the link's bandwidth (nccl-tests: bus bandwidth grows with message "
        "size), and each bucket is one more collective; keep enough buckets for the "
        "all-reduce to overlap backward.")]


def gradient_bucket_copies(m: Measurements) -> list[Finding]:
    """DDP copies every gradient into its buckets and keeps both copies."""
    d = m.ddp
    if d is None or d.gradient_as_bucket_view or d.parameter_bytes < DDP_BUCKET_COPY_MIN_BYTES:
        return []
    return [Finding(
        id="gradient_bucket_copies", severity="low",
        title=f"DDP keeps a second copy of the {d.parameter_bytes / _MIB:,.0f} MiB of gradients "
        "and copies into it every step",
        evidence={"gradient_as_bucket_view": False, "gradient_mib": round(d.parameter_bytes / _MIB, 1)},
        ceiling_speedup=None,
        fix="DistributedDataParallel(..., gradient_as_bucket_view=True): gradients become views "
        "of the all-reduce buckets, saving their size in memory and the copy (PyTorch docs; "
        "do not detach_() gradients then).")]
