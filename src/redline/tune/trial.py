"""One tuning trial: a fresh setup from the factory, a plan applied, steps measured by a watch.

Every trial builds its model, optimizer and loader anew (the factory is seeded by the user), so
no trial inherits memory, weights or optimizer state from another. Metrics come from the same
measurements ``redline doctor`` reports (:mod:`redline.measure.summary`), so before/after
numbers are defined once.
"""

from __future__ import annotations

import itertools
import math
import shutil
import tempfile
import time
import warnings
from typing import TYPE_CHECKING, Any

import torch

from redline.data.autotune import epoch_batches
from redline.data.prefetcher import map_tensors
from redline.measure.agree import Agreement
from redline.measure.config import WatchConfig
from redline.measure.rapl import RaplMeter
from redline.measure.recorder import Recorder
from redline.measure.stats import step_times
from redline.measure.summary import build_measurements, recorded_trace
from redline.tune.memory_budget import MemoryBudget
from redline.tune.result import TrialMetrics
from redline.tune.runtime import TunedLoop
from redline.tune.samples import endless, first_batches, fresh, state_tensors
from redline.tune.setup import Factory

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


def counted_peak(factory: Factory, plan: TunePlan) -> int:
    """Peak live bytes of one steady-state step, counted by the simulated budget (no limit)."""
    setup = fresh(factory)
    loop = TunedLoop(plan, setup.model, setup.optimizer, setup.loader, setup.loss_fn,
                     device=torch.device(setup.device), cache_split=setup.cache_split,
                     jpeg_split=setup.jpeg_split)
    try:
        batches = endless(loop.loader)
        loop.step(next(batches))  # builds lazy optimizer state
        batch = next(batches)
        with MemoryBudget(None, existing=state_tensors(loop.model, loop.optimizer)) as budget:
            loop.step(batch)
        return int(budget.peak)
    finally:
        loop.close()


STEP_ONLY_BATCHES = 4
"""Distinct batches cycled through by a step-only trial (host memory: 4 effective batches)."""

TRACE_STEPS = 5
"""Steps recorded by a trial's device trace (after 1 skipped and 1 warm-up profiler step)."""

WHOLE_EPOCH_MAX_STEPS = 64
"""End-to-end trials with loader workers time whole epochs when an epoch has at most 64
effective batches (see ``measured_window``)."""


def measured_window(plan: TunePlan, epoch: int | None, steps: int) -> tuple[int, bool]:
    """(measured steps, restart the epoch before them) of an end-to-end trial.

    With workers, batches arrive in bursts (every worker finishes one at about the same time)
    and the queues (workers × prefetch_factor batches) fill while the first, slow steps run:
    a few steps timed after them are served from the queue at the step's own speed, a rate
    the workers cannot sustain. So the window starts at a fresh epoch (empty
    queues; warm workers and model) and spans whole epochs where they are short — each with
    its one refill, as training pays it — else at least three queue-lengths of steps. Without
    workers nothing queues."""
    settings = plan.loader
    queued = settings.num_workers * (settings.prefetch_factor or 2) if settings.num_workers else 0
    if queued == 0:
        return steps, False
    if epoch is not None and epoch <= WHOLE_EPOCH_MAX_STEPS:
        return math.ceil(max(steps, queued + 1) / epoch) * epoch, True
    return max(steps, 3 * queued), True


