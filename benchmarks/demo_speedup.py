"""End to end: naive → tuned on the built-in `vision` workload, on the CPU and on the SIMULATED
accelerator, each ratio measured side by side (before and after alternate within one run).

    PYTHONPATH=src .venv/bin/python benchmarks/demo_speedup.py [--repeats N] [--only VARIANT]

Targets: ≥ 1.5× on 2 CPU cores; ≥ 3× with the simulated accelerator. Takes a few
minutes per repeat on 2 cores. The plan store is a temporary folder, so every run searches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

from redline.demo import run_demo
from redline.tune import TuneConfig
from redline.workloads.simulated import SimulatedAccelerator

TARGETS = {"cpu": 1.5, "simulated": 3.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1, help="whole demo runs per variant")
    ap.add_argument("--only", choices=sorted(TARGETS), help="run one variant")
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    sim = SimulatedAccelerator()
    print(f"{cpus} usable CPUs; {sim.label()}", flush=True)
    rows = []
    for variant in [args.only] if args.only else ["cpu", "simulated"]:
        ratios, plans = [], []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as d:
                cfg = TuneConfig(try_compile=False, reuse=False, store_dir=d)
                _, res = run_demo("vision", steps=5, show=False, tune_config=cfg,
                                  simulated=sim if variant == "simulated" else None)
            assert res is not None and res.speedup is not None
            ratios.append(res.speedup)
            p = res.plan
            plans.append(f"{p.micro_batch}×{p.accumulation_steps} {p.precision} "
                         f"w{p.loader.num_workers} cl={p.channels_last} opt={p.optimizer_impl}")
            b, a = res.before, res.after
            print(f"{variant}: {b.throughput_samples_per_s:,.0f} → "
                  f"{a.throughput_samples_per_s:,.0f} samples/s = {res.speedup:.2f}× "
                  f"(data wait {b.data_wait_fraction or 0:.0%} → {a.data_wait_fraction or 0:.0%});"
                  f" plan {plans[-1]}", flush=True)
        rows.append((variant, min(ratios), statistics.median(ratios), TARGETS[variant]))
    print("\n| variant | min speed-up | median | target | met |")
    print("|---|---|---|---|---|")
    for variant, lo, med, target in rows:
        print(f"| vision, {variant} | {lo:.2f}× | {med:.2f}× | ≥ {target:g}× | "
              f"{'yes' if lo >= target else 'NO'} |")
    return 0 if all(lo >= t for _, lo, _, t in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
