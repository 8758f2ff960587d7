"""Configuration of a watch (always-on measurement of a training loop)."""

from __future__ import annotations

from dataclasses import dataclass

from redline.core.errors import RedlineError


class WatchConfigError(RedlineError, ValueError):
    """A :class:`WatchConfig` field out of its range (``redline.watch(metrics_port=99999)``):
    the message names the field, its range and the value received."""


@dataclass(kw_only=True, slots=True)
class WatchConfig:
    """What :func:`redline.watch` measures and for how long."""

    warmup_steps: int = 3
    """Steps at the start that are recorded but left out of the statistics (allocator warm-up,
    worker start, cudnn autotune). Default: 3. With 0, every step counts from entry; the FLOP
    count and the trace then take the steps after the first exact step boundary, which are
    still excluded from step statistics (the CPU/NVML sampling window runs through them)."""

    max_steps: int | None = None
    """Measured steps (after warm-up) after which ``on_limit`` is called, then again at every
    later step end and batch fetch (so a loop that catches what it raises meets it again);
    None = no limit."""

    count_flops: bool = True
    """Count the FLOPs of one step with ``torch.utils.flop_counter`` for MFU: over its first
    forward+backward, scaled to the step's backward passes (see ``redline.measure.flops``).
    That one step is slowed by the counting and is excluded from timing statistics."""

    device: str | None = None
    """Device the job trains on ('cuda', 'cuda:1', 'cpu'); None = CUDA if available, else CPU."""

    sample_interval_s: float = 0.2
    """Period of the background CPU / NVML samplers, seconds. NVML's own utilization window is
    1/6 s to 1 s (NVML docs), so sampling faster than ~0.1 s adds cost without information."""

    detect_syncs: bool = True
    """On CUDA, count synchronizing calls with ``torch.cuda.set_sync_debug_mode('warn')``
    (process-global; restored on exit). Off on CPU, where there is nothing to sync."""

    trace_dir: str | None = None
    """Record a short torch.profiler trace (1 wait, 1 warm-up, ``trace_steps`` active steps,
    all excluded from the statistics) into this folder and analyse it; None = no trace."""

    trace_steps: int = 3
    """Active (recorded) steps of the trace."""

    trace_host_ops: bool = True
    """Record host operators in the trace (what ``doctor --trace`` shows). False on CUDA records
    device activity only: the profiler then adds ~µs per kernel launch instead of per operator,
    so a host-bound loop keeps its speed while its kernel busy time is read (``redline tune``)."""

    keep_loaders: bool = False
    """Keep a reference to each DataLoader seen, so it can be rebuilt with other settings
    after the run (``redline doctor --tune-loader``); off by default: it keeps datasets alive."""

    metrics_port: int | None = None
    """Serve Prometheus text-format metrics (prefix ``redline_``) on this port while the watch
    runs (0 = any free port; each process of a multi-process job uses ``port + LOCAL_RANK``);
    None = no endpoint. Needs ``redline[metrics]``. Scrapes read the step records on the
    server's thread: nothing is added to the training step."""

    metrics_address: str = "127.0.0.1"
    """Address the metrics endpoint binds to: loopback by default; '0.0.0.0' serves every
    interface (for a Prometheus server on another machine)."""

    timeline_path: str | None = None
    """Write the steps (each phase a track, per rank) and the sampled CPU/NVML counters as a
    Chrome-trace JSON file here when the report is built (rank 0 writes the job's, its ranks
    gathered through the job's store); None = no timeline. Opens in Perfetto UI."""

    steps_kept: int | None = 100_000
    """Step records kept for the report, at most (None: all). A record is ~370 bytes, so a job
    that runs for days would grow without bound: past this many, the watch keeps every other
    record and then every 2nd, 4th, ... step (a uniform sample; the report says so), while
    step counts stay exact and live metrics read every one of the last 1,024 steps."""

    stack_sample_interval_s: float | None = 0.005
    """Period of the stack sampler, seconds: while the training thread is outside every timed
    phase, its Python stack is read this often from the CPU sampler's thread and the time is
    charged to the user's line that spent it (docs/report.md, Definitions, "other"); inside a
    phase a tick only reads one list length. Ticks come every 50 ms instead (this period if it
    is longer, ``sample_interval_s`` if that is shorter) during warm-up and while under 1 % of
    the measured window's samples are outside the phases (``redline.measure.stacks``: each tick
    costs a loop that holds the GIL a thread switch). With it, garbage-collection
    pauses are timed through ``gc.callbacks``. None = neither."""

    def __post_init__(self) -> None:
        if self.steps_kept is not None and self.steps_kept < 1000:
            raise WatchConfigError(f"steps_kept must be >= 1000 or None, got {self.steps_kept}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise WatchConfigError(f"metrics_port must be 0..65535 or None, got {self.metrics_port}")
        if self.trace_steps < 1:
            raise WatchConfigError(f"trace_steps must be >= 1, got {self.trace_steps}")
        if self.warmup_steps < 0:
            raise WatchConfigError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.max_steps is not None and self.max_steps < 1:
            raise WatchConfigError(
                f"max_steps must be >= 1 (measured steps after warm-up) or None, got "
                f"{self.max_steps}"
            )
        if self.stack_sample_interval_s is not None and not (
                0.0005 <= self.stack_sample_interval_s <= 1.0):
            raise WatchConfigError("stack_sample_interval_s must be within 0.0005..1 seconds or None, "
                             f"got {self.stack_sample_interval_s}")
        if not self.sample_interval_s > 0:
            raise WatchConfigError(f"sample_interval_s must be > 0, got {self.sample_interval_s}")
