"""Everything a watch measured, before diagnosis: one dataclass per section of the report.

Every number carries its unit in its name (``_s`` seconds, ``_bytes``, ``_fraction`` 0..1,
``_pct`` 0..100, ``_per_s``, ``_cores`` CPU-seconds per wall-second) and the report's
``sources`` say where it came from. Unknown values are ``None`` and the report says why
(``tier.missing``, ``mfu.reason``); they are never guessed. Serialized by
:mod:`redline.report.json_io` against ``redline/report/schema.json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from redline.core.loader import LoaderSettings


@dataclass(slots=True, kw_only=True)
class NvmlSummary:
    """NVML readings over the measured window (means over samples unless said otherwise)."""

    samples: int
    util_gpu_pct: float | None
    util_memory_pct: float | None
    memory_used_peak_bytes: int | None
    power_w: float | None
    energy_j: float | None
    """Energy counter delta over the window (None before Volta or if unreadable)."""
    sm_clock_mhz: float | None
    clock_event_reasons: list[str] = field(default_factory=list)
    gpm_sm_active_pct: float | None = None
    gpm_tensor_active_pct: float | None = None
    gpm_reason: str | None = None
    """Why GPM metrics are missing, if they are."""


@dataclass(slots=True, kw_only=True)
class MfuResult:
    """Model FLOPs utilization and how it was obtained."""

    flops_per_step: float | None
    achieved_flops_per_s: float | None
    peak_flops_per_s: float | None
    compute_dtype: str | None
    mfu: float | None
    """Fraction 0..1, or None when anything it needs is unknown (see ``reason``)."""
    peak_source: str | None
    reason: str | None
    """Why MFU is unknown, if it is."""


@dataclass(slots=True, kw_only=True)
class DeviceInfo:
    """The device the job trained on, as torch reports it."""

    type: str
    """'cuda', 'cpu', ..."""
    name: str
    count: int
    compute_capability: str | None = None
    total_memory_bytes: int | None = None


@dataclass(slots=True, kw_only=True)
class EffectiveConfig:
    """The training configuration redline saw (not what it recommends)."""

    device: str
    batch_size: int | None
    """Samples per batch: the DataLoader's batch_size, else the leading dimension seen."""
    loader: LoaderSettings | None
    """The settings of the DataLoader the loop read from; None when none was seen."""
    precision: str | None
    """'fp32', 'tf32', 'bf16-autocast', 'fp16-autocast', 'bf16', 'fp16'."""
    torch_threads: int
    """torch.get_num_threads() of the training process."""
    data_source: str
    """'DataLoader', 'wrapped iterable' or 'not seen'."""


@dataclass(slots=True, kw_only=True)
class StepTiming:
    """Step counts, step-time percentiles and throughput over the measured steps."""

    step_source: str | None
    """What delimited steps: 'optimizer', 'forward_backward', 'manual', or None (no step)."""
    steps_total: int
    steps_warmup: int
    steps_excluded: int
    """Steps slowed on purpose (FLOP counting) and left out of the statistics."""
    steps_measured: int
    step_time_p50_s: float | None
    step_time_p95_s: float | None
    step_time_mean_s: float | None
    samples_per_step: float | None
    throughput_samples_per_s: float | None
    """Samples per second over the measured steps: Σ samples ÷ their wall time, on the device's
    clock where the device ran longer than the host (a device-bound loop whose host queued
    work ahead; see :func:`redline.measure.stats.step_times`)."""
    steps_per_s: float | None
    step_times_s: list[float] | None = None
    """The measured steps' times in order, on the clock of ``step_time_mean_s``, the last
    :data:`MAX_STEP_TIMES` of them: what ``redline compare`` tests a change against each run's
    own spread with. None in reports written before it was recorded."""


MAX_STEP_TIMES = 2000
"""Most step times a report lists (about 30 kB of JSON); longer runs keep the last ones."""


