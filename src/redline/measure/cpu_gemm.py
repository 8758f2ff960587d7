"""This CPU's matrix-multiply rates in fp32 and bf16, measured on the training process's own
torch threads: what tells whether a CPU job's step would run faster in bf16.

A CPU with AMX tiles (``amx_bf16``) multiplies bf16 matrices several times faster than its
AVX-512 units do fp32 ones, but only matrices large enough to fill the tiles, and only the
matrix products of a step gain. A step of small layers is bound by per-operator overhead: there
autocast's casts cost about what the tiles save (``benchmarks/cpu_bf16.py`` on a Sapphire Rapids
CPU, 2026-12-05: a 128 → 512 → 512 → 10 MLP at batch 64 ran 0.95–1.01× as fast under
``torch.autocast('cpu', dtype=torch.bfloat16)``, a 512 → 1024 ×3 → 10 MLP at batch 256
2.11–2.20× as fast). So the share of the step spent in matrix products is estimated from the
step's counted FLOPs: achieved FLOP/s ÷ this probe's fp32 rate, on the same threads. The probe
is one product of 256×1024 by 1024×1024, large enough for the tiles (the same run: bf16 at
5.6–5.9× the fp32 rate), best of :data:`REPEATS`, after one untimed call
in which oneDNN picks its kernel; a few tens of milliseconds in all, run once when the watch
closes, never inside the loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

SHAPE = (256, 1024, 1024)
"""(m, k, n) of the probe's product."""

REPEATS = 5
"""Timed products per dtype; the fastest counts (a loaded host only slows a product)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmRates:
    """FLOP/s of the probe's matrix product per dtype, on ``threads`` torch threads."""

    fp32_flops_per_s: float
    bf16_flops_per_s: float
    threads: int
    """torch.get_num_threads() while the probe ran (the training process's setting)."""


def measure_gemm_rates(shape: tuple[int, int, int] = SHAPE, repeats: int = REPEATS,
                       threads: int | None = None) -> GemmRates:
    """Time the product in fp32 and in bf16 (see the module docstring), on ``threads`` torch
    threads (the training loop's, which the program may have changed since; None: the
    current setting). Leaves torch's random state, grad mode, autocast state and thread count
    as they were."""
    before = torch.get_num_threads()
    if threads is None or threads == before:
        return _measure(shape, repeats)
    torch.set_num_threads(threads)
    try:
        return _measure(shape, repeats)
    finally:
        torch.set_num_threads(before)


def _measure(shape: tuple[int, int, int], repeats: int) -> GemmRates:
    m, k, n = shape
    flops = 2.0 * m * k * n
    best: dict[torch.dtype, float] = {}
    # torch.full, not randn: the user's random stream is not advanced, and the rate of a
    # product does not depend on its values (no denormals in either).
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.full((m, k), 0.5, dtype=dtype)
            b = torch.full((k, n), 0.25, dtype=dtype)
            torch.mm(a, b)  # untimed: the kernel's selection and any JIT happen here
            fastest = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                torch.mm(a, b)
                fastest = min(fastest, time.perf_counter() - t)
            best[dtype] = fastest
    return GemmRates(fp32_flops_per_s=flops / best[torch.float32],
                     bf16_flops_per_s=flops / best[torch.bfloat16],
                     threads=torch.get_num_threads())
