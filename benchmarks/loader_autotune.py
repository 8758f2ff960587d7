"""Loader autotune vs an exhaustive steady-state grid, side by side in one run, against a
SIMULATED accelerator (a consumer that sleeps, releasing the GIL as a GPU would).

Cases:

- **latency-bound** (``lat{1,3,10}ms-b{16,32,128}``): samples that each wait 1, 3 or 10 ms on
  SIMULATED storage latency (``time.sleep`` in ``__getitem__``, as a network file system or an
  object store makes a fetch wait; little CPU), batches of 16, 32 or 128, 256 batches an
  epoch, a consumer needing 10 ms per 32 samples (0.3125 ms a sample). ``issue29`` is the
  issue's case: 8,192 samples of 3 ms, batch 32, 10 ms a batch (the same as ``lat3ms-b32``).
- **cpu-bound** (``jpeg-b{16,64}``): the ``vision`` workload's real JPEG decode and resize per
  sample, a consumer needing 15 ms per 16 samples.

For each case: the autotune (``autotune_loader`` with its defaults), then the grid — workers
{0, 1, 2, 4, 8, 12, 16} × prefetch {2, 4}, every setting timed by the same steady-state
``measure`` (after its start-up and skipped queue, 3 windows each holding more batches than
are in flight) with longer windows: at least 32 batches each (or in flight + 8), cut at 1 s
once more than in flight. When the autotune picks more workers than the grid's 16, the grid is
extended by that count at prefetch 2 and 4 (said in the output; the extension's time is not
counted in the grid's). Then the autotune's pick and the grid's best are re-measured
alternately (3 times each, the grid's windows, one epoch rule for both) and the case prints:
grid best (setting, samples/s), autotune pick, its re-measured rate as % of the grid best's,
and the autotune's time as % of the grid's.

Target, on each case: ≥ 95 % of the grid's best in ≤ 15 % of the grid's time.

Run:
    .venv/bin/python benchmarks/loader_autotune.py --quick   # issue29, lat1ms-b16, jpeg-b16
    .venv/bin/python benchmarks/loader_autotune.py           # every case (long: tens of minutes)
    .venv/bin/python benchmarks/loader_autotune.py --cases issue29 lat10ms-b128
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from redline.data import LoaderSettings, autotune_loader
from redline.data.loader_timing import Trial, epoch_batches, in_flight, measure, window_batches
from redline.measure.system import cpu_budget
from redline.workloads.vision import SyntheticJpegDataset, VisionConfig

GRID_WORKERS = (0, 1, 2, 4, 8, 12, 16)
GRID_PREFETCH = (2, 4)
GRID_BATCHES = 96
"""The grid's batches per setting: 3 windows of at least 32 batches (or in flight + 8)."""
GRID_WINDOW_S = 1.0
"""A grid window may end once it lasted 1 s and holds more batches than are in flight."""
REPEATS = 3
"""Side-by-side re-measurements of each pick, alternately."""


class LatencyDataset(Dataset[tuple[torch.Tensor, int]]):
    """SIMULATED storage: every sample waits ``latency_s`` (no CPU), then is a small tensor."""

    def __init__(self, n: int, latency_s: float) -> None:
        self.n, self.latency_s = n, latency_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.latency_s)
        return torch.full((3, 32, 32), float(i % 7)), i % 10


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    """Printed name, also what ``--cases`` selects."""
    dataset: Callable[[], Dataset[Any]]
    """Builds the dataset (on first use: the JPEG one encodes its images)."""
    batch: int
    """Samples per batch."""
    consume_s: float
    """SIMULATED accelerator time per batch."""
    what: str
    """One line describing the case."""


def _latency(ms: float, batch: int, name: str | None = None) -> Case:
    n = 256 * batch
    return Case(name=name or f"lat{ms:g}ms-b{batch}",
                dataset=lambda: LatencyDataset(n, ms / 1e3), batch=batch,
                consume_s=0.010 * batch / 32,
                what=f"{n:,} samples each sleeping {ms:g} ms (SIMULATED storage), batch "
                     f"{batch}, consumer {10 * batch / 32:g} ms a batch")


def _jpeg(batch: int) -> Case:
    return Case(name=f"jpeg-b{batch}",
                dataset=lambda: SyntheticJpegDataset(VisionConfig(length=256 * batch)),
                batch=batch, consume_s=0.015 * batch / 16,
                what=f"JPEG decode + resize per sample, batch {batch}, consumer "
                     f"{15 * batch / 16:g} ms a batch")


CASES: list[Case] = [
    _latency(3, 32, "issue29"),
    *[_latency(ms, b) for ms in (1, 3, 10) for b in (16, 32, 128) if (ms, b) != (3, 32)],
    _jpeg(16), _jpeg(64),
]
QUICK = ("issue29", "lat1ms-b16", "jpeg-b16")


@dataclass(frozen=True, kw_only=True)
class Outcome:
    name: str
    grid_best: LoaderSettings
    grid_best_rate: float
    pick: LoaderSettings
    ratio: float
    """Re-measured: the autotune pick's samples/s over the grid best's (medians)."""
    time_share: float
    """The autotune's time over the grid's (the grid's own 13 settings)."""
    autotune_s: float
    grid_s: float
    extended: bool

    @property
    def met(self) -> bool:
        return self.ratio >= 0.95 and self.time_share <= 0.15


