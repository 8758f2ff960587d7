"""Turn what a recorder saw into :class:`~redline.core.measurements.Measurements` (no diagnosis:
the rules run on the result in :mod:`redline.diagnose`)."""

from __future__ import annotations

import platform
import warnings
from collections import Counter
from typing import TYPE_CHECKING

import torch

from redline.core.measurements import (
    MAX_STEP_TIMES,
    CompetingProcess,
    DeviceInfo,
    DeviceMetrics,
    EffectiveConfig,
    H2DMetrics,
    HostMetrics,
    LoaderReport,
    Measurements,
    MetricTier,
    PhaseShare,
    PrecisionInfo,
    StartupCost,
    StepDrift,
    StepTiming,
)
from redline.core.report import TraceSummary
from redline.core.words import ordinal
from redline.measure.cpu_gemm import REPEATS as GEMM_REPEATS
from redline.measure.cpu_gemm import SHAPE as GEMM_SHAPE
from redline.measure.cpu_gemm import measure_gemm_rates
from redline.measure.ddp import ddp_stats, fsdp_stats, snapshot
from redline.measure.drift import (
    STARTUP_EXCESS,
    STARTUP_MATERIAL_SHARE,
    startup_cost,
    step_modes,
    step_trend,
)
from redline.measure.evaluation import evaluation_metrics
from redline.measure.loop_work import loop_work
from redline.measure.memory import memory_timeline
from redline.measure.mfu import mfu_for
from redline.measure.stacks import SLOW_BELOW_SHARE
from redline.measure.stats import percentile, span_fraction, step_times
from redline.measure.step_record import PHASES, StepRecord
from redline.measure.system import cpu_budget, cpu_flags, shm_info
from redline.trace import TraceAnalysis, TraceError, analyze_paths

if TYPE_CHECKING:
    from redline.measure.recorder import Recorder


def device_info(dev: torch.device) -> DeviceInfo:
    """What the report says of the device a watch measured on."""
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        return DeviceInfo(type="cuda", name=props.name, count=torch.cuda.device_count(),
                          compute_capability=f"{props.major}.{props.minor}",
                          total_memory_bytes=int(props.total_memory))
    return DeviceInfo(type=dev.type, name=platform.processor() or platform.machine(), count=1)


def _timing(w: Recorder, steps: list[StepRecord]) -> StepTiming:
    total_steps, warmup, excluded, measured = w.step_counts
    times = step_times(steps)
    samples = [step.samples for step in steps if step.samples is not None]
    total = sum(times)
    return StepTiming(
        step_source=w.tracker.source,
        steps_total=total_steps,
        steps_warmup=warmup,
        steps_excluded=excluded,
        steps_measured=measured,
        step_time_p50_s=percentile(times, 50) if times else None,
        step_time_p95_s=percentile(times, 95) if times else None,
        step_time_mean_s=total / len(times) if times else None,
        samples_per_step=sum(samples) / len(samples) if samples else None,
        throughput_samples_per_s=(sum(samples) / total
                                  if samples and len(samples) == len(steps) and total > 0
                                  else None),
        steps_per_s=len(times) / total if total > 0 else None,
        step_times_s=[round(step_s, 9) for step_s in times[-MAX_STEP_TIMES:]] if times else None,
    )


def _breakdown(steps: list[StepRecord]) -> list[PhaseShare]:
    n_steps = len(steps)
    total = sum(step.step_s for step in steps)
    out = []
    for phase in (*PHASES, "other"):
        per = ([step.other_s for step in steps] if phase == "other"
               else [step.phases[PHASES.index(phase)] for step in steps])
        phase_total_s = sum(per)
        trimmed = None
        k = max(range(n_steps), key=per.__getitem__) if n_steps else None
        if k is not None and n_steps >= 3:
            rest = total - steps[k].step_s
            trimmed = (phase_total_s - per[k]) / rest if rest > 0 else None
        out.append(PhaseShare(phase=phase, mean_s=phase_total_s / n_steps if n_steps else 0.0,
                              fraction=phase_total_s / total if total > 0 else 0.0,
                              fraction_without_slowest=trimmed,
                              slowest_step=None if k is None else steps[k].index,
                              slowest_step_s=None if k is None else per[k]))
    return out


