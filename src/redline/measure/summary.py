"""Turn what a recorder saw into :class:`~redline.core.measurements.Measurements` (no diagnosis:
the rules run on the result in :mod:`redline.diagnose`)."""

from __future__ import annotations

import platform
import warnings
from collections import Counter
from typing import TYPE_CHECKING

import torch

from redline.core.measurements import (
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
    StepTiming,
)
from redline.core.report import TraceSummary
from redline.measure.ddp import ddp_stats, fsdp_stats, snapshot
from redline.measure.evaluation import evaluation_metrics
from redline.measure.loop_work import loop_work
from redline.measure.mfu import mfu_for
from redline.measure.stats import percentile, span_fraction, step_times
from redline.measure.system import cpu_budget, cpu_flags, shm_info
from redline.measure.timeline import PHASES, StepRecord
from redline.trace import TraceAnalysis, TraceError, analyze_paths

if TYPE_CHECKING:
    from redline.measure.recorder import Recorder


def device_info(dev: torch.device) -> DeviceInfo:
    """What the report says of the device a watch measured on."""
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        return DeviceInfo("cuda", props.name, torch.cuda.device_count(),
                          f"{props.major}.{props.minor}", int(props.total_memory))
    return DeviceInfo(dev.type, platform.processor() or platform.machine(), 1)


def _timing(w: Recorder, steps: list[StepRecord]) -> StepTiming:
    total_steps, warmup, excluded, measured = w.step_counts
    times = step_times(steps)
    samples = [s.samples for s in steps if s.samples is not None]
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
    )


def _breakdown(steps: list[StepRecord]) -> list[PhaseShare]:
    n = len(steps)
    total = sum(s.step_s for s in steps)
    out = []
    for ph in (*PHASES, "other"):
        per = ([s.other_s for s in steps] if ph == "other"
               else [s.phases[PHASES.index(ph)] for s in steps])
        v = sum(per)
        trimmed = None
        k = max(range(n), key=per.__getitem__) if n else None
        if k is not None and n >= 3:
            rest = total - steps[k].step_s
            trimmed = (v - per[k]) / rest if rest > 0 else None
        out.append(PhaseShare(ph, v / n if n else 0.0, v / total if total > 0 else 0.0,
                              trimmed, None if k is None else steps[k].index,
                              None if k is None else per[k]))
    return out


def precision_info(w: Recorder, dev: DeviceInfo) -> PrecisionInfo:
    """The precision the watched steps ran in, from the parameter and autocast dtypes seen."""
    inst = w.inst
    assert inst is not None
    p = inst.precision
    params: Counter[str] = p.param_dtypes or Counter()
    ac: Counter[str] = p.autocast or Counter()
    param_dtype = params.most_common(1)[0][0] if params else None
    ac_dtype = ac.most_common(1)[0][0] if ac else None
    ac_frac = sum(ac.values()) / p.forwards if p.forwards else None
    mm = torch.get_float32_matmul_precision()
    tf32 = bool(torch.backends.cuda.matmul.allow_tf32) or mm != "highest"
    eff: str | None
    if ac_frac is not None and ac_frac >= 0.5 and ac_dtype is not None:
        eff = f"{ac_dtype}-autocast"
    elif param_dtype in ("bf16", "fp16"):
        eff = param_dtype
    elif param_dtype == "fp32" or (param_dtype is None and p.forwards):
        cc = float(dev.compute_capability) if dev.compute_capability else 0.0
        eff = "tf32" if dev.type == "cuda" and cc >= 8.0 and tf32 else "fp32"
    else:
        eff = None
    return PrecisionInfo(eff, param_dtype, ac_dtype, ac_frac, mm, tf32)


