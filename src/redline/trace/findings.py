"""Findings (design §4 ids) from a trace, each with the trace's numbers and a ceiling speedup."""

from __future__ import annotations

import re

from redline.diagnose.finding import ceiling_speedup, severity_for
from redline.report.model import Finding
from redline.trace.breakdown import Temporal, intersection, merge, total
from redline.trace.kernels import CopyStat, LaunchStats, SyncStat
from redline.trace.load import Event
from redline.trace.select import COMMUNICATION, COMPUTATION, kernel_type


def _matches(pattern: re.Pattern[str], name: str, cache: dict[tuple[str, str], bool]) -> bool:
    """``pattern.search(name)``, once per distinct name (names repeat thousands of times)."""
    key = (pattern.pattern, name)
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = pattern.search(name) is not None
    return hit


MEMORY_BOUND = re.compile(
    r"elementwise|reduce_kernel|norm|softmax|CatArray|copy_kernel|fill_kernel|gather|scatter|"
    r"index_|dropout", re.IGNORECASE)
"""Kernel families that move more bytes than they compute (PyTorch's at::native elementwise,
reduction, normalization, concat/copy kernels): fusing them saves memory round trips."""

GEMM = re.compile(r"gemm|matmul|xmma|cutlass|cublas|bmm", re.IGNORECASE)
FP32_GEMM = re.compile(r"sgemm|f32f32|fp32|_s\d{3,4}gemm", re.IGNORECASE)
LOW_PRECISION = re.compile(r"tf32|bf16|f16|h\d{3,4}gemm|hgemm|fp16|e4m3|e5m2", re.IGNORECASE)

COMM_EXPOSED_MIN = 0.10
"""Exposed communication ≥ 10 % of the window (TB-profiler rule: communication ÷ step > 10 %)."""
SHARE_MIN = 0.05
"""Other trace findings need ≥ 5 % of the window at stake."""


def _window_share(us: float, t: Temporal) -> float:
    return us / t.window_us if t.window_us else 0.0