def precision_info(w: Recorder, dev: DeviceInfo) -> PrecisionInfo:
    """The precision the watched steps ran in, from the parameter and autocast dtypes seen."""
    inst = w.inst
    assert inst is not None
    seen = inst.precision
    params: Counter[str] = seen.param_dtypes or Counter()
    autocast: Counter[str] = seen.autocast or Counter()
    param_dtype = params.most_common(1)[0][0] if params else None
    ac_dtype = autocast.most_common(1)[0][0] if autocast else None
    forwards = w.tracker.counts["forward"]
    ac_frac = sum(autocast.values()) / forwards if forwards else None
    matmul_precision = torch.get_float32_matmul_precision()
    tf32 = bool(torch.backends.cuda.matmul.allow_tf32) or matmul_precision != "highest"
    eff: str | None
    if ac_frac is not None and ac_frac >= 0.5 and ac_dtype is not None:
        eff = f"{ac_dtype}-autocast"
    elif param_dtype in ("bf16", "fp16"):
        eff = param_dtype
    elif param_dtype == "fp32" or (param_dtype is None and forwards):
        compute_capability = float(dev.compute_capability) if dev.compute_capability else 0.0
        eff = "tf32" if dev.type == "cuda" and compute_capability >= 8.0 and tf32 else "fp32"
    else:
        eff = None
    return PrecisionInfo(effective=eff, param_dtype=param_dtype, autocast_dtype=ac_dtype,
                         autocast_forward_fraction=ac_frac, float32_matmul_precision=matmul_precision,
                         tf32_matmul_allowed=tf32)


