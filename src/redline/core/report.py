"""The report: the measurements, the findings ranked, and how the run ended."""

from __future__ import annotations

from dataclasses import dataclass

from redline.core.findings import Finding
from redline.core.measurements import Measurements

SCHEMA_VERSION = "redline.report/2"
"""JSON schema id of :class:`Report` (``redline/report/schema.json``)."""

STATUSES = ("completed", "step_limit", "script_error", "interrupted", "no_steps")
"""How the measured run ended."""


@dataclass(slots=True, kw_only=True)
class TraceSummary:
    """The short profiler trace recorded by ``doctor --trace`` and what its analysis found."""

    path: str | None
    """Chrome-trace file (open it in Perfetto), None when none was written."""
    steps: int
    """Steps covered (wait + warm-up + active), excluded from the statistics."""
    device_events: int
    window_us: float | None
    idle_pct: float | None
    compute_pct: float | None
    non_compute_pct: float | None
    note: str | None
    """Why kernel-level numbers are missing (CPU-only trace, profiler error), if they are."""


@dataclass(slots=True, kw_only=True)
class RankEntry:
    """One rank of a multi-process job: where its steps went, and how it met the others at
    collectives. Times are means per measured step."""

    rank: int
    local_rank: int
    host: str
    status: str
    """How this rank's run ended (:data:`STATUSES`), or 'missing' (no report arrived)."""
    steps_measured: int
    last_step: int | None
    """Index of the last step this rank closed (for a missing rank: unknown, None)."""
    step_time_mean_s: float | None
    data_wait_s: float | None
    h2d_copy_s: float | None
    forward_s: float | None
    backward_s: float | None
    optimizer_s: float | None
    comm_s: float | None
    """Time blocked in communication: the loop's own ``torch.distributed`` calls (the 'comm'
    phase) plus DDP's gradient communication not overlapped with backward (DDP's own
    statistics); None when neither was measured."""
    comm_wait_s: float | None
    """Time this rank waited at collectives for ranks that arrived after it (from the arrival
    times of the flight recorder; overlapping waits counted once, docs/distributed.md); None
    when arrivals could not be compared."""
    transfer_s: float | None
    """``comm_s − comm_wait_s``: communication time not spent waiting for a late peer."""
    throughput_samples_per_s: float | None
    main_cpu_cores: float | None
    """CPU seconds of its process per wall second (all threads)."""
    collectives: int
    """Collectives of the measured window met on every reporting rank."""
    last_arrivals: int
    """Of those, how many this rank arrived at last."""
    lateness_s: float | None
    """Mean per step of (its arrival − the first rank's arrival): the largest in each stretch
    of collectives whose waits overlap (a step's DDP buckets), summed over stretches."""
    caused_wait_s: float | None = None
    """Mean per step of the others' wait at the collectives this rank arrived at last: the wait
    it caused (the ranks' caused waits sum to their total wait)."""
    run_delay_s: float | None = None
    """Mean per step of the time its training thread was runnable but waiting for a CPU (the
    scheduler's run delay): a rank late because other processes or threads hold its cores,
    not because it has more to do."""
    score_vs_fastest: float | None = None
    """The fastest rank's median compute per step ÷ this rank's (1: as fast; compute is
    forward + backward + optimizer less the wait at that step's collectives)."""
    score_vs_own_best: float | None = None
    """Its best 10-step median compute ÷ its last (below 1: it slowed down during the run —
    throttling, a noisy neighbour)."""
    main_thread_cpu_cores: float | None = None
    """CPU seconds of its training loop's thread alone per wall second: the step's own work,
    without its communication and other threads; None where unreadable."""
    device: str | None = None
    """The device type it trains on ('cpu', 'cuda', ...); None when its report did not say."""
    cpus_available: float | None = None
    """CPUs its process may use (affinity, cgroup quota): what the ranks on one host share."""
    device_clock_events: list[str] | None = None
    """NVML clock-event reasons seen on its GPU over the window (``hw_thermal_slowdown``,
    ``sw_power_cap``, ...); None without NVML readings."""


@dataclass(slots=True, kw_only=True)
class MergedMetric:
    """One metric across ranks."""

    median: float | None
    slowest_rank: int | None
    """The rank with the largest value."""
    spread: float | None
    """Largest − smallest."""


@dataclass(slots=True, kw_only=True)
class RanksReport:
    """The ranks of a multi-process job, side by side (only in rank 0's report)."""

    world_size: int
    missing: list[int]
    """Ranks whose report did not arrive (crashed, killed, or still running at the timeout)."""
    ranks: list[RankEntry]
    merged: dict[str, MergedMetric]
    """step_time_mean_s, data_wait_s, forward_s, backward_s, optimizer_s, comm_wait_s."""
    arrivals_source: str
    """How arrival times were read and put on one clock, or why they could not be."""
    clock_error_s: float = 0.0
    """Error bound of the clock alignment across hosts (0 on one host: one clock)."""


@dataclass(slots=True, kw_only=True)
class StepTimeline:
    """The steps one by one and the counters sampled while they ran: what the HTML report's
    timeline and device charts draw. Times are seconds from the first step's start (this rank's
    clock)."""

    phases: list[str]
    """Names of the phase columns of each step row, in order."""
    steps: list[list[object]]
    """One row per step: ``[index, start_s, duration_s, kind, samples, [phase_s, ...]]``; kind
    is ``warmup``, ``measured`` or ``excluded``; samples is null where the batch's size is
    unknown; the phases are exclusive totals within the step (seconds)."""
    counters: dict[str, list[list[float]]]
    """Sampled series by name (its unit in the name): ``[[t_s, value], ...]``."""
    steps_left_out: int = 0
    """Earliest steps not listed (the list keeps the last ``MAX_TIMELINE_STEPS``)."""
    points_stride: int = 1
    """Every how-many-th sample a counter series keeps (1: all of them)."""


MAX_TIMELINE_STEPS = 5000
"""Most step rows a report lists (about 0.5 MB of JSON); longer runs keep the last ones."""
MAX_COUNTER_POINTS = 2000
"""Most points a counter series keeps; longer series keep every k-th sample."""


@dataclass(slots=True, kw_only=True)
class Report:
    """One run's report: its measurements, ranked findings and trace summary, with where and
    how it ran (what ``redline doctor``/``watch`` write as JSON)."""

    schema: str
    redline_version: str
    torch_version: str
    created_utc: str
    command: list[str] | None
    status: str
    status_detail: str | None
    measurements: Measurements
    findings: list[Finding]
    trace: TraceSummary | None = None
    ranks: RanksReport | None = None
    """The other ranks, merged into rank 0's report of a multi-process job; None otherwise."""
    timeline: StepTimeline | None = None
    """This rank's steps one by one and its sampled counters; None where no step ran."""
