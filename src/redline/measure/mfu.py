"""MFU from counted FLOPs, and the peak it is held to (no torch import).

MFU (PaLM, arXiv 2204.02311, Appendix B): model FLOPs per second ÷ the device's peak FLOP/s for
the dtype in use. FlopCounterMode counts matmuls, convolutions and SDPA (2·m·n·k per GEMM) for
forward and backward; it does not discount causal attention and counts no recompute
(``torch.utils.flop_counter``), which is the MFU (not HFU) convention. The step rate is the
measured window's: steps ÷ their wall time, i.e. 1 ÷ the mean step time.
"""

from __future__ import annotations

from redline.core.measurements import DeviceInfo, MfuResult
from redline.measure.peaks import peak_flops


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


def fp32_with_tf32_convolutions(dev: DeviceInfo, flops: float, conv_flops: float,
                                fp32: tuple[float, str], cudnn_tf32: bool,
                                ) -> tuple[tuple[float, str], str]:
    """The peak of an fp32 step whose convolutions cuDNN runs in TF32.

    ``torch.backends.cudnn.allow_tf32`` is True by default (PyTorch docs, "TensorFloat-32 (TF32)
    on Ampere (and later) devices") while fp32 matmuls default to full fp32, so an fp32 conv net
    held to the fp32 peak alone reads an MFU far above what its kernels achieve. The peak is the
    rate at which the step's FLOPs would run if each op ran at its own dtype's peak:
    flops ÷ (conv_flops / tf32 peak + other flops / fp32 peak)."""
    cc = float(dev.compute_capability) if dev.compute_capability else 0.0
    tf32 = peak_flops(dev.name, "tf32") if cc >= 8.0 and cudnn_tf32 else None
    if tf32 is None:
        return fp32, "fp32"
    conv = min(conv_flops, flops)
    seconds_at_peak = conv / tf32[0] + (flops - conv) / fp32[0]
    share = conv / flops
    return ((flops / seconds_at_peak,
             f"{share:.0%} of the FLOPs are convolutions, run in TF32 by cuDNN "
             f"(torch.backends.cudnn.allow_tf32): {tf32[1]}; the rest at fp32: {fp32[1]}"),
            "tf32-conv+fp32")


def _compute_dtype(eff: str | None) -> str | None:
    if eff is None:
        return None
    return eff.split("-")[0]


def compute_dtype(effective_precision: str | None) -> str | None:
    """The dtype matrix units run in: 'bf16-autocast' → 'bf16'."""
    return None if effective_precision is None else effective_precision.split("-")[0]


def mfu_for(dev: DeviceInfo, effective_precision: str | None, flops: float | None,
            conv_flops: float | None, step_time_mean_s: float | None, *, counted: bool,
            flop_error: str | None = None, cudnn_tf32: bool = True) -> MfuResult:
    """MFU of a measured window: counted FLOPs ÷ mean step time ÷ the peak for the device and
    the dtype in use, or unknown with the reason.

    Args:
        dev: the device (its name selects the peak-table entry).
        effective_precision: the precision the step ran in ('fp32', 'tf32', 'bf16-autocast', …).
        flops: FLOPs of one step; None = not counted.
        conv_flops: the part of ``flops`` in convolutions; None = not counted.
        step_time_mean_s: the window's wall time ÷ its steps.
        counted: whether FLOP counting was asked for.
        flop_error: why counting failed, if it did.
        cudnn_tf32: ``torch.backends.cudnn.allow_tf32`` while the step ran.
    """
    cdt = compute_dtype(effective_precision)
    reason = None
    peak = None
    if dev.type != "cuda":
        reason = (f"no peak-FLOPs entry for {dev.type.upper()} devices: a CPU's peak depends on "
                  "cores, clocks and vector units, which redline does not model")
    elif cdt is not None:
        peak = peak_flops(dev.name, cdt)
        if peak is None:
            reason = f"no peak-FLOPs entry for {dev.name!r} at {cdt} in redline/data/peak_flops.json"
        elif cdt == "fp32" and flops and conv_flops:
            peak, cdt = fp32_with_tf32_convolutions(dev, flops, conv_flops, peak, cudnn_tf32)
    if flop_error:
        reason = flop_error
    elif not counted:
        reason = "FLOP counting was turned off (count_flops=False)"
    elif flops is None and reason is None:
        reason = "no step finished after warm-up to count FLOPs on"
    return compute_mfu(flops, step_time_mean_s, peak, cdt, reason)