def build_measurements(w: Recorder) -> Measurements:
    """Everything ``w`` recorded, as :class:`~redline.core.measurements.Measurements`.

    Args:
        w: a recorder (a watch or a doctor run) whose block has been left.

    Returns:
        The run's :class:`~redline.core.measurements.Measurements`, with notes saying which
        steps the statistics cover (warm-up or start-up steps included or left out, sampling).
    """
    notes: list[str] = []
    steps = w.measured_steps
    if not steps:
        steps = [step for step in w.steps if step.kind != "excluded"]
        total, _, excluded, _ = w.step_counts
        ran = (f"Only {total} step(s) ran" + (f" ({excluded} of them slowed on purpose for FLOP "
               "counting or a trace, left out)" if excluded else "")
               + f", none after the {w.config.warmup_steps} warm-up step(s)")
        if len(steps) > 1 and steps[0].index == 0:
            # The first step runs from the watch's start: under doctor, the script's imports
            # and model build; it would read as minutes of host work in the loop.
            steps = steps[1:]
            notes.append(f"{ran}: statistics below are over the warm-up steps after the first "
                         "(which also holds the script's start-up) and are less reliable.")
        elif steps:
            notes.append(f"{ran}: statistics below are over warm-up steps and are less "
                         "reliable" + (", the first of them holding the script's start-up."
                                       if steps[0].index == 0 else "."))
        elif excluded:
            notes.append(
                f"Step time unknown: the only {excluded} step(s) that ran were slowed "
                "on purpose (FLOP counting or a trace) and are left out of the statistics; run "
                "more steps, or without FLOP counting (count_flops=False, redline doctor --no-flops), "
                "to time them."
            )
    stride = w.tracker.stride
    if stride > 1:
        notes.append(
            f"The run closed {w.tracker.closed:,} steps, more than the {w.config.steps_kept:,} "
            f"step records a watch keeps (WatchConfig.steps_kept): step statistics, the "
            f"breakdown and the timeline are over every {ordinal(stride)} step, a uniform sample; "
            "step counts are exact."
        )
    startup = None
    # how often the loop evaluates is the loop's, counted over every measured step: start-up
    # steps left out of the timing statistics still hold their evaluations
    evaluated = steps
    if w.measured_steps:
        startup = startup_cost([step for step in w.steps if step.kind != "excluded"], stride,
                               w.cpu.loop_delay_between)
        steady = ([step for step in steps if step.index >= startup_end(w, startup)]
                  if startup is not None and startup.steps_after_warmup else steps)
        if startup is not None and 3 <= len(steady) < len(steps):
            if startup.left_out:
                notes.append(
                    f"The first {len(steps) - len(steady)} measured step(s) were still "
                    f"start-up (step time above {1 + STARTUP_EXCESS:g}× the steady "
                    f"{startup.steady_step_s * 1e3:.2f} ms; drift.startup): they are left out "
                    "of the step statistics and the breakdown.")
                steps = steady
            else:
                why = {
                    "delay_unknown": "the training thread's run delay over them could not be "
                                     "read, so a loaded host cannot be ruled out",
                    "loaded_host": "the training thread waited for a CPU through much of them "
                                   "(drift.startup.run_delay_after_warmup_s): a loaded host, "
                                   "not start-up",
                    "immaterial": f"their {startup.extra_after_warmup_s * 1e3:.2f} ms above "
                                  f"it is under {STARTUP_MATERIAL_SHARE:.0%} of the measured "
                                  "steps' time",
                }[startup.kept_because or "immaterial"]
                notes.append(
                    f"The first {len(steps) - len(steady)} measured step(s) were slower than "
                    f"the steady {startup.steady_step_s * 1e3:.2f} ms, but {why}; they stay in "
                    "the step statistics.")
    drift = StepDrift(startup=startup, trend=step_trend(steps, w.cpu.loop_delay_between),
                      modes=step_modes(steps, w.cpu.loop_delay_between))
    dev = device_info(w.device)
    inst = w.inst
    assert inst is not None
    timing = _timing(w, steps)
    breakdown = _breakdown(steps)
    budget = cpu_budget()
    shm = shm_info()
    win = w.cpu_window
    flags = sorted(cpu_flags() & {"amx_bf16", "avx512_bf16"})
    threads = w.torch_threads or torch.get_num_threads()  # the loop's, if it began a window
    data_cpu = sum(step.data_cpu_s for step in steps)
    data_delay = sum(step.data_run_delay_s for step in steps)
    data_read = sum(step.data_read_s for step in steps)  # the fetches whose CPU and delay were read
    delay_known = inst.data.run_delay_known
    wall = win.wall_s if win and win.wall_s > 0 else None
    others = None
    if win is not None and wall and win.usable_cpus_busy_s is not None:
        others = max(0.0, (win.usable_cpus_busy_s - win.main_cpu_s - win.children_cpu_s) / wall)
    host = HostMetrics(
        cpus_available=budget.cpus,
        cpus_source=budget.source,
        torch_threads=threads,
        main_cpu_cores=win.main_cpu_s / win.wall_s if win and win.wall_s > 0 else None,
        main_thread_cpu_cores=(win.main_thread_cpu_s / wall
                               if win and wall and win.main_thread_cpu_s is not None else None),
        workers_cpu_cores=win.children_cpu_s / win.wall_s if win and win.wall_s > 0 else None,
        # the loaders' own workers: multiprocessing's resource tracker (spawn) and the
        # script's other child processes are children too, not workers
        workers_seen=len(win.children_pids & {pid for info in inst.loaders
                                               for pid in info.worker_pids}) if win else 0,
        main_rss_peak_bytes=win.main_rss_peak_bytes if win else None,
        workers_rss_peak_bytes=win.children_rss_peak_bytes if win else None,
        read_bytes_per_s=(win.read_bytes / win.wall_s
                          if win and win.io_available and win.wall_s > 0 else None),
        read_chars_per_s=(win.read_chars / win.wall_s
                          if win and win.io_available and win.wall_s > 0 else None),
        # one thread's CPU time cannot pass its wall time: a ratio above 1 is the two clocks'
        # granularity on short fetches
        data_fetch_cpu_fraction=min(1.0, data_cpu / data_read) if data_read > 1e-6 else None,
        shm_total_bytes=shm.total_bytes if shm else None,
        shm_free_bytes=shm.free_bytes if shm else None,
        cpu_flags=flags,
        data_fetch_run_delay_fraction=(data_delay / data_read if delay_known
                                       and data_read > 1e-6 else None),
        main_thread_run_delay_fraction=(win.main_thread_run_delay_s / wall
                                        if win and wall and win.main_thread_run_delay_s
                                        is not None else None),
        workers_run_delay_cores=(win.children_run_delay_s / wall
                                 if win and wall and win.children_run_delay_s is not None
                                 else None),
        other_processes_cpu_cores=others,
        competing_processes=_competing(w),
        workers_read_bytes_per_s=(win.children_read_bytes / wall
                                  if win and wall and win.io_available else None),
        workers_read_chars_per_s=(win.children_read_chars / wall
                                  if win and wall and win.io_available else None),
    )
    loaders = [
        LoaderReport(
            batch_size=loader_info.batch_size, settings=loader_info.settings,
            dataset_type=loader_info.dataset_type,
            multiprocessing_context=loader_info.multiprocessing_context,
            iterators=loader_info.iterators, worker_starts=loader_info.worker_starts,
            worker_startup_mean_s=(sum(loader_info.startup_s) / len(loader_info.startup_s)
                                   if loader_info.startup_s else None),
            worker_startup_total_s=sum(loader_info.startup_s), batch_bytes=loader_info.batch_bytes,
            python_containers=[
                {"path": container.path, "type": container.type, "items": container.items,
                 "est_bytes": container.est_bytes}
                for container in loader_info.containers
            ],
            cache=_cache_stats(loader_info.cache),
        )
        for loader_info in inst.loaders
    ]
    device_metrics = _device_metrics(w, steps, dev)
    precision = precision_info(w, dev)
    mfu = mfu_for(dev, precision.effective, w.flops.flops, w.flops.conv_flops,
                  timing.step_time_mean_s, counted=w.config.count_flops,
                  flop_error=w.flops.error, cudnn_tf32=bool(torch.backends.cudnn.allow_tf32))
    if (dev.type == "cpu" and "amx_bf16" in flags and precision.effective in ("fp32", "tf32")
            and w.flops.flops):
        # What no_mixed_precision needs to tell a step of large matrix products from one of
        # small layers (measure/cpu_gemm.py); probed once per watch, after its loop.
        why_not = _probe_gemm_rates(w, threads)
        if why_not is not None:
            notes.append(f"This CPU's matrix-product rates could not be measured: {why_not}; "
                         "no_mixed_precision cannot weigh the step's products.")
        if w.gemm_rates is not None:
            host.gemm_fp32_flops_per_s = w.gemm_rates.fp32_flops_per_s
            host.gemm_bf16_flops_per_s = w.gemm_rates.bf16_flops_per_s
    # The loader the report describes: one a framework named, else the first whose batches
    # fed training (a validation loader iterated first, as Lightning's sanity check does, is
    # not it), else the first iterated.
    pairs = list(zip(loaders, inst.loaders, strict=True))
    main_loader = (next((report for report, info in pairs if info.training), None)
                   or next((report for report, info in pairs
                            if info.iterators > info.evaluation_iterators), None)
                   or next((report for report in loaders if report.iterators),
                           loaders[0] if loaders else None))
    config = EffectiveConfig(
        device=str(w.device),
        batch_size=(main_loader.batch_size if main_loader and main_loader.batch_size
                    else (round(timing.samples_per_step) if timing.samples_per_step else None)),
        loader=main_loader.settings if main_loader else None,
        precision=precision.effective,
        torch_threads=threads,
        data_source=("DataLoader" if main_loader else
                     "wrapped iterable" if inst.wrapped_iterables else "not seen"),
    )
    if inst.other_thread_steps:
        notes.append(
            f"{inst.other_thread_steps} training step(s) ran on another thread "
            f"({', '.join(sorted(inst.other_threads))}) than the one that entered the watch "
            f"({w.thread_name}); redline measures only that one. Enter `redline.watch()` inside "
            "the training thread (for `redline doctor`, run the training loop in the main "
            "thread).")
    if config.data_source == "not seen":
        notes.append("No DataLoader or wrapped iterable was seen: data wait is not measured "
                     "(wrap your batch source with `w.wrap(iterable)` to time it).")
    # read at close (Recorder.close); a watch still open reads its models now
    parallel = w.parallel if w.parallel is not None else snapshot(inst.roots)
    return Measurements(
        device=dev, config=config, timing=timing, breakdown=breakdown, host=host,
        device_metrics=device_metrics, loaders=loaders, precision=precision, mfu=mfu,
        tier=_tier(w), counts=dict(w.tracker.counts),
        root_modules=max(inst.root_modules, w.root_names, key=len),  # roots freed since: seen
        sources=_sources(w), notes=notes,
        ddp=ddp_stats(parallel, w.arrivals, timing.steps_measured, dict(w.tracker.counts)),
        fsdp=fsdp_stats(parallel, w.arrivals, timing.steps_measured, dict(w.tracker.counts)),
        evaluation=evaluation_metrics(evaluated),
        loop=loop_work(w, steps),
        memory=memory_timeline(w.memory, t_enter=w.t_enter, window_start=w.window_start,
                               pid=w.cpu.pid, interval_s=w.config.sample_interval_s,
                               device_total_bytes=dev.total_memory_bytes),
        drift=drift if startup is not None or drift.trend is not None else None,
    )