def build_measurements(w: Recorder) -> Measurements:
    """Everything ``w`` recorded, as :class:`~redline.core.measurements.Measurements`."""
    notes: list[str] = []
    steps = w.measured_steps
    if not steps:
        steps = [s for s in w.steps if s.kind != "excluded"]
        if steps:
            notes.append(
                f"Only {len(steps)} step(s) ran, none after the {w.config.warmup_steps} warm-up "
                "step(s): statistics below include warm-up steps and are less reliable."
            )
        elif w.step_counts[2]:
            notes.append(
                f"Step time unknown: the only {w.step_counts[2]} step(s) that ran were slowed "
                "on purpose (FLOP counting or a trace) and are left out of the statistics; run "
                "more steps, or without FLOP counting (count_flops=False, doctor --no-flops), "
                "to time them."
            )
    stride = w.tracker.stride
    if stride > 1:
        notes.append(
            f"The run closed {w.tracker.closed:,} steps, more than the {w.config.steps_kept:,} "
            f"step records a watch keeps (WatchConfig.steps_kept): step statistics, the "
            f"breakdown and the timeline are over every {stride}th step, a uniform sample; "
            "step counts are exact."
        )
    dev = device_info(w.device)
    inst = w.inst
    assert inst is not None
    timing = _timing(w, steps)
    breakdown = _breakdown(steps)
    budget = cpu_budget()
    shm = shm_info()
    win = w.cpu_window
    flags = sorted(cpu_flags() & {"amx_bf16", "avx512_bf16"})
    data_cpu = sum(s.data_cpu_s for s in steps)
    data_delay = sum(s.data_run_delay_s for s in steps)
    data_read = sum(s.data_read_s for s in steps)  # the fetches whose CPU and delay were read
    delay_known = inst.data.run_delay_known
    wall = win.wall_s if win and win.wall_s > 0 else None
    others = None
    if win is not None and wall and win.usable_cpus_busy_s is not None:
        others = max(0.0, (win.usable_cpus_busy_s - win.main_cpu_s - win.children_cpu_s) / wall)
    host = HostMetrics(
        cpus_available=budget.cpus,
        cpus_source=budget.source,
        torch_threads=torch.get_num_threads(),
        main_cpu_cores=win.main_cpu_s / win.wall_s if win and win.wall_s > 0 else None,
        workers_cpu_cores=win.children_cpu_s / win.wall_s if win and win.wall_s > 0 else None,
        workers_seen=win.children_seen if win else 0,
        main_rss_peak_bytes=win.main_rss_peak_bytes if win else None,
        workers_rss_peak_bytes=win.children_rss_peak_bytes if win else None,
        read_bytes_per_s=(win.read_bytes / win.wall_s
                          if win and win.io_available and win.wall_s > 0 else None),
        read_chars_per_s=(win.read_chars / win.wall_s
                          if win and win.io_available and win.wall_s > 0 else None),
        data_fetch_cpu_fraction=data_cpu / data_read if data_read > 1e-6 else None,
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
            batch_size=li.batch_size, settings=li.settings, dataset_type=li.dataset_type,
            multiprocessing_context=li.multiprocessing_context,
            iterators=li.iterators, worker_starts=li.worker_starts,
            worker_startup_mean_s=(sum(li.startup_s) / len(li.startup_s)
                                   if li.startup_s else None),
            worker_startup_total_s=sum(li.startup_s), batch_bytes=li.batch_bytes,
            python_containers=[
                {"path": c.path, "type": c.type, "items": c.items, "est_bytes": c.est_bytes}
                for c in li.containers
            ],
            cache=_cache_stats(li.cache),
        )
        for li in inst.loaders
    ]
    dm = _device_metrics(w, steps, dev)
    precision = precision_info(w, dev)
    mfu = mfu_for(dev, precision.effective, w.flops.flops, w.flops.conv_flops,
                  timing.step_time_mean_s, counted=w.config.count_flops,
                  flop_error=w.flops.error, cudnn_tf32=bool(torch.backends.cudnn.allow_tf32))
    main_loader = next((li for li, info in zip(loaders, inst.loaders, strict=True)
                        if info.training), None) or next(
        (li for li in loaders if li.iterators), loaders[0] if loaders else None)
    config = EffectiveConfig(
        device=str(w.device),
        batch_size=(main_loader.batch_size if main_loader and main_loader.batch_size
                    else (round(timing.samples_per_step) if timing.samples_per_step else None)),
        loader=main_loader.settings if main_loader else None,
        precision=precision.effective,
        torch_threads=torch.get_num_threads(),
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
        device_metrics=dm, loaders=loaders, precision=precision, mfu=mfu,
        tier=_tier(w), counts=dict(w.tracker.counts),
        root_modules=max(inst.root_modules, w.root_names, key=len),  # roots freed since: seen
        sources=_sources(w), notes=notes,
        ddp=ddp_stats(parallel, w.arrivals, timing.steps_measured, dict(w.tracker.counts)),
        fsdp=fsdp_stats(parallel, w.arrivals, timing.steps_measured, dict(w.tracker.counts)),
        evaluation=evaluation_metrics(steps),
        loop=loop_work(w, steps),
    )


def _competing(w: Recorder) -> list[CompetingProcess] | None:
    """The window's other processes on the job's CPUs, its DataLoader workers left out."""
    win, inst = w.cpu_window, w.inst
    if win is None or win.processes is None or inst is None:
        return None
    workers = {pid for li in inst.loaders for pid in li.worker_pids}
    wall = win.wall_s if win.wall_s > 0 else None
    return [CompetingProcess(pid=p.pid, command=p.command, cpu_s=p.cpu_s,
                             cpu_cores=p.cpu_s / wall if wall else 0.0, child=p.child,
                             same_job=p.same_job)
            for p in win.processes if p.pid not in workers]