@dataclass(slots=True, kw_only=True)
class PhaseShare:
    """One phase's share of the measured step time."""

    phase: str
    """'data_wait', 'h2d_copy', 'forward', 'backward', 'optimizer' or 'other'."""
    mean_s: float
    """Mean host seconds per measured step, exclusive of nested phases."""
    fraction: float
    """Share of total measured step time, 0..1."""
    fraction_without_slowest: float | None = None
    """The share with the one step where this phase took longest left out (that whole step):
    a single outlier — a GC pause, a preempted fetch, a cold read — moves ``fraction`` but not
    this. None with fewer than 3 measured steps."""
    slowest_step: int | None = None
    """Index of the measured step where this phase took longest (None without steps)."""
    slowest_step_s: float | None = None
    """Seconds of this phase in that step."""


@dataclass(slots=True, kw_only=True)
class CompetingProcess:
    """A process, other than the training process and its DataLoader workers, that used CPU
    on the CPUs the job may run on during the measured window."""

    pid: int
    command: str
    """Its command line, cut to 160 characters."""
    cpu_s: float
    """CPU seconds it used in the window on the job's CPUs (all its threads; /proc/<pid>/stat
    at the window's start and end; a process allowed on n CPUs, k of them the job's, counts
    k/n of its time)."""
    cpu_cores: float
    """``cpu_s`` ÷ the window's wall seconds."""
    child: bool
    """A child process of the job (not a DataLoader worker): one the script started."""
    same_job: bool = False
    """Another rank of this multi-process job (or its workers, its launcher), found by the
    rendezvous variables in its environment: listed, never counted as competition."""


@dataclass(slots=True, kw_only=True)
class HostMetrics:
    """What the host did over the measured steps: usable CPUs, the CPU time, memory and reads of
    the training process and its DataLoader workers."""

    cpus_available: float
    cpus_source: str
    torch_threads: int
    main_cpu_cores: float | None
    """CPU seconds of the training process per wall second (all threads)."""
    main_thread_cpu_cores: float | None = None
    """CPU seconds of the training loop's thread alone per wall second
    (/proc/self/task/<tid>/schedstat): the work of the step without the process's other
    threads (communication, intra-op pools, samplers); None where unreadable."""
    workers_cpu_cores: float | None
    """CPU seconds of its child processes (DataLoader workers) per wall second."""
    workers_seen: int
    """DataLoader worker processes seen during the window (other child processes, such as
    multiprocessing's resource tracker, are not counted)."""
    main_rss_peak_bytes: int | None
    workers_rss_peak_bytes: int | None
    read_bytes_per_s: float | None
    """Storage reads (/proc/<pid>/io read_bytes) of process + workers, per second."""
    read_chars_per_s: float | None
    """read() syscall bytes (page-cache hits included) of process + workers, per second."""
    data_fetch_cpu_fraction: float | None
    """Training-thread CPU seconds ÷ wall seconds inside data fetches (meaningful for
    num_workers=0, where the fetch runs in that thread)."""
    shm_total_bytes: int | None
    shm_free_bytes: int | None
    cpu_flags: list[str] = field(default_factory=list)
    """Relevant CPU features (amx_bf16, avx512_bf16) when present."""
    gemm_fp32_flops_per_s: float | None = None
    """FLOP/s of a 256×1024×1024 fp32 matrix product on the training process's torch threads
    (:mod:`redline.measure.cpu_gemm`), measured when the watch closes where the device is a
    CPU with AMX bf16 units and the step ran in fp32 with its FLOPs counted; None elsewhere."""
    gemm_bf16_flops_per_s: float | None = None
    """The same product's FLOP/s in bf16, measured with ``gemm_fp32_flops_per_s``."""
    data_fetch_run_delay_fraction: float | None = None
    """Seconds the training thread was runnable but waiting for a CPU inside data fetches ÷
    wall seconds inside them (scheduler run delay, /proc/<pid>/task/<tid>/schedstat); None
    where unreadable."""
    main_thread_run_delay_fraction: float | None = None
    """Seconds the training loop's thread was runnable but waiting for a CPU ÷ wall seconds of
    the measured window (/proc/self/task/<tid>/schedstat): the share of the run it lost to
    other threads and processes on its CPUs; None where unreadable."""
    workers_run_delay_cores: float | None = None
    """Seconds the DataLoader workers were runnable but waiting for a CPU, per wall second
    (summed over workers; /proc/<pid>/schedstat)."""
    workers_read_bytes_per_s: float | None = None
    """Of ``read_bytes_per_s``, the DataLoader workers' (what the fetch itself read)."""
    workers_read_chars_per_s: float | None = None
    """Of ``read_chars_per_s``, the DataLoader workers'."""
    other_processes_cpu_cores: float | None = None
    """CPU seconds per wall second that other processes spent on the CPUs this job may use:
    everything on those CPUs (/proc/stat per CPU) minus this process and its workers."""
    competing_processes: list[CompetingProcess] | None = None
    """The processes other than this one and its DataLoader workers (the job's other children
    all listed, at most 10 others) that used ≥ 2 % of a core on the job's CPUs during the
    window, most CPU first; None where /proc could not be read."""


