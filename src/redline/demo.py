"""``redline demo``: a built-in workload with its naive defaults, measured and diagnosed, then
tuned along the path (``redline tune``) with a before/after table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from redline.core.report import Report
from redline.measure.config import WatchConfig
from redline.report.json_io import write_json
from redline.report.terminal import print_report
from redline.report.tune_render import render as render_tune
from redline.runs.watch import Watch
from redline.tune.config import TuneConfig
from redline.tune.result import TuneResult
from redline.tune.run import tune
from redline.tune.setup import TrainSetup
from redline.workloads import WORKLOADS, Workload, train, vision_storage_config
from redline.workloads.simulated import SimulatedAccelerator, build_vision_simulated

DEMO_WARMUP = 3
GPU_SIZED = {"vision-large": "ResNet-50 on 224-pixel crops",
             "lm-large": "a GPT-2-small-shaped transformer on 512-token sequences"}
"""Built-in workloads sized for a GPU (a note says so when they run on a CPU)."""


def _builder(workload: str, simulated: SimulatedAccelerator | None
             ) -> Callable[[torch.device], Workload]:
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose one of {sorted(WORKLOADS)}")
    if simulated is None:
        return WORKLOADS[workload]
    if workload != "vision":
        raise ValueError(f"the simulated accelerator paces the 'vision' workload only (its data "
                         f"path is the point), got {workload!r}")
    return lambda _device: build_vision_simulated(simulated)


def workload_factory(workload: str, device: torch.device,
                     simulated: SimulatedAccelerator | None = None) -> Callable[[], TrainSetup]:
    """A ``redline tune`` factory over a built-in workload's naive configuration (on the
    SIMULATED accelerator when ``simulated`` is given; then the device is the CPU)."""
    build = _builder(workload, simulated)

    def factory() -> TrainSetup:
        w = build(device)

        def loss_fn(model: torch.nn.Module, batch: Any) -> torch.Tensor:
            return w.loss_fn(model, batch, w.device)

        return TrainSetup(model=w.model, optimizer=w.optimizer, loader=w.loader,
                          loss_fn=loss_fn, device=str(w.device),
                          accumulation_steps=w.accumulation_steps, cache_split=w.cache_split,
                          jpeg_split=w.jpeg_split)

    return factory


def default_workload(simulated: bool = False) -> str:
    """The demo's workload when none is named: ``lm-large`` on a GPU, ``vision`` elsewhere.

    The CPU-sized ``vision`` cannot keep a GPU busy whatever is tuned (a data-centre GPU
    finishes its step before the host's CPUs decode the next batch), and ``vision-large`` stays
    input-bound there even with its decode moved to the device (docs/tune.md); the
    tuned ``lm-large`` keeps a GPU's kernels busy most of the step. The simulated accelerator
    paces ``vision``."""
    if not simulated and torch.cuda.is_available():
        return "lm-large"
    return "vision"


def run_demo(workload: str = "vision", steps: int = 30, json_path: str | None = None,
             show: bool = True, tune_after: bool = True,
             tune_config: TuneConfig | None = None,
             simulated: SimulatedAccelerator | None = None
             ) -> tuple[Report, TuneResult | None]:
    """Train ``workload`` for warm-up + 1 (FLOP count) + ``steps`` steps under a watch, then
    (``tune_after``) tune it and show naive → tuned. ``simulated``: run the model on the
    SIMULATED accelerator (CPU only, labelled in every output)."""
    build = _builder(workload, simulated)
    device = torch.device("cuda" if torch.cuda.is_available() and simulated is None else "cpu")
    w = build(device)
    where = simulated.label() if simulated else str(device)
    if show and workload in GPU_SIZED and device.type == "cpu":
        print(f"redline demo: note: {workload} ({GPU_SIZED[workload]}) is sized for a GPU; on "
              "a CPU each step takes seconds. 'vision' and 'lm' are the CPU-sized workloads.",
              flush=True)
    if show and workload == "vision-storage":
        print("redline demo: note: vision-storage reads its JPEGs from files after "
              f"{vision_storage_config().storage_latency_ms:g} ms of SIMULATED storage latency "
              "each (a network file system's order of magnitude; the files are local)",
              flush=True)
    if show:
        print(f"redline demo: training the built-in '{workload}' workload on {where} with its "
              f"naive defaults (num_workers=0, micro-batch {w.loader.batch_size} × "
              f"{w.accumulation_steps} accumulation, fp32)...", flush=True)
    with Watch(WatchConfig(warmup_steps=DEMO_WARMUP, device=str(device))) as watch:
        train(w, DEMO_WARMUP + 1 + steps)
    command = ["redline", "demo", "--workload", workload]
    report = watch.report(show=False, command=[*command, "--simulated-accelerator"]
                          if simulated else command)
    if show:
        print_report(report)
    if json_path:
        write_json(report, json_path)
    result = None
    if tune_after:
        cfg = tune_config or TuneConfig(try_compile=False, reuse=False)
        if show:
            print("\nredline demo: now tuning it (redline tune: data pipeline → batch size → "
                  "precision → kernels; torch.compile is skipped in the demo — compiling takes "
                  "tens of seconds; `redline tune` measures it)", flush=True)
        result = tune(workload_factory(workload, device, simulated), cfg,
                      log=(lambda s: print(s, flush=True)) if show else (lambda s: None))
        if show:
            render_tune(result, label=simulated.label() if simulated else None)
    if show and device.type == "cuda" and workload == "lm-large":
        print("redline demo: the input-pipeline side of the story on this GPU: "
              "`redline demo --workload vision-large` (ResNet-50 fed by JPEGs decoded on "
              "the CPUs).", flush=True)
    return report, result
