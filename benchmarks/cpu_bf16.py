"""CPU bf16 autocast against fp32, per model, beside what ``no_mixed_precision`` reads: the
share of the step its counted FLOPs make at this CPU's measured fp32 product rate
(``redline.measure.cpu_gemm``), the Amdahl ceiling from it, and the speedup bf16 autocast really
gives. The rows are MLPs of 2–4 layers (widths 128–2048, batches 32–512, Adam) and the small CNN
of the diagnosis benchmark's ``clean_cnn``; each is timed in fp32 and under
``torch.autocast('cpu', dtype=torch.bfloat16)``, alternating, best of 2 passes.

On a CPU without AMX bf16 units (``amx_bf16`` in /proc/cpuinfo) the speedups are those of
emulated or AVX-512 bf16, and the rule does not apply; the script says so.

Run: .venv/bin/python benchmarks/cpu_bf16.py [--threads 1,2]
What it checks: thresholds.CPU_MATMUL_BOUND_FRACTION (0.5) and MIN_CPU_BF16_CEILING (1.10):
rows at a share below 0.5 gain little or nothing; rows above it gain clearly.
"""

from __future__ import annotations

import argparse
import time
from datetime import datetime, timezone

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from redline.measure.cpu_gemm import measure_gemm_rates
from redline.measure.system import cpu_flags

MLPS = [(128, 512, 2, 64), (128, 512, 2, 256), (256, 256, 3, 128), (512, 512, 3, 64),
        (512, 512, 3, 256), (512, 1024, 3, 64), (512, 1024, 3, 256), (1024, 2048, 2, 32),
        (784, 256, 2, 128), (64, 128, 3, 512)]
"""(input width, hidden width, hidden layers, batch)."""


def mlp(dim: int, hidden: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(dim, hidden), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(hidden, 10))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 10))


def step_s(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
           bf16: bool, n: int) -> float:
    for i in range(n + 5):
        if i == 5:
            t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return (time.perf_counter() - t) / n


def row(name: str, model: nn.Module, x: torch.Tensor, fp32_rate: float, ratio: float) -> None:
    y = torch.randint(0, 10, (x.shape[0],))
    opt = torch.optim.Adam(model.parameters())
    with FlopCounterMode(display=False) as fc:
        F.cross_entropy(model(x), y).backward()
    flops = fc.get_total_flops()
    n = max(10, int(0.5 / max(step_s(model, opt, x, y, False, 3), 1e-4)))
    t32 = t16 = float("inf")
    for _ in range(2):
        t32 = min(t32, step_s(model, opt, x, y, False, n))
        t16 = min(t16, step_s(model, opt, x, y, True, n))
    share = min(1.0, flops / t32 / fp32_rate)
    ceiling = 1 / (1 - share * max(0.0, 1 - ratio))
    print(f"{name:>26} {t32 * 1e3:>9.2f} {share:>6.3f} {ceiling:>8.2f}× {t32 / t16:>8.2f}×")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    amx = "amx_bf16" in cpu_flags()
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
          f"amx_bf16 {'yes' if amx else 'no (the rule does not apply here)'}")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        r = measure_gemm_rates()
        ratio = r.fp32_flops_per_s / r.bf16_flops_per_s
        print(f"\n{threads} thread(s): probe fp32 {r.fp32_flops_per_s / 1e9:,.0f} GFLOP/s, bf16 "
              f"{r.bf16_flops_per_s / 1e9:,.0f} GFLOP/s")
        print(f"{'model':>26} {'fp32 ms':>9} {'share':>6} {'ceiling':>9} {'bf16 real':>9}")
        for dim, hidden, depth, batch in MLPS:
            row(f"MLP {dim}→{hidden}×{depth} b{batch}", mlp(dim, hidden, depth),
                torch.randn(batch, dim), r.fp32_flops_per_s, ratio)
        row("CNN (clean_cnn) b64", cnn(), torch.randn(64, 3, 32, 32), r.fp32_flops_per_s, ratio)


if __name__ == "__main__":
    main()