@dataclass(slots=True, kw_only=True)
class H2DMetrics:
    """Host-to-device copies per measured step: their count, bytes, pageable share and host time."""

    copies_per_step: float
    bytes_per_step: float
    pageable_fraction: float | None
    """Share of copied bytes that came from pageable (not pinned) memory."""
    host_s_per_step: float


@dataclass(slots=True, kw_only=True)
class DeviceMetrics:
    """What the device did over the measured steps: its busy span, memory peaks, NVML samples,
    synchronizing calls and host-to-device copies."""

    device_span_fraction: float | None
    """Σ device span (CUDA events, first work → step end) ÷ Σ step time: an upper bound of
    device-busy; None off CUDA."""
    device_s_per_step: float | None
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    total_memory_bytes: int | None
    nvml: NvmlSummary | None
    sync_calls: int | None
    """Synchronizing CUDA calls seen (set_sync_debug_mode; a lower bound), None off CUDA."""
    sync_calls_per_step: float | None
    sync_sites: list[dict[str, object]] = field(default_factory=list)
    h2d: H2DMetrics | None = None


@dataclass(slots=True, kw_only=True)
class LoaderReport:
    """The DataLoader the loop read from: its settings, dataset, worker start-ups and batch size
    in bytes."""

    batch_size: int | None
    settings: LoaderSettings
    dataset_type: str
    multiprocessing_context: str | None
    iterators: int
    worker_starts: int
    worker_startup_mean_s: float | None
    worker_startup_total_s: float
    batch_bytes: int | None
    python_containers: list[dict[str, object]] = field(default_factory=list)
    cache: dict[str, int | float | None] | None = None
    """CachedDataset statistics (hits, misses, bytes_read, bytes_written, uncached, hit_rate)
    summed over the process and its workers, when the loader reads through one."""


@dataclass(slots=True, kw_only=True)
class PrecisionInfo:
    """The numeric precision the job trained in: parameter and autocast dtypes, and the float32
    matmul settings."""

    effective: str | None
    param_dtype: str | None
    autocast_dtype: str | None
    autocast_forward_fraction: float | None
    """Share of outermost forwards that ran under autocast."""
    float32_matmul_precision: str
    tf32_matmul_allowed: bool


@dataclass(slots=True, kw_only=True)
class MetricTier:
    """Which metrics this run could have, and why not more."""

    tier: str
    """'cpu' | 'cuda-events' | 'cuda-events+nvml' | 'cuda-events+nvml+gpm'."""
    have: list[str]
    missing: list[dict[str, str]]
    """[{'metric': ..., 'reason': ...}]"""


@dataclass(slots=True, kw_only=True)
class DdpStats:
    """A DistributedDataParallel model's own runtime statistics (``_get_ddp_logging_data``,
    sampled by DDP itself), and the collectives this rank enqueued per optimizer step."""

    backend: str
    find_unused_parameters: bool
    unused_parameter_bytes: int
    gradient_as_bucket_view: bool
    bucket_cap_bytes: int
    bucket_sizes_bytes: list[int]
    parameter_bytes: int
    backward_comm_s: float | None
    """DDP's mean gradient-communication time per backward pass."""
    backward_overlap_s: float | None
    """…of which overlapped with backward computation."""
    backward_per_step: float | None
    """Backward passes per optimizer step (> 1 under gradient accumulation)."""
    all_reduces_per_step: float | None
    """All-reduces this rank enqueued per optimizer step in the measured window (flight
    recorder)."""
    static_graph: bool = False
    """``DistributedDataParallel(static_graph=True)``: the graph of used parameters recorded
    once instead of searched every step."""


