"""Overhead of always-on `redline.watch` vs torch.profiler (CPU activities), per step.

Method: one tiny CPU training loop with a DataLoader (a few hundred µs per step, so a cost of
a microsecond per step is resolvable). Rounds interleave three modes — bare, under
`redline.watch`, under `torch.profiler.profile(activities=[CPU])` — so drift and neighbours'
noise hit all three alike. Per round and mode: median step time (host clock, per iteration).
Reported: the median over rounds of the *paired* differences (mode − bare, same round), in µs,
its share of a 10 ms step, and watch's cost as a fraction of the profiler's; and the same for
the training thread's CPU time per step, which the VM's stalls barely touch.

Run: .venv/bin/python benchmarks/overhead.py [--rounds 101] [--steps 100]
Target: watch adds ≤ 50 µs per step (≤ 0.5 % of a 10 ms step).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import redline


def make_loop() -> Callable[[int], tuple[list[float], list[float]]]:
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(4096, 32), torch.randint(0, 4, (4096,)))
    loader = DataLoader(ds, batch_size=8, shuffle=True)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def run(steps: int) -> tuple[list[float], list[float]]:
        times: list[float] = []
        cpu: list[float] = []
        it = iter(loader)
        t = time.perf_counter()
        c = time.thread_time()
        for _ in range(steps):
            try:
                x, y = next(it)
            except StopIteration:
                it = iter(loader)
                x, y = next(it)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            now = time.perf_counter()
            times.append(now - t)
            t = now
            cnow = time.thread_time()
            cpu.append(cnow - c)
            c = cnow
        return times, cpu

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=101)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(1)
    run = make_loop()
    modes: dict[str, Callable[[], AbstractContextManager[object]]] = {
        "bare": nullcontext,
        "watch": lambda: redline.watch(warmup_steps=0, count_flops=False),
        "profiler": lambda: torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]),
    }
    run(200)  # warm caches and the allocator
    med: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        order = list(modes) if r % 2 == 0 else list(reversed(modes))
        for m in order:
            with modes[m]():
                ts, cs = run(args.steps)
            med[m].append(statistics.median(ts[10:]))
            cpu[m].append(statistics.median(cs[10:]))
    bare = statistics.median(med["bare"])
    dw = [w - b for w, b in zip(med["watch"], med["bare"], strict=True)]
    dp = [p - b for p, b in zip(med["profiler"], med["bare"], strict=True)]
    d_watch, d_prof = statistics.median(dw), statistics.median(dp)
    qw = statistics.quantiles(dw, n=4)
    print(f"torch {torch.__version__}, {args.rounds} interleaved rounds × {args.steps} steps, "
          f"1 intra-op thread")
    print(f"{'mode':<10} {'median step':>12} {'added/step':>12} {'of a 10 ms step':>16}")
    print(f"{'bare':<10} {bare * 1e6:>10.1f}µs {'':>12} {'':>16}")
    for name, d in (("watch", d_watch), ("profiler", d_prof)):
        print(f"{name:<10} {(bare + d) * 1e6:>10.1f}µs {d * 1e6:>10.1f}µs {d / 0.01:>15.3%}")
    print(f"watch paired differences: interquartile range {qw[0] * 1e6:.1f}–{qw[2] * 1e6:.1f} µs "
          f"over {len(dw)} rounds (spread = machine noise)")
    # CPU time of the training thread: the work watch adds, insensitive to the VM's stalls.
    cw = statistics.median(w - b for w, b in zip(cpu["watch"], cpu["bare"], strict=True))
    cp = statistics.median(p - b for p, b in zip(cpu["profiler"], cpu["bare"], strict=True))
    print(f"training-thread CPU per step: watch +{cw * 1e6:.1f} µs, profiler +{cp * 1e6:.1f} µs "
          f"(bare {statistics.median(cpu['bare']) * 1e6:.1f} µs)")
    ratio = d_watch / d_prof if d_prof > 0 else float("nan")
    print(f"watch costs {ratio:.1%} of torch.profiler's per-step overhead")
    verdict = "MET" if d_watch <= 50e-6 else "NOT MET"
    print(f"target watch ≤ 50 µs/step: {verdict} ({d_watch * 1e6:.1f} µs)")


if __name__ == "__main__":
    main()