def trace_findings(device: list[Event], t: Temporal, idle_sum: dict[str, float],
                   launches: LaunchStats, copies: list[CopyStat], syncs: list[SyncStat],
                   compute_capability: float | None) -> list[Finding]:
    out: list[Finding] = []
    kernels = [e for e in device if e.cat == "kernel"]
    seen: dict[tuple[str, str], bool] = {}

    def memory_bound(e: Event) -> bool:
        return _matches(MEMORY_BOUND, e.name, seen)

    def gemm(e: Event) -> bool:
        return _matches(GEMM, e.name, seen)

    # launch_bound: idle is mostly host wait and kernels are shorter than their launch.
    idle_total = sum(idle_sum.values())
    host_frac = idle_sum.get("host_wait", 0.0) / idle_total if idle_total > 0 else 0.0
    host_wait_share = _window_share(t.idle_us * host_frac, t)
    if (host_wait_share >= SHARE_MIN and launches.launches
            and launches.short_kernels >= 0.5 * launches.launches):
        out.append(Finding(
            "launch_bound", severity_for(host_wait_share),
            f"The GPU waits for the host {host_wait_share:.0%} of the time; "
            f"{launches.short_kernels} of {launches.launches} kernels run shorter than their launch",
            {"host_wait_share": round(host_wait_share, 4), "short_kernels": launches.short_kernels,
             "launches": launches.launches,
             "median_kernel_us": launches.gpu_kernel_us_median,
             "median_launch_us": launches.cpu_launch_us_median},
            ceiling_speedup(host_wait_share),
            "Launch fewer, larger kernels: torch.compile (fuses small ops), CUDA graphs "
            "(torch.compile(mode='reduce-overhead') or torch.cuda.graphs) for static shapes, "
            "or a larger batch per kernel."))

    # memory_bound_kernels
    mb = merge([(e.ts, e.end) for e in kernels if memory_bound(e)])
    mb_us = total(mb)
    comp_us = t.compute_us or 1.0
    if mb_us / comp_us >= 0.4 and _window_share(mb_us, t) >= SHARE_MIN:
        share = _window_share(mb_us, t)
        names = sorted({e.name.split("<")[0][:60] for e in kernels if memory_bound(e)})
        out.append(Finding(
            "memory_bound_kernels", severity_for(share),
            f"Elementwise / reduction / normalization kernels take {mb_us / comp_us:.0%} of "
            "compute time",
            {"memory_bound_us": round(mb_us, 1), "share_of_compute": round(mb_us / comp_us, 4),
             "share_of_window": round(share, 4), "examples": "; ".join(names[:3])},
            ceiling_speedup(share),
            "Fuse them: torch.compile the model (Inductor fuses chains of pointwise and "
            "reduction ops into one kernel each); use fused LayerNorm/optimizers. Ceiling "
            "assumes fusion removes their time entirely."))

    # fp32_matmul_on_tensor_cores
    if compute_capability is not None and compute_capability >= 8.0:
        f32 = [e for e in kernels if gemm(e) and _matches(FP32_GEMM, e.name, seen)
               and not _matches(LOW_PRECISION, e.name, seen)]
        f32_us = total(merge([(e.ts, e.end) for e in f32]))
        share = _window_share(f32_us, t)
        if share >= SHARE_MIN:
            out.append(Finding(
                "fp32_matmul_on_tensor_cores", severity_for(share),
                f"{len(f32)} fp32 GEMM kernels ({share:.0%} of the window) on a GPU with "
                f"TF32/bf16 tensor cores (compute capability {compute_capability})",
                {"fp32_gemm_us": round(f32_us, 1), "share_of_window": round(share, 4),
                 "example": f32[0].name[:80]},
                # TF32 tensor cores run fp32 GEMMs ≥ 8× faster than SIMT fp32 (A100/H100 peaks).
                ceiling_speedup(share * (1 - 1 / 8)),
                "torch.set_float32_matmul_precision('high') (TF32), or bf16 autocast."))

    # unfused_attention: GEMM → softmax → GEMM on one stream
    by_stream: dict[int, list[Event]] = {}
    for e in sorted(kernels, key=lambda e: e.ts):
        by_stream.setdefault(e.stream, []).append(e)
    hits: list[Event] = []
    for evs in by_stream.values():
        for a, b, c in zip(evs, evs[1:], evs[2:], strict=False):
            if "softmax" in b.name.lower() and gemm(a) and gemm(c):
                hits.append(b)
    if hits:
        sm_us = sum(e.dur for e in hits)
        share = _window_share(sm_us, t)
        out.append(Finding(
            "unfused_attention", severity_for(share),
            f"{len(hits)} softmax kernels sit between two matmuls: attention written out by hand",
            {"occurrences": len(hits), "softmax_us": round(sm_us, 1),
             "share_of_window": round(share, 4)},
            ceiling_speedup(share),
            "Use torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...): "
            "flash / memory-efficient kernels never materialize the attention matrix. Ceiling "
            "counts only the softmax time; the saved memory traffic adds more."))

    # comm_not_overlapped
    comm = merge([(e.ts, e.end) for e in device if kernel_type(e) == COMMUNICATION])
    if comm:
        comp = merge([(e.ts, e.end) for e in device if kernel_type(e) == COMPUTATION])
        exposed = total(comm) - intersection(comm, comp)
        share = _window_share(exposed, t)
        if share >= COMM_EXPOSED_MIN:
            out.append(Finding(
                "comm_not_overlapped", severity_for(share),
                f"Communication runs alone {share:.0%} of the time",
                {"exposed_comm_us": round(exposed, 1), "comm_us": round(total(comm), 1),
                 "share_of_window": round(share, 4)},
                ceiling_speedup(share),
                "Overlap gradients' all-reduce with backward: DDP buckets (bucket_cap_mb), "
                "no_sync() on all but the last micro-batch under accumulation, FSDP prefetch."))

    # host_sync
    host_side = [s for s in syncs if not s.name.endswith("(device)")]
    idle_after = sum(s.device_idle_after_us for s in host_side)
    share = _window_share(idle_after, t)
    if host_side and share >= SHARE_MIN:
        out.append(Finding(
            "host_sync", severity_for(share),
            f"{sum(s.count for s in host_side)} host synchronizations leave the GPU idle "
            f"{share:.0%} of the time",
            {"device_idle_after_us": round(idle_after, 1), "share_of_window": round(share, 4),
             "by_call": "; ".join(f"{s.name} ×{s.count}" for s in host_side[:4])},
            ceiling_speedup(share),
            "Remove the synchronizing calls from the step (.item(), .cpu(), print(tensor), "
            "torch.cuda.synchronize(), blocking copies); read metrics every N steps."))

    # h2d_copy
    h2d = [c for c in copies if c.kind == "Memcpy HtoD"]
    h2d_us = sum(c.total_us for c in h2d)
    share = _window_share(h2d_us, t)
    pageable = sum(c.pageable for c in h2d)
    if h2d and (share >= SHARE_MIN or (pageable and share >= 0.01)):
        out.append(Finding(
            "h2d_copy", severity_for(share),
            f"Host→device copies take {share:.0%} of the window ({pageable} from pageable memory)",
            {"h2d_us": round(h2d_us, 1), "share_of_window": round(share, 4),
             "pageable_copies": pageable,
             "gb_per_s": None if h2d[0].gb_per_s is None else round(h2d[0].gb_per_s, 2)},
            ceiling_speedup(share),
            "DataLoader(pin_memory=True) and .to(device, non_blocking=True), or "
            "redline.data.DevicePrefetcher to copy the next batch while this one computes."))
    return out