@dataclass(slots=True, kw_only=True)
class FsdpStats:
    """An FSDP2 (``fully_shard``) model's parameter groups, and the gradient reductions this
    rank enqueued per optimizer step (flight recorder)."""

    groups: int
    """Modules sharded with ``fully_shard`` (each reduces its gradients once per synced
    backward)."""
    backward_per_step: float | None
    """Backward passes per optimizer step (> 1 under gradient accumulation)."""
    reductions_per_step: float | None
    """Gradient reductions per optimizer step: reduce-scatters, or all-reduces where the
    backend has no reduce-scatter (gloo); the loop's own all-reduces count too."""


@dataclass(slots=True, kw_only=True)
class EvaluationMetrics:
    """How often the measured steps held an evaluation (the 'evaluation' phase: outermost
    forwards of a model not frozen, with gradients disabled or in eval mode, with no backward
    after them in the step)."""

    steps_with_evaluation: int
    """Measured steps in which some evaluation ran."""
    period_steps: int | None
    """k where evaluation ran every k-th step: the gap between consecutive evaluating steps,
    where at least 3 of them ran and that gap makes ≥ 3/4 of the gaps (1: every step); None
    where it ran fewer times or irregularly."""
    mean_s_per_evaluating_step: float
    """Mean evaluation seconds in the steps that held one (the cost of one evaluation)."""


@dataclass(slots=True, kw_only=True)
class CodeSite:
    """One line of the user's code where the training loop spent time outside every timed
    phase (sampled stacks; torch, the standard library and redline folded into it)."""

    file: str
    """The source file, relative to the working folder where it lies under it."""
    line: int
    function: str
    kind: str
    """'checkpoint' | 'logging' | 'gc' | 'batch' | 'loss' | 'optimizer' | 'loader' | 'code'
    (:data:`redline.measure.stacks.KINDS`): what the calls under the line, or the line itself,
    show the work to be."""
    via: str | None
    """The library call under the line that named the kind ('torch.serialization:_save'), or
    the innermost third-party package call ('numpy:mean'); None when neither was seen."""
    step_fraction: float
    """Share of the measured step time spent at this line, 0..1: the exact time outside the
    phases, split between lines by their sampled time."""
    samples: int
    text: str | None = None
    """The source line, stripped and cut to 120 characters; None where unreadable."""


@dataclass(slots=True, kw_only=True)
class PeriodicStall:
    """Every k-th measured step much slower than the others."""

    period_steps: int
    slow_steps: int
    """Measured steps that were slow."""
    extra_s_per_slow_step: float
    """Mean seconds a slow step took beyond the median step."""
    step_fraction: float
    """Those extra seconds ÷ the measured step time, 0..1."""
    phase: str
    """The phase (or 'other') whose time grew most in the slow steps."""
    site: CodeSite | None
    """The line that spent the most time outside the phases in the slow steps, where the
    growth is outside the phases."""


@dataclass(slots=True, kw_only=True)
class LoopWork:
    """Where the time outside every timed phase went ('other' in the breakdown)."""

    other_fraction: float
    """Share of the measured step time outside every phase, 0..1 (the breakdown's 'other')."""
    sampled_s: float
    """Seconds of stack samples outside the phases (GC pauses taken out)."""
    samples: int
    interval_s: float
    """The stack sampler's configured period (its ticks slow to 50 ms while under 1 % of the
    window's samples are outside the phases: ``redline.measure.stacks``)."""
    sites: list[CodeSite]
    """The lines that spent it, largest first (at most 10)."""
    kind_fractions: dict[str, float]
    """Share of the measured step time per kind of work outside the phases, GC pauses outside
    the phases as 'gc'."""
    gc_pause_fraction: float | None
    """Seconds in garbage collections (every generation, inside and outside the phases) ÷ the
    measured step time; None where GC was not timed."""
    gc_collections: list[int]
    """Collections per generation (0, 1, 2) in the measured window."""
    gc_full_sites: list[CodeSite]
    """The user's lines that were running when full collections (generation 2, e.g.
    ``gc.collect()``) began, with their share of the step time in those collections."""
    periodic: PeriodicStall | None = None