def measure(factory: Factory, plan: TunePlan, label: str, *, steps: int, warmup: int,
            count_flops: bool = False, memory: bool = False, step_only: bool = False,
            trace: bool = False, agree: Agreement | None = None) -> TrialMetrics:
    """See :func:`_measure`; torch's advice against more workers than cores is silenced here:
    the loader autotune may choose them where fetches wait, settled by measurement."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        return _measure(factory, plan, label, steps=steps, warmup=warmup,
                        count_flops=count_flops, memory=memory, step_only=step_only,
                        trace=trace, agree=agree)


def _measure(factory: Factory, plan: TunePlan, label: str, *, steps: int, warmup: int,
             count_flops: bool, memory: bool, step_only: bool, trace: bool,
             agree: Agreement | None) -> TrialMetrics:
    """Train ``warmup`` (+1 FLOP-counting) + ``steps`` optimizer steps with ``plan`` applied to a
    fresh setup, under a watch (end to end with loader workers, the measured window may be
    longer and starts at a fresh epoch: :func:`measured_window`). ``step_only``: the batches
    are fetched from the plan's loader before the watch starts and cycled, so the trial times
    the training step alone. ``trace``: also record ``TRACE_STEPS`` steps with torch.profiler
    (device activity only on CUDA; those steps are excluded from the statistics) for the
    kernel-union device busy. ``agree``: the job's ranks (each runs this trial on its own
    shard; they agree on how many steps to run, see :func:`_train_watched`)."""
    setup = fresh(factory)
    device = torch.device(setup.device)
    loop = TunedLoop(plan, setup.model, setup.optimizer, setup.loader, setup.loss_fn,
                     device=device, cache_split=setup.cache_split,
                     jpeg_split=setup.jpeg_split)
    source: Any = loop.loader
    if step_only:
        # From a worker-less copy of the loader: no worker processes competing for the CPUs.
        # Kept on the host (pinned for CUDA) and copied per step: 4 effective batches resident
        # on the device could exceed the memory the batch finder planned for.
        pin = device.type == "cuda"
        host = [map_tensors(batch, lambda tensor: tensor.pin_memory() if pin else tensor)
                for batch in first_batches(setup.loader, plan.effective_batch, STEP_ONLY_BATCHES)]
        source = (map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=True))
                  for batch in itertools.cycle(host))
    measured, restart = (steps, False) if step_only else measured_window(
        plan, epoch_batches(loop.dataloader), steps)
    if restart:
        # The new epoch is begun inside the last excluded step. With one warm-up step the
        # window begins where that step ended (learnt at the second optimizer step), and the
        # FLOP step comes one measured step later: two keep the excluded steps contiguous.
        warmup = max(2, warmup)
    rapl = RaplMeter()
    start_s = time.perf_counter()
    trace_dir = tempfile.mkdtemp(prefix="redline-tune-trace-") if trace else None
    cfg = WatchConfig(warmup_steps=warmup, count_flops=count_flops, device=str(device),
                      sample_interval_s=0.1, trace_dir=trace_dir, trace_steps=TRACE_STEPS,
                      trace_host_ops=False)
    total = warmup + int(count_flops) + (TRACE_STEPS + 2 if trace else 0) + measured
    try:
        try:
            recorder, joules, rapl_steps, rapl_s = _train_watched(
                loop, source, cfg=cfg, total=total, steps=measured, step_only=step_only,
                rapl=rapl, restart=restart, agree=agree or Agreement())
        finally:
            loop.close()
        measurements = build_measurements(recorder)
        traced, _ = recorded_trace(recorder)  # reads the trace, if one was recorded
    finally:
        if trace_dir is not None:
            shutil.rmtree(trace_dir, ignore_errors=True)
    timing = measurements.timing
    energy, esrc = None, ""
    nvml = measurements.device_metrics.nvml
    if nvml is not None and nvml.energy_j is not None and timing.steps_measured:
        energy = nvml.energy_j / timing.steps_measured
        esrc = "NVML total-energy counter over the measured steps"
    elif device.type == "cpu" and joules is not None:
        energy = joules / rapl_steps
        esrc = f"RAPL CPU packages over {rapl_steps} steps ({rapl_s:.1f} s)"
    else:
        esrc = ("unknown: " + (rapl.reason or "no energy counter") if device.type == "cpu"
                else "unknown: NVML energy counter not available")
    peak, psrc = measurements.device_metrics.peak_allocated_bytes, "CUDA max_memory_allocated"
    if peak is None:
        if memory:
            peak, psrc = counted_peak(factory, plan), "counted live tensor bytes of one step"
        else:
            psrc = "not measured for this trial"
    busy = measurements.device_metrics.device_span_fraction
    kbusy, ksrc = None, "not traced for this trial"
    if traced is not None:
        if traced.idle_pct is not None:
            kbusy = 1.0 - traced.idle_pct / 100.0
            ksrc = (f"union of kernel intervals over {TRACE_STEPS} traced steps "
                    f"({traced.device_events} device events)")
        else:
            ksrc = f"unknown: {traced.note}"
    return TrialMetrics(label=label, throughput_samples_per_s=timing.throughput_samples_per_s,
                        step_time_s=timing.step_time_p50_s,
                        data_wait_fraction=(measurements.fraction("data_wait")
                                            if timing.steps_measured else None),
                        device_busy_fraction=busy,
                        mfu=measurements.mfu.mfu, peak_memory_bytes=peak, peak_memory_source=psrc,
                        energy_j_per_step=energy, energy_source=esrc, steps=timing.steps_measured,
                        wall_s=time.perf_counter() - start_s,
                        step_times_s=step_times(recorder.measured_steps),
                        device_busy_kernels_fraction=kbusy, device_busy_kernels_source=ksrc)


def _train_watched(loop: TunedLoop, source: Any, *, cfg: WatchConfig, total: int, steps: int,
                   step_only: bool, rapl: RaplMeter, restart: bool,
                   agree: Agreement) -> tuple[Recorder, float | None, int, float]:
    """Run ``total`` steps under a watch, the last ``steps`` measured: (the watch, RAPL joules
    of the measured steps or None, how many steps those joules cover, over how many seconds).
    ``restart``: begin a new epoch of the loader inside the last excluded step, so the measured
    steps start at an epoch boundary with empty queues."""
    with Recorder(cfg) as recorder:
        # A list is not a DataLoader: wrap() times and counts its batches the same way.
        batches = recorder.wrap(source) if step_only else endless(source)
        rapl_on = False
        t_rapl = time.perf_counter()
        for i in range(total):
            if i == total - steps:
                rapl_on = rapl.start()
                t_rapl = time.perf_counter()
            batch = next(batches)
            if restart and i == total - steps - 1:
                # iter() is eager: a persistent loader drains its in-flight batches and resets
                # here, in an excluded step; later epochs come from the loader as usual.
                batches = itertools.chain(loop.on_device(iter(loop.dataloader)), endless(loop.loader))
            loop.step(batch)
        # Where no DataLoader marks the first step, the watch learns the step from the
        # second optimizer step and counts the first as warm-up: top up to ``steps`` (as
        # many steps on every rank: each one's collectives need all of them).
        extra = int(agree.max(min(2, max(0, steps - len(recorder.measured_steps))), "trial top-up"))
        for _ in range(extra):
            loop.step(next(batches))
        rapl_steps = steps + extra

        joules = rapl.joules() if rapl_on else None
        rapl_s = time.perf_counter() - t_rapl
        del batches
    return recorder, joules, rapl_steps, rapl_s
