"""Findings from a profiler trace (catalogue ids): one function per finding over one rank's
analysis, plus the job-level straggler rule over all ranks, and their registry with
:func:`diagnose_trace` (here, not in :mod:`redline.diagnose.engine`, so a trace is diagnosed
without loading the rules over a watch's measurements).

The numbers come from :mod:`redline.trace` (torch-free); the thresholds from
:mod:`redline.diagnose.thresholds`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from redline.core.findings import Finding, ceiling_speedup, rank, severity_for
from redline.diagnose.thresholds import (
    COMM_EXPOSED_MIN_FRACTION,
    MEMORY_BOUND_MIN_SHARE_OF_COMPUTE,
    PAGEABLE_H2D_MIN_FRACTION,
    SHORT_KERNELS_MIN_FRACTION,
    STRAGGLER_MIN_SKEW,
    TF32_OVER_FP32_GEMM_SPEEDUP,
    TRACE_SHARE_MIN,
)
from redline.trace.analyze import RankAnalysis, TraceAnalysis

TraceRule = Callable[[RankAnalysis], list[Finding]]
JobRule = Callable[[TraceAnalysis], list[Finding]]


def _window_share(us: float, r: RankAnalysis) -> float:
    t = r.temporal
    return us / t.window_us if t is not None and t.window_us else 0.0


def launch_bound(r: RankAnalysis) -> list[Finding]:
    """The device idles waiting for the host, and most kernels run shorter than their launch."""
    t, launches = r.temporal, r.launches
    if t is None or launches is None or not launches.launches:
        return []
    idle = r.idle_sum_over_streams
    idle_total = sum(idle.values())
    host_frac = idle.get("host_wait", 0.0) / idle_total if idle_total > 0 else 0.0
    share = _window_share(t.idle_us * host_frac, r)
    if share < TRACE_SHARE_MIN or launches.short_kernels < SHORT_KERNELS_MIN_FRACTION * launches.launches:
        return []
    return [Finding(
        id="launch_bound", severity=severity_for(share),
        title=f"The GPU waits for the host {share:.0%} of the time; {launches.short_kernels} of "
        f"{launches.launches} kernels run shorter than their launch",
        evidence={"host_wait_share": round(share, 4), "short_kernels": launches.short_kernels,
         "launches": launches.launches, "median_kernel_us": launches.gpu_kernel_us_median,
         "median_launch_us": launches.cpu_launch_us_median},
        ceiling_speedup=ceiling_speedup(share),
        fix="Launch fewer, larger kernels: torch.compile (fuses small ops), CUDA graphs "
        "(torch.compile(mode='reduce-overhead') or torch.cuda.graphs) for static shapes, "
        "or a larger batch per kernel.")]


def memory_bound_kernels(r: RankAnalysis) -> list[Finding]:
    """Elementwise, reduction and normalization kernels take a large share of compute."""
    t, k = r.temporal, r.families
    if t is None:
        return []
    comp_us = t.compute_us or 1.0
    share = _window_share(k.memory_bound_us, r)
    if k.memory_bound_us / comp_us < MEMORY_BOUND_MIN_SHARE_OF_COMPUTE or share < TRACE_SHARE_MIN:
        return []
    return [Finding(
        id="memory_bound_kernels", severity=severity_for(share),
        title=f"Elementwise / reduction / normalization kernels take {k.memory_bound_us / comp_us:.0%} "
        "of compute time",
        evidence={"memory_bound_us": round(k.memory_bound_us, 1),
         "share_of_compute": round(k.memory_bound_us / comp_us, 4),
         "share_of_window": round(share, 4), "examples": "; ".join(k.memory_bound_examples)},
        ceiling_speedup=ceiling_speedup(share),
        fix="Fuse them: torch.compile the model (Inductor fuses chains of pointwise and "
        "reduction ops into one kernel each); use fused LayerNorm/optimizers. Ceiling "
        "assumes fusion removes their time entirely.")]


def fp32_matmul_on_tensor_cores(r: RankAnalysis) -> list[Finding]:
    """fp32 GEMM kernels on a GPU with TF32/bf16 tensor cores (compute capability ≥ 8.0)."""
    cc, k = r.compute_capability, r.families
    if cc is None or cc < 8.0 or r.temporal is None:
        return []
    share = _window_share(k.fp32_gemm_us, r)
    if share < TRACE_SHARE_MIN:
        return []
    return [Finding(
        id="fp32_matmul_on_tensor_cores", severity=severity_for(share),
        title=f"{k.fp32_gemm_kernels} fp32 GEMM kernels ({share:.0%} of the window) on a GPU with "
        f"TF32/bf16 tensor cores (compute capability {cc})",
        evidence={"fp32_gemm_us": round(k.fp32_gemm_us, 1), "share_of_window": round(share, 4),
         "example": k.fp32_gemm_example},
        ceiling_speedup=ceiling_speedup(share * (1 - 1 / TF32_OVER_FP32_GEMM_SPEEDUP)),
        fix="torch.set_float32_matmul_precision('high') (TF32), or bf16 autocast.")]


def unfused_attention(r: RankAnalysis) -> list[Finding]:
    """GEMM → softmax → GEMM on one stream: attention written out by hand."""
    k = r.families
    if not k.unfused_attention or r.temporal is None:
        return []
    share = _window_share(k.unfused_attention_softmax_us, r)
    return [Finding(
        id="unfused_attention", severity=severity_for(share),
        title=f"{k.unfused_attention} softmax kernels sit between two matmuls: attention written out "
        "by hand",
        evidence={"occurrences": k.unfused_attention,
         "softmax_us": round(k.unfused_attention_softmax_us, 1),
         "share_of_window": round(share, 4)},
        ceiling_speedup=ceiling_speedup(share),
        fix="Use torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...): "
        "flash / memory-efficient kernels never materialize the attention matrix. Ceiling "
        "counts only the softmax time; the saved memory traffic adds more.")]


def comm_not_overlapped(r: RankAnalysis) -> list[Finding]:
    """Communication kernels run with no computation beside them."""
    k = r.families
    share = _window_share(k.comm_exposed_us, r)
    if not k.comm_us or share < COMM_EXPOSED_MIN_FRACTION:
        return []
    return [Finding(
        id="comm_not_overlapped", severity=severity_for(share),
        title=f"Communication runs alone {share:.0%} of the time",
        evidence={"exposed_comm_us": round(k.comm_exposed_us, 1), "comm_us": round(k.comm_us, 1),
         "share_of_window": round(share, 4)},
        ceiling_speedup=ceiling_speedup(share),
        fix="Overlap gradients' all-reduce with backward: DDP buckets (bucket_cap_mb), "
        "no_sync() on all but the last micro-batch under accumulation, FSDP prefetch.")]


def host_sync(r: RankAnalysis) -> list[Finding]:
    """Host synchronizations after which the device sat idle."""
    host_side = [s for s in r.syncs if not s.name.endswith("(device)")]
    idle_after = sum(s.device_idle_after_us for s in host_side)
    share = _window_share(idle_after, r)
    if not host_side or share < TRACE_SHARE_MIN:
        return []
    return [Finding(
        id="host_sync", severity=severity_for(share),
        title=f"{sum(s.count for s in host_side)} host synchronizations leave the GPU idle "
        f"{share:.0%} of the time",
        evidence={"device_idle_after_us": round(idle_after, 1), "share_of_window": round(share, 4),
         "by_call": "; ".join(f"{s.name} ×{s.count}" for s in host_side[:4])},
        ceiling_speedup=ceiling_speedup(share),
        fix="Remove the synchronizing calls from the step (.item(), .cpu(), print(tensor), "
        "torch.cuda.synchronize(), blocking copies); read metrics every N steps.")]


def h2d_copy(r: RankAnalysis) -> list[Finding]:
    """Host→device copies take a share of the window, or come from pageable memory."""
    h2d = [c for c in r.copies if c.kind == "Memcpy HtoD"]
    h2d_us = sum(c.total_us for c in h2d)
    share = _window_share(h2d_us, r)
    pageable = sum(c.pageable for c in h2d)
    if not h2d or not (share >= TRACE_SHARE_MIN or (pageable and share >= PAGEABLE_H2D_MIN_FRACTION)):
        return []
    return [Finding(
        id="h2d_copy", severity=severity_for(share),
        title=f"Host→device copies take {share:.0%} of the window ({pageable} from pageable memory)",
        evidence={"h2d_us": round(h2d_us, 1), "share_of_window": round(share, 4),
         "pageable_copies": pageable,
         "gb_per_s": None if h2d[0].gb_per_s is None else round(h2d[0].gb_per_s, 2)},
        ceiling_speedup=ceiling_speedup(share),
        fix="DataLoader(pin_memory=True) and .to(device, non_blocking=True), or "
        "redline.data.DevicePrefetcher to copy the next batch while this one computes.")]


def straggler(a: TraceAnalysis) -> list[Finding]:
    """The rank that arrives last at collectives, by how much of the window (all ranks)."""
    if not a.stragglers:
        return []
    worst = max(a.stragglers, key=lambda s: s.mean_lateness_us)
    window = a.stragglers_window_us
    late_total = worst.mean_lateness_us * worst.collectives
    share = late_total / window if window else 0.0
    if share < STRAGGLER_MIN_SKEW:
        return []
    return [Finding(
        id="straggler", severity=severity_for(share),
        title=f"Rank {worst.rank} arrives last at {worst.last_arrivals} of {worst.collectives} "
        f"collectives, {worst.mean_lateness_us:.0f} µs late on average"
        + (" (gloo's host-side collectives)" if a.stragglers_source == "host" else ""),
        evidence={"rank": worst.rank, "source": a.stragglers_source, "last_arrivals": worst.last_arrivals,
         "collectives": worst.collectives, "mean_lateness_us": round(worst.mean_lateness_us, 1),
         "share_of_window": round(share, 4)},
        ceiling_speedup=ceiling_speedup(share),
        fix=f"Find what rank {worst.rank} does more of (data loading, a slower GPU or host, "
        "uneven batches or sequence lengths); every other rank waits for it.")]


TRACE_RULES: dict[str, TraceRule] = {
    "launch_bound": launch_bound,
    "memory_bound_kernels": memory_bound_kernels,
    "fp32_matmul_on_tensor_cores": fp32_matmul_on_tensor_cores,
    "unfused_attention": unfused_attention,
    "comm_not_overlapped": comm_not_overlapped,
    "host_sync": host_sync,
    "h2d_copy": h2d_copy,
}
"""Rules over one rank's trace analysis."""

JOB_RULES: dict[str, JobRule] = {
    "straggler": straggler,
}
"""Rules over all ranks' traces of one job."""


def diagnose_trace(a: TraceAnalysis) -> list[Finding]:
    """Every trace rule over each rank with device events, and the job rules, ranked; with
    more than one rank, each rank's findings name their rank.

    Args:
        a: the analysis of one job's traces (:func:`redline.trace.analyze_paths`).

    Returns:
        The findings, ranked by :func:`redline.core.rank`; ranks without device events add
        none.
    """
    several = len(a.ranks) > 1
    found = [dataclasses.replace(f, rank=r.rank) if several and f.rank is None else f
             for r in a.ranks if r.temporal is not None
             for rule in TRACE_RULES.values() for f in rule(r)]
    found += [f for rule in JOB_RULES.values() for f in rule(a)]
    return rank(found)