@dataclass(slots=True, kw_only=True)
class MemoryCurve:
    """One process's memory over the run (host RSS, or the CUDA caching allocator's
    allocated or reserved bytes), sampled off the step path, with a robust fit of its growth
    over the measured window (:mod:`redline.measure.trend`)."""

    kind: str
    """'host_rss' | 'cuda_allocated' | 'cuda_reserved'."""
    process: str
    """'main' (the training process) or 'worker' (a DataLoader worker, ``pid``)."""
    pid: int | None
    """The process id (None for the device's memory)."""
    t_s: list[float]
    """Sample times, seconds from the watch's entry (at most 120 points, evenly spaced)."""
    steps: list[int]
    """Steps closed at each sample (warm-up included)."""
    bytes: list[int]
    """The reading at each sample."""
    start_bytes: int
    """Its value where the measured window began (its first sample in it)."""
    end_bytes: int
    """Its last value."""
    peak_bytes: int
    """Its largest sample over the whole run."""
    window_s: float
    """Seconds between its first and last sample in the measured window."""
    window_samples: int
    """Samples in the measured window: the points the slope and the trend test read."""
    slope_bytes_per_1k_steps: float | None
    """Theil–Sen slope over the measured window against steps closed, × 1,000; None where
    no step closed between its samples."""
    slope_bytes_per_hour: float | None
    """Theil–Sen slope over the measured window against time, × 3,600; None with fewer than
    4 samples in it."""
    late_slope_bytes_per_hour: float | None
    """The same over the last half of the window's samples: ≈ the slope for a steady growth,
    ≈ 0 for memory that rose and then plateaued (an allocator's cache filled)."""
    trend_z: float | None
    """Mann–Kendall z of the window's samples (positive: rising; |z| ≥ 3 is beyond the noise at
    p < 0.003)."""
    noise_bytes: float | None
    """Scaled median absolute deviation of the samples around the fitted line."""
    limit_bytes: int | None
    """The level at which it runs out: host, its last value + the memory still available
    (``MemAvailable``, lowered by the cgroup's ``memory.max`` − ``memory.current``); CUDA,
    the device's total memory. None where unknown."""
    limit_source: str | None
    hours_to_limit: float | None
    """(limit − last value) ÷ ``slope_bytes_per_hour`` where the slope is positive."""


@dataclass(slots=True, kw_only=True)
class MemoryTimeline:
    """Memory of the training process, its DataLoader workers and the device over the run."""

    interval_s: float
    """The sampler's period."""
    samples: int
    """Samples kept (a long run keeps every 2nd, 4th, ... one: a uniform sample)."""
    curves: list[MemoryCurve]
    """The training process first, then its workers (longest lived first, at most 8), then
    the device's allocated and reserved memory."""


@dataclass(slots=True, kw_only=True)
class StartupCost:
    """The first steps of the run (compilation, autotuning, cold caches, worker start-up),
    told apart from the steady state: the steps before the step time first settles at its
    steady level (docs/report.md, Definitions, "start-up")."""

    steps: int
    """Steps from the first until the steady state (warm-up included, excluded steps not
    counted)."""
    seconds: float
    """Their wall time, less their evaluation phase (evaluation in the loop is its own
    finding's, not start-up)."""
    extra_s: float
    """Of it, the seconds above the steady step time (what start-up cost)."""
    steady_step_s: float
    """The steady step time: the median of the second half of the steps."""
    first_step_s: float
    steps_after_warmup: int
    """Of the start-up steps, those after the warm-up."""
    extra_after_warmup_s: float
    """Of ``extra_s``, the seconds above the steady step time of the start-up steps after the
    warm-up: what they would add to the step statistics."""
    run_delay_s: float | None
    """Seconds the training loop's thread was runnable but waiting for a CPU over the start-up
    steps (an upper bound: the CPU sampler's readings that bracket them);
    None where unreadable."""
    run_delay_after_warmup_s: float | None
    """The same over the start-up steps after the warm-up alone (0 where there are none);
    None where unreadable."""
    left_out: bool
    """Whether the start-up steps after the warm-up were left out of the step statistics: only
    where ``extra_after_warmup_s`` is at least 1 % of the measured steps' time (less moves the
    mean step time by under 1 %) and ``run_delay_after_warmup_s`` is known and under half of
    it (more is a loaded host's burst of contention, not start-up)."""
    kept_because: str | None = None
    """Why start-up steps after the warm-up stayed in the step statistics: 'delay_unknown'
    (the run delay over them could not be read, so a loaded host cannot be ruled out),
    'loaded_host' (their run delay is at least half their extra time), 'immaterial' (their
    extra time is under 1 % of the measured steps' time); None where they were left out or
    there are none."""