def startup_end(w: Recorder, startup: StartupCost) -> int:
    """Index of the first steady step (the first step after the start-up)."""
    kept = [step for step in w.steps if step.kind != "excluded"]
    return kept[startup.steps].index if startup.steps < len(kept) else w.tracker.closed


def _probe_gemm_rates(w: Recorder, threads: int) -> str | None:
    """Probe this CPU's matrix-product rates into ``w.gemm_rates`` unless a report built
    before did; why they could not be measured, if so."""
    if w.rank.local_world_size > 1:
        # the host's ranks would probe at once (each report is built as the job ends), and
        # each would measure the others' products too: up to 5x lower rates
        return (f"{w.rank.local_world_size} ranks share this host and would time their probes "
                "against each other")
    if w.gemm_rates is None:
        try:
            w.gemm_rates = measure_gemm_rates(threads=threads)
        except RuntimeError as e:  # a torch build without a CPU bf16 product: unknown
            return f"{type(e).__name__}: {e}"
    return None


def _competing(w: Recorder) -> list[CompetingProcess] | None:
    """The window's other processes on the job's CPUs, its DataLoader workers left out."""
    win, inst = w.cpu_window, w.inst
    if win is None or win.processes is None or inst is None:
        return None
    workers = {pid for loader_info in inst.loaders for pid in loader_info.worker_pids}
    wall = win.wall_s if win.wall_s > 0 else None
    return [CompetingProcess(pid=proc.pid, command=proc.command, cpu_s=proc.cpu_s,
                             cpu_cores=proc.cpu_s / wall if wall else 0.0, child=proc.child,
                             same_job=proc.same_job)
            for proc in win.processes if proc.pid not in workers]


