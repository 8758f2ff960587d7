"""Kernel families read from kernel names, and communication left exposed: the facts the trace
rules of :mod:`redline.diagnose.trace_rules` judge.

Each fact is a number of the trace (µs, counts, example names); whether it is worth a finding is
decided by the rules and their thresholds, not here.
"""

from __future__ import annotations

import re

from redline.core.record import field, record
from redline.trace.breakdown import DeviceTime, device_time, intersection, merge, total
from redline.trace.events import Event
from redline.trace.select import COMMUNICATION, COMPUTATION

# The patterns are lower case and matched against the lower-cased name: with re.IGNORECASE,
# CPython's engine cannot search for a pattern's literal prefixes and tries every position of
# names that run to thousands of characters (templated kernels): ~9x slower on real traces.
MEMORY_BOUND = re.compile(
    r"elementwise|reduce_kernel|norm|softmax|catarray|copy_kernel|fill_kernel|gather|scatter|"
    r"index_|dropout")
"""Kernel families that move more bytes than they compute (PyTorch's at::native elementwise,
reduction, normalization, concat/copy kernels): fusing them saves memory round trips."""

GEMM = re.compile(r"gemm|matmul|xmma|cutlass|cublas|bmm")
FP32_GEMM = re.compile(r"sgemm|f32f32|fp32|_s\d{3,4}gemm")
LOW_PRECISION = re.compile(r"tf32|bf16|f16|h\d{3,4}gemm|hgemm|fp16|e4m3|e5m2")


def _family(name: str) -> tuple[bool, bool, bool]:
    """(memory-bound, GEMM, fp32 GEMM) of a kernel name, case-insensitively."""
    low = name.lower()
    gemm = GEMM.search(low) is not None
    fp32 = gemm and FP32_GEMM.search(low) is not None and LOW_PRECISION.search(low) is None
    return MEMORY_BOUND.search(low) is not None, gemm, fp32


@record
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
    # Once per distinct name: a trace repeats a few hundred names thousands of times.
    family: dict[str, tuple[bool, bool, bool]] = {}
    kernels: list[tuple[Event, tuple[bool, bool, bool]]] = []
    for e in device:
        if e.cat == "kernel":
            f = family.get(e.name)
            if f is None:
                f = family[e.name] = _family(e.name)
            kernels.append((e, f))
    out = KernelFamilies()
    memory_bound = [e for e, (mem, _, _) in kernels if mem]
    out.memory_bound_us = total(merge([(e.ts, e.end) for e in memory_bound]))
    out.memory_bound_examples = sorted({e.name.split("<")[0][:60] for e in memory_bound})[:3]
    fp32_gemms = [e for e, (_, _, fp32) in kernels if fp32]
    out.fp32_gemm_us = total(merge([(e.ts, e.end) for e in fp32_gemms]))
    out.fp32_gemm_kernels = len(fp32_gemms)
    out.fp32_gemm_example = fp32_gemms[0].name[:80] if fp32_gemms else None
    by_stream: dict[int, list[tuple[Event, tuple[bool, bool, bool]]]] = {}
    for k in sorted(kernels, key=lambda k: k[0].ts):
        by_stream.setdefault(k[0].stream, []).append(k)
    for evs in by_stream.values():
        for (_, (_, gemm_a, _)), (b, _), (_, (_, gemm_c, _)) in zip(evs, evs[1:], evs[2:],
                                                                    strict=False):
            if gemm_a and gemm_c and "softmax" in b.name.lower():
                out.unfused_attention += 1
                out.unfused_attention_softmax_us += b.dur
    merged = device_time(device) if merged is None else merged
    comm = merged.of(COMMUNICATION)
    if comm:
        comp = merged.of(COMPUTATION)
        out.comm_us = total(comm)
        out.comm_exposed_us = out.comm_us - intersection(comm, comp)
    return out
