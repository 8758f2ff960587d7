"""What still limits the tuned step, from the after-measurement: where the path ends, the user
learns which bottleneck is left and what no knob of the path can change.

One rule per bottleneck (data, host, device), each from measured numbers only, listed by the
share of the step each accounts for; where a number is unknown the rule says nothing rather
than guess.
"""

from __future__ import annotations

from dataclasses import dataclass

from redline.diagnose.thresholds import DATA_WAIT_MIN_FRACTION, SMALL_BATCH_MAX_BUSY
from redline.tune.trial import TrialMetrics

HOST_GAP_MIN = 0.1
"""The CUDA-event span exceeds the kernel-union busy by ≥ 10 points of the step: the device
idles between kernels inside the step's own work, i.e. the host does not launch fast enough
(the span brackets the work, the union counts only kernels; design §3)."""

DEVICE_BOUND_MIN_BUSY = 0.9
"""Kernels run ≥ 90 % of the step: the device is the bottleneck (the demo target, issue 5)."""


@dataclass(frozen=True, slots=True)
class Limit:
    """One bottleneck left after tuning."""

    id: str
    """'data_bound' | 'host_bound' | 'device_bound'."""
    evidence: str
    """The measured numbers that show it."""
    next_step: str
    """What could still move it (outside the path's knobs, or at a cost the path won't pay)."""
    step_fraction: float | None = None
    """Share of the step it accounts for: the data wait, the device idle that the data wait
    does not explain, or the kernels' busy share. Limits are listed largest first."""


def remaining_limits(after: TrialMetrics) -> list[Limit]:
    """The bottlenecks left in the tuned configuration (empty when nothing is known), largest
    share of the step first. Data and host can both limit one loop: the H200's tuned ResNet-50
    waited for data 7 % of each step while its kernels ran 32 % and the CUDA-event span 94 %;
    the 61 % between is the host launching kernels, the larger of the two."""
    out: list[Limit] = []
    wait = after.data_wait_fraction
    if wait is not None and wait >= DATA_WAIT_MIN_FRACTION:
        out.append(Limit(
            "data_bound",
            f"the tuned loop still waits for data {wait:.0%} of each step (≥ "
            f"{DATA_WAIT_MIN_FRACTION:.0%}) after the loader autotune",
            "the input pipeline is at its limit on these CPUs: cache the deterministic part "
            "of preprocessing (redline.data.CachedDataset), store smaller or pre-decoded "
            "samples, decode on the GPU, or give the job more CPU cores per device", wait))
    kernels, span = after.device_busy_kernels_fraction, after.device_busy_fraction
    if kernels is None:
        return out
    # The device idles (1 − kernels) of the step; the data wait explains part of it, the
    # host (launches, Python, host work between kernels) the rest.
    host_idle = 1.0 - kernels - (wait or 0.0)
    if kernels >= DEVICE_BOUND_MIN_BUSY:
        out.append(Limit(
            "device_bound",
            f"kernels run {kernels:.0%} of the step",
            "the device is the bottleneck: further gains come from the kernels themselves "
            "(MFU, fused or lower-precision kernels) or from more devices", kernels))
    elif span is not None and span - kernels >= HOST_GAP_MIN and host_idle >= HOST_GAP_MIN:
        out.append(Limit(
            "host_bound",
            f"kernels run {kernels:.0%} of the step but the step's device work spans "
            f"{span:.0%}: the device idles between kernels while the host launches them"
            + (f" ({host_idle:.0%} of the step not explained by the data wait)" if wait else ""),
            "launch overhead: capture the step in CUDA graphs (torch.compile(model, "
            "mode='reduce-overhead'), or torch.cuda.make_graphed_callables), fuse small ops "
            "(torch.compile), or raise the effective batch (more work per launch; it changes "
            "the optimization, so the path does not)", host_idle))
    elif kernels < SMALL_BATCH_MAX_BUSY and host_idle >= HOST_GAP_MIN:
        out.append(Limit(
            "host_bound",
            f"kernels run {kernels:.0%} of the step and the data wait explains "
            f"{wait or 0:.0%}: the rest is host work between the device's work (the "
            "optimizer, logging, syncs)",
            "profile a few steps (redline doctor --trace) to see the host work between "
            "kernels; move per-step host work off the critical path", host_idle))
    return sorted(out, key=lambda lim: -(lim.step_fraction or 0.0))