def _cache_stats(cache: object) -> dict[str, int | float | None] | None:
    if cache is None:
        return None
    stats = cache.stats()  # type: ignore[attr-defined]
    return {"hits": stats.hits, "misses": stats.misses, "bytes_read": stats.bytes_read,
            "bytes_written": stats.bytes_written, "uncached": stats.uncached, "hit_rate": stats.hit_rate}


def _device_metrics(w: Recorder, steps: list[StepRecord], dev: DeviceInfo) -> DeviceMetrics:
    n_steps = len(steps)
    inst = w.inst
    assert inst is not None
    h2d_seen = inst.h2d
    h2d = None
    if dev.type != "cpu" and n_steps:
        h2d = H2DMetrics(
            copies_per_step=h2d_seen.copies / max(1, w.tracker.closed),
            bytes_per_step=h2d_seen.bytes / max(1, w.tracker.closed),
            pageable_fraction=h2d_seen.pageable_bytes / h2d_seen.bytes if h2d_seen.bytes else None,
            host_s_per_step=h2d_seen.host_s / max(1, w.tracker.closed),
        )
    if dev.type != "cuda":
        return DeviceMetrics(device_span_fraction=None, device_s_per_step=None, peak_allocated_bytes=None,
                             peak_reserved_bytes=None, total_memory_bytes=None, nvml=None, sync_calls=None,
                             sync_calls_per_step=None, h2d=h2d)
    with_dev = [step for step in steps if step.device_s is not None]
    span = span_fraction(with_dev)
    mem = w.cuda_memory
    syncs = w.syncs
    return DeviceMetrics(
        device_span_fraction=span,
        device_s_per_step=(sum(step.device_s or 0.0 for step in with_dev) / len(with_dev)
                           if with_dev else None),
        peak_allocated_bytes=mem.peak_allocated_bytes if mem else None,
        peak_reserved_bytes=mem.peak_reserved_bytes if mem else None,
        total_memory_bytes=mem.total_bytes if mem else None,
        nvml=w.nvml_summary,
        sync_calls=syncs.count if syncs else None,
        sync_calls_per_step=syncs.count / max(1, w.tracker.closed) if syncs else None,
        sync_sites=[{"site": site, "count": count} for site, count in syncs.sites.most_common(5)]
        if syncs else [],
        h2d=h2d,
    )


