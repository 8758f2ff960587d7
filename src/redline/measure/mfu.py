"""MFU from counted FLOPs (no torch import: reports and trace analysis stay light).

MFU (PaLM, arXiv 2204.02311, Appendix B): model FLOPs per second ÷ the device's peak FLOP/s for
the dtype in use. FlopCounterMode counts matmuls, convolutions and SDPA (2·m·n·k per GEMM) for
forward and backward; it does not discount causal attention and counts no recompute
(gpu_metrics_anchors.md §3), which is the MFU (not HFU) convention.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
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


def compute_mfu(
    flops_per_step: float | None,
    step_time_s: float | None,
    peak: tuple[float, str] | None,
    compute_dtype: str | None,
    unknown_reason: str | None = None,
) -> MfuResult:
    """MFU from counted FLOPs per step, the mean step time (the measured window's wall time
    over its steps: steps/s as the definition has it) and the peak-table lookup."""
    achieved = None
    if flops_per_step is not None and step_time_s:
        achieved = flops_per_step / step_time_s
    reason = unknown_reason
    if flops_per_step is None and reason is None:
        reason = "FLOPs per step were not counted"
    elif flops_per_step == 0 and reason is None:
        reason = "FlopCounterMode counted 0 FLOPs (no matmul/conv/attention ops in the step)"
    elif peak is None and reason is None:
        reason = "no peak-FLOPs entry for this device and dtype"
    mfu = None
    if achieved is not None and peak is not None and flops_per_step:
        mfu = achieved / peak[0]
        reason = None
    return MfuResult(
        flops_per_step=flops_per_step,
        achieved_flops_per_s=achieved,
        peak_flops_per_s=peak[0] if peak else None,
        compute_dtype=compute_dtype,
        mfu=mfu,
        peak_source=peak[1] if peak else None,
        reason=reason,
    )
