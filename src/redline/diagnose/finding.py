"""Finding ids (design §4), severities and the ceiling-speedup formula."""

from __future__ import annotations

CATALOGUE: tuple[str, ...] = (
    "data_starvation", "cpu_preprocessing", "storage_fetch", "h2d_copy", "host_sync",
    "launch_bound", "memory_bound_kernels", "small_batch", "no_mixed_precision",
    "fp32_matmul_on_tensor_cores", "unfused_attention", "comm_not_overlapped", "straggler",
    "sync_every_microbatch", "thread_oversubscription", "shm_too_small",
    "copy_on_access_dataset", "worker_respawn",
)
"""Stable finding ids; a report may add more."""

SEVERITY_RANK = {"high": 0, "medium": 1, "low": 2}


def ceiling_speedup(removable_fraction: float) -> float | None:
    """Amdahl ceiling of removing a measured share of step time (design §3):
    step_time ÷ (step_time − removable) = 1 ÷ (1 − fraction)."""
    if removable_fraction <= 0:
        return 1.0
    if removable_fraction >= 1:
        return None  # everything is removable: no finite ceiling can be stated
    return 1.0 / (1.0 - removable_fraction)


def severity_for(fraction: float, high: float = 0.3, medium: float = 0.1) -> str:
    """Severity from the share of step time at stake."""
    if fraction >= high:
        return "high"
    if fraction >= medium:
        return "medium"
    return "low"