@dataclass(slots=True, kw_only=True)
class StepTrend:
    """A robust line through the steady steps' times (Theil–Sen against the step index)."""

    steps: int
    """Steps fitted."""
    slope_s_per_1k_steps: float
    slope_s_per_hour: float | None
    """The slope × the steps per hour at the mean step time."""
    trend_z: float
    """Mann–Kendall z (positive: slower over time)."""
    start_s: float
    """The fitted step time at the first fitted step."""
    end_s: float
    """…and at the last."""
    noise_s: float
    """Scaled median absolute deviation of the step times around the line."""
    rise_fraction: float
    """(end − start) ÷ the median step time."""
    extra_fraction: float
    """Seconds the steps took above the start level ÷ their total: what the drift cost."""
    phase: str
    """The phase (or 'other') whose own Theil–Sen slope is the largest."""
    phase_slope_s_per_1k_steps: float
    run_delay_rise_s: float | None
    """The training loop's thread's scheduler run delay per step over the last third of the
    steps minus over the first third (the CPU sampler's readings that bracket each): how much of the
    rise is waiting for a CPU; None where unreadable."""


@dataclass(slots=True, kw_only=True)
class StepModes:
    """The steady steps' times split in two levels (Otsu), whether or not they are two."""

    fast_s: float
    """Median of the fast level."""
    slow_s: float
    """Median of the slow level."""
    slow_share: float
    """Share of the steps in the slow level, 0..1."""
    separation: float | None
    """Ashman's D of the two levels (robust σ): > 2 separates two modes cleanly; None where
    neither level has a spread."""
    slow_first_half_share: float
    """Of the slow steps, the share in the first half of the run: ≈ 0.5 when the levels are
    interleaved, near 0 or 1 when the step time shifted once (a drift's)."""
    extra_fraction: float
    """Seconds the slow steps took above the fast level ÷ the steps' total."""
    phase: str
    """The phase (or 'other') whose median time differs most between the two levels."""
    run_delay_fraction: float | None
    """The training loop's thread's scheduler run delay over these steps ÷ their wall time
    (the CPU sampler's readings that bracket them): a loaded host's two speeds, with a CPU and
    without; None where unreadable."""


@dataclass(slots=True, kw_only=True)
class StepDrift:
    """How the step time moves within the run: start-up, trend, two levels."""

    startup: StartupCost | None
    """None with fewer than 20 steps, or a run whose steps thin out (``steps_kept``)."""
    trend: StepTrend | None
    """None with fewer than 30 steady steps."""
    modes: StepModes | None


@dataclass(slots=True, kw_only=True)
class Measurements:
    """Everything measured, before diagnosis."""

    device: DeviceInfo
    config: EffectiveConfig
    timing: StepTiming
    breakdown: list[PhaseShare]
    host: HostMetrics
    device_metrics: DeviceMetrics
    loaders: list[LoaderReport]
    precision: PrecisionInfo
    mfu: MfuResult
    tier: MetricTier
    counts: dict[str, int]
    """Events seen: forward, backward, optimizer_step, batches, manual_step, evaluation."""
    root_modules: list[str]
    sources: dict[str, str]
    notes: list[str] = field(default_factory=list)
    ddp: DdpStats | None = None
    """Set when the loop trains a DistributedDataParallel model (multi-process jobs)."""
    fsdp: FsdpStats | None = None
    """Set when the loop trains an FSDP2 (``fully_shard``) model (multi-process jobs)."""
    evaluation: EvaluationMetrics | None = None
    """Set when evaluation ran inside the measured steps."""
    loop: LoopWork | None = None
    """Where the time outside the phases went; None where stacks were not sampled."""
    memory: MemoryTimeline | None = None
    """Memory over the run; None where nothing was sampled."""
    drift: StepDrift | None = None
    """Start-up cost and how the step time moves within the run; None with fewer than 20
    steps."""

    def fraction(self, phase: str) -> float:
        for p in self.breakdown:
            if p.phase == phase:
                return p.fraction
        return 0.0

    def share(self, phase: str) -> PhaseShare | None:
        return next((p for p in self.breakdown if p.phase == phase), None)
