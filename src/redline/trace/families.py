"""Kernel families read from kernel names, and communication left exposed: the facts the trace
rules of :mod:`redline.diagnose.trace_rules` judge.

Each fact is a number of the trace (µs, counts, example names); whether it is worth a finding is
decided by the rules and their thresholds, not here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from redline.trace.breakdown import DeviceTime, device_time, intersection, merge, total
from redline.trace.events import Event
from redline.trace.select import COMMUNICATION, COMPUTATION

MEMORY_BOUND = re.compile(
    r"elementwise|reduce_kernel|norm|softmax|CatArray|copy_kernel|fill_kernel|gather|scatter|"
    r"index_|dropout", re.IGNORECASE)
"""Kernel families that move more bytes than they compute (PyTorch's at::native elementwise,
reduction, normalization, concat/copy kernels): fusing them saves memory round trips."""

GEMM = re.compile(r"gemm|matmul|xmma|cutlass|cublas|bmm", re.IGNORECASE)
FP32_GEMM = re.compile(r"sgemm|f32f32|fp32|_s\d{3,4}gemm", re.IGNORECASE)
LOW_PRECISION = re.compile(r"tf32|bf16|f16|h\d{3,4}gemm|hgemm|fp16|e4m3|e5m2", re.IGNORECASE)


@dataclass(slots=True, kw_only=True)
class KernelFamilies:
    """Per-rank totals of the kernel families the rules look at (µs on the device)."""

    memory_bound_us: float = 0.0
    """Union of memory-bound kernels (:data:`MEMORY_BOUND`)."""
    memory_bound_examples: list[str] = field(default_factory=list)
    fp32_gemm_us: float = 0.0
    """Union of GEMM kernels whose names say fp32 and no lower precision."""
    fp32_gemm_kernels: int = 0
    fp32_gemm_example: str | None = None
    unfused_attention: int = 0
    """Softmax kernels launched between two GEMMs on one stream: attention written by hand."""
    unfused_attention_softmax_us: float = 0.0
    comm_us: float = 0.0
    """Union of communication kernels."""
    comm_exposed_us: float = 0.0
    """Communication time during which no computation runs."""


def kernel_families(device: list[Event], merged: DeviceTime | None = None) -> KernelFamilies:
    """The families of ``device`` (one rank's device events)."""
    cache: dict[tuple[str, str], bool] = {}

    def matches(pattern: re.Pattern[str], name: str) -> bool:
        # Once per distinct name: a trace repeats a few hundred names thousands of times.
        key = (pattern.pattern, name)
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = pattern.search(name) is not None
        return hit

    kernels = [e for e in device if e.cat == "kernel"]
    out = KernelFamilies()
    memory_bound = [e for e in kernels if matches(MEMORY_BOUND, e.name)]
    out.memory_bound_us = total(merge([(e.ts, e.end) for e in memory_bound]))
    out.memory_bound_examples = sorted({e.name.split("<")[0][:60] for e in memory_bound})[:3]
    fp32_gemms = [e for e in kernels if matches(GEMM, e.name) and matches(FP32_GEMM, e.name)
                  and not matches(LOW_PRECISION, e.name)]
    out.fp32_gemm_us = total(merge([(e.ts, e.end) for e in fp32_gemms]))
    out.fp32_gemm_kernels = len(fp32_gemms)
    out.fp32_gemm_example = fp32_gemms[0].name[:80] if fp32_gemms else None
    by_stream: dict[int, list[Event]] = {}
    for e in sorted(kernels, key=lambda e: e.ts):
        by_stream.setdefault(e.stream, []).append(e)
    for evs in by_stream.values():
        for a, b, c in zip(evs, evs[1:], evs[2:], strict=False):
            if "softmax" in b.name.lower() and matches(GEMM, a.name) and matches(GEMM, c.name):
                out.unfused_attention += 1
                out.unfused_attention_softmax_us += b.dur
    merged = device_time(device) if merged is None else merged
    comm = merged.of(COMMUNICATION)
    if comm:
        comp = merged.of(COMPUTATION)
        out.comm_us = total(comm)
        out.comm_exposed_us = out.comm_us - intersection(comm, comp)
    return out