def _tier(w: Recorder) -> MetricTier:
    have = ["step timeline (host clock)", "process and worker CPU / RSS (psutil)"]
    missing: list[dict[str, str]] = []
    if w.device.type != "cuda":
        missing.append({"metric": "device time, memory, NVML",
                        "reason": f"the job runs on {w.device.type}, not CUDA"})
        return MetricTier(tier="cpu", have=have, missing=missing)
    have += ["device span per step (CUDA events)", "peak device memory (allocator)"]
    tier = "cuda-events"
    if w.syncs is not None:
        have.append("host-sync count (set_sync_debug_mode, lower bound)")
    nvml_summary = w.nvml_summary
    if w.nvml is None:
        missing.append({"metric": "NVML utilization, power, energy, clocks",
                        "reason": w.nvml_reason or "NVML unavailable"})
    else:
        tier += "+nvml"
        have.append("NVML utilization, power, energy, clocks")
        if nvml_summary is not None and nvml_summary.gpm_sm_active_pct is not None:
            tier += "+gpm"
            have.append("GPM SM-active, tensor-active")
        else:
            missing.append({"metric": "SM-active / tensor-active (GPM)",
                            "reason": (nvml_summary.gpm_reason if nvml_summary and nvml_summary.gpm_reason
                                       else "no GPM sample in the window")})
    missing.append({"metric": "exact device-busy time, per-kernel breakdown",
                    "reason": "needs a kernel-level trace (torch.profiler with CUDA activities); "
                              "always-on mode does not record one"})
    return MetricTier(tier=tier, have=have, missing=missing)


