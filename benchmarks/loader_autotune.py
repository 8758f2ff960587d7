"""Loader autotune vs an exhaustive grid, on two kinds of data path against a SIMULATED
accelerator (a consumer that sleeps, releasing the GIL as a GPU would):

- **cpu-bound**: the `vision` workload (real JPEG decode and resize per sample). Grid:
  num_workers 0..2×cores × prefetch_factor {1, 2, 4} × pin_memory {False, True}.
- **storage-bound**: samples that each wait on SIMULATED storage latency (a sleep of
  ``--latency-ms``, as a network file system or an object store makes a fetch wait) and use
  little CPU. Grid: num_workers 0..32 × prefetch_factor {1, 2, 4}.

Both searches time the same loop; at the end autotune's pick and the grid's best are
re-measured alternately (5 times each) so the throughput ratio is side by side.

Run: .venv/bin/python benchmarks/loader_autotune.py [--device-ms 15] [--batches 16]
     [--latency-ms 4] [--only cpu-bound|storage-bound]
Target, on each: ≥ 95 % of the grid's best throughput using ≤ 15 % of the grid's time.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from redline.data import LoaderSettings, autotune_loader
from redline.data.autotune import Trial, measure
from redline.measure.system import cpu_budget
from redline.workloads.vision import SyntheticJpegDataset, VisionConfig


class LatencyDataset(Dataset[tuple[torch.Tensor, int]]):
    """SIMULATED storage: every sample waits ``latency_s`` (no CPU), then is a small tensor."""

    def __init__(self, n: int, latency_s: float) -> None:
        self.n, self.latency_s = n, latency_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.latency_s)
        return torch.full((3, 32, 32), float(i % 7)), i % 10


def case(name: str, ds: Dataset[Any], consume: Callable[[Any], None], workers: list[int],
         prefetches: list[int], pins: list[bool], batches: int, cpus: float) -> bool:
    def make(s: LoaderSettings) -> DataLoader[Any]:
        return DataLoader(ds, batch_size=16, shuffle=True, **s.loader_kwargs())

    t0 = time.perf_counter()
    grid: list[Trial] = []
    for w in workers:
        for pf in ([None] if w == 0 else prefetches):
            for pin in pins:
                s = LoaderSettings(num_workers=w, prefetch_factor=pf, pin_memory=pin,
                                   persistent_workers=w > 0)
                grid.append(measure(make, consume, s, max(1, int(cpus) - w), batches))
    grid_s = time.perf_counter() - t0
    plan = autotune_loader(make, consume, cpus=cpus, batches_per_trial=batches)
    best = max(grid, key=lambda t: t.samples_per_s)
    a, b = [], []
    for _ in range(5):  # side by side: the two picks, alternately
        a.append(measure(make, consume, plan.settings, plan.torch_threads,
                         batches).samples_per_s)
        b.append(measure(make, consume, best.settings, best.torch_threads,
                         batches).samples_per_s)
    ratio = statistics.median(a) / statistics.median(b)
    time_share = plan.tuning_s / grid_s
    print(f"[{name}] grid: {len(grid)} settings in {grid_s:.1f} s; best "
          f"{best.settings.num_workers} workers, prefetch {best.settings.prefetch_factor}, "
          f"pin {best.settings.pin_memory}")
    print(f"[{name}] autotune: {len(plan.trials)} trials in {plan.tuning_s:.1f} s; {plan.reason}")
    print(f"[{name}] re-measured side by side: autotune {statistics.median(a):,.0f} samples/s, "
          f"grid best {statistics.median(b):,.0f} → {ratio:.1%} of the grid's best, using "
          f"{time_share:.1%} of the grid's time")
    ok = ratio >= 0.95 and time_share <= 0.15
    print(f"[{name}] target (≥ 95 % of best, ≤ 15 % of the time):", "MET" if ok else "NOT MET")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device-ms", type=float, default=15.0,
                    help="simulated accelerator time per batch of 16 (default 15 ms)")
    ap.add_argument("--batches", type=int, default=16, help="batches timed per setting")
    ap.add_argument("--latency-ms", type=float, default=4.0,
                    help="simulated storage latency per sample (default 4 ms)")
    ap.add_argument("--only", choices=["cpu-bound", "storage-bound"], default=None)
    args = ap.parse_args()
    warnings.simplefilter("ignore")  # pin_memory without an accelerator warns per loader

    def consume(batch: Any) -> None:
        time.sleep(args.device_ms / 1e3)  # SIMULATED accelerator

    cpus = cpu_budget().cpus
    print(f"SIMULATED accelerator: {args.device_ms:g} ms per batch of 16; {cpus:g} usable CPUs")
    if args.only in (None, "cpu-bound"):
        case("cpu-bound", SyntheticJpegDataset(VisionConfig(length=100_000)), consume,
             list(range(int(2 * cpus) + 1)), [1, 2, 4], [False, True], args.batches, cpus)
    if args.only in (None, "storage-bound"):
        print(f"[storage-bound] SIMULATED storage latency: {args.latency_ms:g} ms per sample")
        case("storage-bound", LatencyDataset(100_000, args.latency_ms / 1e3), consume,
             list(range(33)), [1, 2, 4], [False], args.batches, cpus)


if __name__ == "__main__":
    main()