def _label(s: LoaderSettings) -> str:
    return f"{s.num_workers}×{s.prefetch_factor}" if s.num_workers else "0 (main)"


def _settings(workers: int, prefetch: int | None) -> LoaderSettings:
    return LoaderSettings(num_workers=workers, prefetch_factor=prefetch if workers else None,
                          persistent_workers=workers > 0)


def run_case(case: Case, cpus: float) -> Outcome:
    ds = case.dataset()

    def make(s: LoaderSettings) -> DataLoader[Any]:
        return DataLoader(ds, batch_size=case.batch, shuffle=True, **s.loader_kwargs())

    def consume(batch: Any) -> None:
        time.sleep(case.consume_s)  # SIMULATED accelerator

    print(f"[{case.name}] {case.what}", flush=True)
    plan = autotune_loader(make, consume, cpus=cpus)
    print(f"[{case.name}] autotune: {len(plan.trials)} trials "
          f"({', '.join(_label(t.settings) for t in plan.trials)}) in {plan.tuning_s:.1f} s "
          f"({plan.startup_s:.1f} s starting loaders); {plan.reason}", flush=True)

    def grid_trial(s: LoaderSettings) -> Trial:
        return measure(make, consume, s, max(1, int(cpus) - s.num_workers), GRID_BATCHES,
                       window_s=GRID_WINDOW_S)

    t0 = time.perf_counter()
    grid: list[Trial] = []
    for w in GRID_WORKERS:
        for pf in (GRID_PREFETCH if w else (None,)):
            grid.append(grid_trial(_settings(w, pf)))
            t = grid[-1]
            print(f"[{case.name}]   grid {_label(t.settings):>8}: {t.samples_per_s:8,.0f} "
                  f"samples/s ±{t.spread_fraction:.0%}, wait {t.data_wait_fraction:.0%}, "
                  f"{t.seconds:.1f} s", flush=True)
    grid_s = time.perf_counter() - t0
    extended = plan.settings.num_workers > max(GRID_WORKERS)
    if extended:
        for pf in GRID_PREFETCH:
            grid.append(grid_trial(_settings(plan.settings.num_workers, pf)))
            t = grid[-1]
            print(f"[{case.name}]   grid {_label(t.settings):>8} (extension: the autotune's "
                  f"workers): {t.samples_per_s:8,.0f} samples/s ±{t.spread_fraction:.0%}",
                  flush=True)
    best = max(grid, key=lambda t: t.samples_per_s)
    # one epoch rule for both re-measurements: whole epochs if either needs them
    epoch = epoch_batches(make(LoaderSettings()))
    whole = epoch is not None and any(
        epoch < in_flight(s) + 1 + window_batches(s, GRID_BATCHES)
        for s in (plan.settings, best.settings))
    a: list[float] = []
    b: list[float] = []
    for _ in range(REPEATS):  # side by side: the two picks, alternately
        for s, rates in ((plan.settings, a), (best.settings, b)):
            rates.append(measure(make, consume, s, max(1, int(cpus) - s.num_workers),
                               GRID_BATCHES, whole_epochs=whole,
                               window_s=GRID_WINDOW_S).samples_per_s)
    ratio = statistics.median(a) / statistics.median(b)
    out = Outcome(name=case.name, grid_best=best.settings, grid_best_rate=best.samples_per_s,
                  pick=plan.settings, ratio=ratio, time_share=plan.tuning_s / grid_s,
                  autotune_s=plan.tuning_s, grid_s=grid_s, extended=extended)
    print(f"[{case.name}] grid best {_label(best.settings)} {best.samples_per_s:,.0f} "
          f"samples/s ({len(grid)} settings, {grid_s:.1f} s"
          + (", extended by the autotune's workers" if extended else "") + "); "
          f"re-measured side by side: autotune {statistics.median(a):,.0f}, grid best "
          f"{statistics.median(b):,.0f} → {ratio:.1%}, autotune time {out.time_share:.1%} → "
          + ("MET" if out.met else "NOT MET"), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--cases", nargs="+", choices=[c.name for c in CASES], default=None)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    names = args.cases or (list(QUICK) if args.quick else [c.name for c in CASES])
    cpus = cpu_budget().cpus
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpus:g} usable CPUs; "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; torch {torch.__version__}",
          flush=True)
    outcomes = [run_case(c, cpus) for c in CASES if c.name in names]
    print("\n| case | grid best | samples/s | autotune pick | re-measured | autotune time |"
          " target |")
    print("|---|---|---|---|---|---|---|")
    for o in outcomes:
        print(f"| {o.name} | {_label(o.grid_best)} | {o.grid_best_rate:,.0f} | "
              f"{_label(o.pick)}{' (grid extended)' if o.extended else ''} | {o.ratio:.1%} | "
              f"{o.time_share:.1%} ({o.autotune_s:.1f} of {o.grid_s:.1f} s) | "
              f"{'MET' if o.met else 'NOT MET'} |")
    print(f"load at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