def _cache_stats(cache: object) -> dict[str, int | float | None] | None:
    if cache is None:
        return None
    st = cache.stats()  # type: ignore[attr-defined]
    return {"hits": st.hits, "misses": st.misses, "bytes_read": st.bytes_read,
            "bytes_written": st.bytes_written, "uncached": st.uncached, "hit_rate": st.hit_rate}


def _device_metrics(w: Recorder, steps: list[StepRecord], dev: DeviceInfo) -> DeviceMetrics:
    n = len(steps)
    inst = w.inst
    assert inst is not None
    h = inst.h2d
    h2d = None
    if dev.type != "cpu" and n:
        h2d = H2DMetrics(
            copies_per_step=h.copies / max(1, w.tracker.closed),
            bytes_per_step=h.bytes / max(1, w.tracker.closed),
            pageable_fraction=h.pageable_bytes / h.bytes if h.bytes else None,
            host_s_per_step=h.host_s / max(1, w.tracker.closed),
        )
    if dev.type != "cuda":
        return DeviceMetrics(None, None, None, None, None, None, None, None, h2d=h2d)
    with_dev = [s for s in steps if s.device_s is not None]
    span = span_fraction(with_dev)
    mem = w.cuda_memory
    syncs = w.syncs
    return DeviceMetrics(
        device_span_fraction=span,
        device_s_per_step=(sum(s.device_s or 0.0 for s in with_dev) / len(with_dev)
                           if with_dev else None),
        peak_allocated_bytes=mem.peak_allocated_bytes if mem else None,
        peak_reserved_bytes=mem.peak_reserved_bytes if mem else None,
        total_memory_bytes=mem.total_bytes if mem else None,
        nvml=w.nvml_summary,
        sync_calls=syncs.count if syncs else None,
        sync_calls_per_step=syncs.count / max(1, w.tracker.closed) if syncs else None,
        sync_sites=[{"site": s, "count": c} for s, c in syncs.sites.most_common(5)]
        if syncs else [],
        h2d=h2d,
    )


def _tier(w: Recorder) -> MetricTier:
    have = ["step timeline (host clock)", "process and worker CPU / RSS (psutil)"]
    missing: list[dict[str, str]] = []
    if w.device.type != "cuda":
        missing.append({"metric": "device time, memory, NVML",
                        "reason": f"the job runs on {w.device.type}, not CUDA"})
        return MetricTier("cpu", have, missing)
    have += ["device span per step (CUDA events)", "peak device memory (allocator)"]
    tier = "cuda-events"
    if w.syncs is not None:
        have.append("host-sync count (set_sync_debug_mode, lower bound)")
    nv = w.nvml_summary
    if w.nvml is None:
        missing.append({"metric": "NVML utilization, power, energy, clocks",
                        "reason": w.nvml_reason or "NVML unavailable"})
    else:
        tier += "+nvml"
        have.append("NVML utilization, power, energy, clocks")
        if nv is not None and nv.gpm_sm_active_pct is not None:
            tier += "+gpm"
            have.append("GPM SM-active, tensor-active")
        else:
            missing.append({"metric": "SM-active / tensor-active (GPM)",
                            "reason": (nv.gpm_reason if nv and nv.gpm_reason
                                       else "no GPM sample in the window")})
    missing.append({"metric": "exact device-busy time, per-kernel breakdown",
                    "reason": "needs a kernel-level trace (torch.profiler with CUDA activities); "
                              "always-on mode does not record one"})
    return MetricTier(tier, have, missing)


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
    if w.config.stack_sample_interval_s is not None:
        src["other"] = ("step time in no phase above, split between the user's lines by the "
                        "training thread's Python stack, read every "
                        f"{w.config.stack_sample_interval_s * 1e3:g} ms from the CPU sampler's "
                        "thread while outside the phases (torch, stdlib and redline frames "
                        "folded into the calling line)")
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
        return TraceSummary(None, steps, 0, None, None, None, None, note), None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # rank defaults to 0 for a single-process trace
            a = analyze_paths([cap.path])
    except TraceError as e:
        return TraceSummary(str(cap.path), steps, 0, None, None, None, None, str(e)), None
    (r,) = a.ranks
    t = r.temporal
    if t is None:
        note = ("CPU-only trace (no CUDA activity was recorded): it shows host operators; "
                "kernel-level analysis needs a GPU" if w.device.type != "cuda"
                else "the trace holds no GPU events")
        return TraceSummary(str(cap.path), steps, 0, None, None, None, None, note), a
    return (TraceSummary(str(cap.path), steps, r.device_events, t.window_us, t.pct(t.idle_us),
                         t.pct(t.compute_us), t.pct(t.non_compute_us), None), a)