def _sources(w: Recorder) -> dict[str, str]:
    src = {
        "step_time": "time.perf_counter between step ends; steps delimited by "
                     f"{w.tracker.source or 'nothing (no step seen)'}",
        "data_wait": "host time inside DataLoader iter()/next() or wrapped next()",
        "forward": "host time inside outermost nn.Module calls (forward hooks)",
        "backward": "host time inside torch.autograd.backward / grad",
        "optimizer": "host time inside Optimizer.step (global optimizer hooks)",
        "comm": "host time inside torch.distributed collectives the loop calls itself",
        "evaluation": "host time inside outermost nn.Module calls of a model not frozen, with "
                      "gradients disabled or in eval mode and no backward after them in the step",
        "cpu": "psutil /proc readings every "
               f"{w.config.sample_interval_s:g} s; an exiting worker may lose one interval",
        "mfu": "torch.utils.flop_counter.FlopCounterMode over one step's first "
               "forward+backward × the step's backward passes"
               + (f" ({w.flops.passes} in the counted step)" if w.flops.passes else "")
               + " ÷ mean step time (the measured window's wall time ÷ its steps) ÷ peak from "
               "redline/data/peak_flops.json",
    }
    if w.gemm_rates is not None:
        src["gemm_rates"] = (
            f"a {'×'.join(map(str, GEMM_SHAPE))} matrix product (torch.mm) in fp32 and in bf16 "
            f"on {w.gemm_rates.threads} torch thread(s), best of {GEMM_REPEATS} after one "
            "untimed call, timed when the report was built (redline/measure/cpu_gemm.py)")
    src["memory_over_time"] = (
        "RSS of the process and of each child (psutil memory_info) every "
        f"{w.config.sample_interval_s:g} s on the CPU sampler's thread"
        + (", and torch.cuda.memory_allocated / memory_reserved (allocator counters, no sync) "
           "at the same samples" if w.device.type == "cuda" else "")
        + "; growth fitted over the measured window (Theil–Sen slope, Mann–Kendall test)")
    src["drift"] = ("the kept step records' times (start-up: the steps before the step time "
                    "settles at its steady level; trend: Theil–Sen against the step index; "
                    "levels: Otsu's split and Ashman's D; the loop thread's run delay from the "
                    "CPU sampler's readings)")
    if w.config.stack_sample_interval_s is not None and w.code is not None:
        fast_s, slow_s = w.config.stack_sample_interval_s, w.code.slow_interval_s
        slowed = (f"every {slow_s * 1e3:g} ms while under {SLOW_BELOW_SHARE:.0%} of the "
                  "window's samples are outside the phases; " if slow_s > fast_s else "")
        src["other"] = ("step time in no phase above, split between the user's lines by the "
                        f"training thread's Python stack, read every {fast_s * 1e3:g} ms from "
                        f"the CPU sampler's thread while outside the phases ({slowed}torch, "
                        "stdlib and redline frames folded into the calling line)")
        src["gc"] = "gc.callbacks around every collection (exact pause time)"
    if w.device.type == "cuda":
        src["device_span"] = ("torch.cuda.Event pairs (first device work → step end), "
                              "read with query(); upper bound of busy time")
        src["memory"] = "torch.cuda.max_memory_allocated / max_memory_reserved"
        src["h2d_copy"] = "host time inside Tensor.to/.cuda from CPU to device"
        if w.nvml is not None:
            src["nvml"] = "nvidia-ml-py (NVML) sampled every " f"{w.config.sample_interval_s:g} s"
    return src


def recorded_trace(w: Recorder) -> tuple[TraceSummary | None, TraceAnalysis | None]:
    """The trace the recorder captured (``WatchConfig.trace_dir``), summarized, with its
    analysis for the trace rules; (None, None) when no trace was asked for."""
    cap = w.capture
    if cap is None:
        return None, None
    steps = w.step_counts[2] - (1 if w.flops.flops else 0)
    if not cap.written:
        note = cap.error or (f"the run ended before the trace's {cap.steps_needed} steps "
                             "were recorded")
        return TraceSummary(path=None, steps=steps, device_events=0, window_us=None, idle_pct=None,
                            compute_pct=None, non_compute_pct=None, note=note), None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # rank defaults to 0 for a single-process trace
            analysis = analyze_paths([cap.path])
    except TraceError as e:
        return TraceSummary(path=str(cap.path), steps=steps, device_events=0, window_us=None, idle_pct=None,
                            compute_pct=None, non_compute_pct=None, note=str(e)), None
    (rank_analysis,) = analysis.ranks
    temporal = rank_analysis.temporal
    if temporal is None:
        note = ("CPU-only trace (no CUDA activity was recorded): it shows host operators; "
                "kernel-level analysis needs a GPU" if w.device.type != "cuda"
                else "the trace holds no GPU events")
        return TraceSummary(path=str(cap.path), steps=steps, device_events=0, window_us=None, idle_pct=None,
                            compute_pct=None, non_compute_pct=None, note=note), analysis
    return (TraceSummary(path=str(cap.path), steps=steps, device_events=rank_analysis.device_events,
                         window_us=temporal.window_us, idle_pct=temporal.pct(temporal.idle_us),
                         compute_pct=temporal.pct(temporal.compute_us),
                         non_compute_pct=temporal.pct(temporal.non_compute_us),
                         note=None), analysis)
