"""What a diagnosis says: findings (catalogue ids), the limits left after tuning, and the
Amdahl ceiling both are ranked by.

The rules that produce them live in :mod:`redline.diagnose` (one function per id, registered
against :data:`CATALOGUE`); this module only defines the shapes and the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

CATALOGUE: tuple[str, ...] = (
    "data_starvation", "cpu_preprocessing", "storage_fetch", "h2d_copy", "host_sync",
    "launch_bound", "memory_bound_kernels", "small_batch", "no_mixed_precision",
    "fp32_matmul_on_tensor_cores", "unfused_attention", "comm_not_overlapped", "straggler",
    "sync_every_microbatch", "thread_oversubscription", "shm_too_small",
    "copy_on_access_dataset", "worker_respawn", "unused_parameter_search", "small_ddp_buckets",
    "gradient_bucket_copies", "ddp_static_graph", "fetch_wait", "cpu_contention",
    "evaluation_in_loop", "checkpoint_in_loop", "logging_in_loop", "gc_pauses",
    "batches_built_in_loop", "host_work_in_loop", "periodic_stall", "memory_growth",
    "step_time_drift", "step_time_bimodal",
)
"""Stable finding ids (docs/report.md lists what each means); a report may add more."""

SEVERITIES: tuple[str, ...] = ("high", "medium", "low")
"""Most severe first."""

Evidence = dict[str, float | int | str | bool | None]


@dataclass(slots=True, kw_only=True)
class Finding:
    """One diagnosis (a :data:`CATALOGUE` id), with the numbers that triggered it."""

    id: str
    severity: str
    """'high' | 'medium' | 'low'."""
    title: str
    evidence: Evidence
    ceiling_speedup: float | None
    """step_time ÷ (step_time − removable time), removable measured (docs/report.md); None when
    the removable time cannot be measured from this data (said in ``fix``/``title``)."""
    fix: str
    rank: int | None = None
    """The rank the finding concerns in a multi-process job; None for the job as a whole or a
    single process."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limit:
    """One bottleneck left after tuning: what no knob of the path moved."""

    id: str
    """'data_bound' | 'host_bound' | 'device_bound'."""
    evidence: str
    """The measured numbers that show it."""
    next_step: str
    """What could still move it (outside the path's knobs, or at a cost the path won't pay)."""
    step_fraction: float | None = None
    """Share of the step it accounts for: the data wait, the device idle that the data wait
    does not explain, or the kernels' busy share. Limits are listed largest first."""


def ceiling_speedup(removable_fraction: float) -> float | None:
    """Amdahl ceiling of removing a measured share of step time (docs/report.md):
    step_time ÷ (step_time − removable) = 1 ÷ (1 − fraction).

    Args:
        removable_fraction: share of step time the fix would remove, 0..1 (a fraction, not
            a percentage).

    Returns:
        The ceiling speedup (×): 1.0 when the fraction is ≤ 0; None when it is ≥ 1 (no finite
        ceiling).
    """
    if removable_fraction <= 0:
        return 1.0
    if removable_fraction >= 1:
        return None  # everything is removable: no finite ceiling can be stated
    return 1.0 / (1.0 - removable_fraction)


def severity_for(fraction: float, high: float = 0.3, medium: float = 0.1) -> str:
    """Severity from the share of step time at stake.

    Args:
        fraction: share of step time at stake, 0..1.
        high: fraction at or above which the severity is "high" (default 0.3).
        medium: fraction at or above which the severity is "medium" (default 0.1).

    Returns:
        "high", "medium" or "low".
    """
    if fraction >= high:
        return "high"
    if fraction >= medium:
        return "medium"
    return "low"


def rank(findings: list[Finding]) -> list[Finding]:
    """Largest ceiling speedup first; findings without one after, by severity.

    Args:
        findings: the findings to order (left unchanged).

    Returns:
        A new list of the same findings: by ``ceiling_speedup`` descending, then those whose
        ceiling is None, each group by severity (high, medium, low, then unknown severities);
        within a severity, a finding whose evidence says its gain is unknown
        (``gain_unknown``: a lever to try and time, not a measured waste) after the others.
    """
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: (f.ceiling_speedup is None,
                                           -(f.ceiling_speedup or 0.0),
                                           order.get(f.severity, len(order)),
                                           f.evidence.get("gain_unknown") is True))
