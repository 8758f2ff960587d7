"""What still limits a tuned step: where the tuning path ends, the user learns which
bottleneck is left and what no knob of the path can change.

One rule per bottleneck (data, host, device), each from measured numbers only, listed by the
share of the step each accounts for; where a number is unknown the rule says nothing rather
than guess.
"""

from __future__ import annotations

from redline.core.findings import Limit
from redline.diagnose.thresholds import (
    DATA_WAIT_MIN_FRACTION,
    DEVICE_BOUND_MIN_BUSY,
    HOST_GAP_MIN,
    SMALL_BATCH_MAX_BUSY,
)


def remaining_limits(data_wait_fraction: float | None, kernels_busy_fraction: float | None,
                     span_fraction: float | None) -> list[Limit]:
    """The bottlenecks left in a tuned configuration, largest share of the step first.

    Args:
        data_wait_fraction: share of the step the loop waits for data.
        kernels_busy_fraction: union of kernel intervals ÷ the traced window (CUDA).
        span_fraction: CUDA-event span ÷ step time (an upper bound of busy).

    Data and host can both limit one loop: a step that waits for data 7 % of the time while its
    kernels run 32 % and its CUDA-event span 94 % spends the 61 % between launching kernels, the
    larger of the two.

    Each fraction is 0..1; None = not measured (no kernel fraction: only the data limit is
    judged).

    Returns:
        The limits found ("data_bound", "device_bound", "host_bound"), largest
        ``step_fraction`` first; empty when none crosses its threshold.
    """
    out: list[Limit] = []
    wait = data_wait_fraction
    if wait is not None and wait >= DATA_WAIT_MIN_FRACTION:
        out.append(Limit(
            id="data_bound",
            evidence=f"the tuned loop still waits for data {wait:.0%} of each step (≥ "
            f"{DATA_WAIT_MIN_FRACTION:.0%}) after the loader autotune",
            next_step="the input pipeline is at its limit on these CPUs: cache the deterministic part "
            "of preprocessing (redline.data.CachedDataset), store smaller or pre-decoded "
            "samples, decode on the GPU, or give the job more CPU cores per device", step_fraction=wait))
    kernels, span = kernels_busy_fraction, span_fraction
    if kernels is None:
        return out
    # The device idles (1 − kernels) of the step; the data wait explains part of it, the
    # host (launches, Python, host work between kernels) the rest.
    host_idle = 1.0 - kernels - (wait or 0.0)
    if kernels >= DEVICE_BOUND_MIN_BUSY:
        out.append(Limit(
            id="device_bound",
            evidence=f"kernels run {kernels:.0%} of the step",
            next_step="the device is the bottleneck: further gains come from the kernels themselves "
            "(MFU, fused or lower-precision kernels) or from more devices", step_fraction=kernels))
    elif span is not None and span - kernels >= HOST_GAP_MIN and host_idle >= HOST_GAP_MIN:
        out.append(Limit(
            id="host_bound",
            evidence=f"kernels run {kernels:.0%} of the step but the step's device work spans "
            f"{span:.0%}: the device idles between kernels while the host launches them"
            + (f" ({host_idle:.0%} of the step not explained by the data wait)" if wait else ""),
            next_step="launch overhead: capture the step in CUDA graphs (torch.compile(model, "
            "mode='reduce-overhead'), or torch.cuda.make_graphed_callables), fuse small ops "
            "(torch.compile), or raise the effective batch (more work per launch; it changes "
            "the optimization, so the path does not)", step_fraction=host_idle))
    elif kernels < SMALL_BATCH_MAX_BUSY and host_idle >= HOST_GAP_MIN:
        out.append(Limit(
            id="host_bound",
            evidence=f"kernels run {kernels:.0%} of the step and the data wait explains "
            f"{wait or 0:.0%}: the rest is host work between the device's work (the "
            "optimizer, logging, syncs)",
            next_step="profile a few steps (redline doctor --trace) to see the host work between "
            "kernels; move per-step host work off the critical path", step_fraction=host_idle))
    return sorted(out, key=lambda lim: -(lim.step_fraction or 0.0))
