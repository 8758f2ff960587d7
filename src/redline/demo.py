"""``redline demo``: a built-in workload, its naive defaults, measured and diagnosed."""

from __future__ import annotations

import torch

from redline.measure.config import WatchConfig
from redline.measure.watch import Watch
from redline.report.json_io import write_json
from redline.report.model import Report
from redline.report.terminal import print_report
from redline.workloads import WORKLOADS, train

DEMO_WARMUP = 3


def run_demo(workload: str = "vision", steps: int = 30, json_path: str | None = None,
             show: bool = True) -> Report:
    """Train ``workload`` for warm-up + 1 (FLOP count) + ``steps`` steps under a watch."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose one of {sorted(WORKLOADS)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    w = WORKLOADS[workload](device)
    if show:
        print(f"redline demo: training the built-in '{workload}' workload on {device} with its "
              "naive defaults (num_workers=0, small batch, fp32)...", flush=True)
    with Watch(WatchConfig(warmup_steps=DEMO_WARMUP)) as watch:
        train(w, DEMO_WARMUP + 1 + steps)
    report = watch.report(show=False, command=["redline", "demo", "--workload", workload])
    if show:
        print_report(report)
    if json_path:
        write_json(report, json_path)
    return report
