"""Loader autotune vs an exhaustive grid, on the `vision` workload (real JPEG decode) against a
SIMULATED accelerator (a consumer that sleeps, releasing the GIL as a GPU would).

Grid: num_workers 0..2×cores × prefetch_factor {1, 2, 4} × pin_memory {False, True}. Both
searches time the same loop; at the end autotune's pick and the grid's best are re-measured
alternately (5 times each) so the throughput ratio is side by side.

Run: .venv/bin/python benchmarks/loader_autotune.py [--device-ms 15] [--batches 16]
Target: ≥ 95 % of the grid's best throughput using ≤ 15 % of the grid's time.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

from torch.utils.data import DataLoader

from redline.data import LoaderSettings, autotune_loader
from redline.data.autotune import measure
from redline.measure.system import cpu_budget
from redline.workloads.vision import SyntheticJpegDataset, VisionConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device-ms", type=float, default=15.0,
                    help="simulated accelerator time per batch of 16 (default 15 ms)")
    ap.add_argument("--batches", type=int, default=16, help="batches timed per setting")
    args = ap.parse_args()
    warnings.simplefilter("ignore")  # pin_memory without an accelerator warns per loader
    ds = SyntheticJpegDataset(VisionConfig(length=100_000))

    def make(s: LoaderSettings) -> DataLoader[Any]:
        return DataLoader(ds, batch_size=16, shuffle=True, **s.loader_kwargs())

    def consume(batch: Any) -> None:
        time.sleep(args.device_ms / 1e3)  # SIMULATED accelerator

    cpus = cpu_budget().cpus
    t0 = time.perf_counter()
    grid = []
    for w in range(int(2 * cpus) + 1):
        for pf in ([None] if w == 0 else [1, 2, 4]):
            for pin in (False, True):
                s = LoaderSettings(num_workers=w, prefetch_factor=pf, pin_memory=pin,
                                   persistent_workers=w > 0)
                grid.append(measure(make, consume, s, max(1, int(cpus) - w), args.batches))
    grid_s = time.perf_counter() - t0
    plan = autotune_loader(make, consume, cpus=cpus, batches_per_trial=args.batches)
    best = max(grid, key=lambda t: t.samples_per_s)
    a, b = [], []
    for _ in range(5):  # side by side: the two picks, alternately
        a.append(measure(make, consume, plan.settings, args.batches).samples_per_s)
        b.append(measure(make, consume, best.settings, args.batches).samples_per_s)
    ratio = statistics.median(a) / statistics.median(b)
    time_share = plan.tuning_s / grid_s
    print(f"SIMULATED accelerator: {args.device_ms:g} ms per batch of 16; {cpus:g} usable CPUs")
    print(f"grid: {len(grid)} settings in {grid_s:.1f} s; best {best.settings.num_workers} "
          f"workers, prefetch {best.settings.prefetch_factor}, pin {best.settings.pin_memory}")
    print(f"autotune: {len(plan.trials)} trials in {plan.tuning_s:.1f} s; {plan.reason}")
    print(f"re-measured side by side: autotune {statistics.median(a):,.0f} samples/s, grid best "
          f"{statistics.median(b):,.0f} → {ratio:.1%} of the grid's best, "
          f"using {time_share:.1%} of the grid's time")
    ok = ratio >= 0.95 and time_share <= 0.15
    print("target (≥ 95 % of best, ≤ 15 % of the time):", "MET" if ok else "NOT MET")


if __name__ == "__main__":
    main()
