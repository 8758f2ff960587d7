"""Metrics of the most recent measured steps, read while the job runs (framework loggers, the
Prometheus endpoint).

The report's numbers come from the whole measured window after the run
(:func:`redline.measure.summary.build_measurements`); a logger wants the recent past, every few
steps, without waiting on the device. A snapshot reads only what the watch already holds: step
records, and device times whose CUDA events have completed (never a synchronization).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from redline.measure.mfu import mfu_for
from redline.measure.step_record import DATA_WAIT, PHASES, StepRecord
from redline.measure.summary import device_info, precision_info

if TYPE_CHECKING:
    from redline.measure.recorder import Recorder


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveSnapshot:
    """The last ``window_steps`` measured steps of a running watch (definitions:
    docs/report.md, "Definitions"; each here over the window only)."""

    steps_measured: int
    """Measured steps so far (warm-up and excluded steps left out)."""
    window_steps: int
    """Measured steps the other fields are over (the most recent ones)."""
    step_time_mean_s: float
    """Mean host wall time per step over the window."""
    data_wait_fraction: float
    """Σ data wait ÷ Σ step time over the window."""
    samples_per_s: float | None
    """Samples fetched ÷ wall time over the window; None when batch sizes could not be read."""
    device_busy_fraction: float | None
    """Σ device seconds ÷ Σ step time over the window's steps whose CUDA events have completed;
    None on CPU, or before any completed."""
    mfu: float | None
    """Counted FLOPs per step ÷ mean step time ÷ the device's peak at the precision in use;
    None while unknown (CPU, FLOPs not counted yet, no peak entry)."""
    phase_fractions: dict[str, float]
    """Σ exclusive seconds of each phase (:data:`~redline.measure.step_record.PHASES`, and
    ``other``: in no timed phase) ÷ Σ step time over the window."""
    steps_total: int
    """Steps closed so far, warm-up and excluded ones included."""

    def as_metrics(self, prefix: str = "redline/") -> dict[str, float]:
        """Known values as logger metrics (unit in the name); unknown ones are left out."""
        out = {
            f"{prefix}steps_measured": float(self.steps_measured),
            f"{prefix}step_time_ms": self.step_time_mean_s * 1e3,
            f"{prefix}data_wait_share": self.data_wait_fraction,
        }
        for name, value in (("samples_per_s", self.samples_per_s),
                        ("device_busy_share", self.device_busy_fraction), ("mfu", self.mfu)):
            if value is not None:
                out[f"{prefix}{name}"] = value
        return out


def live_snapshot(w: Recorder, window_steps: int = 50) -> LiveSnapshot | None:
    """The last ``window_steps`` measured steps of ``w`` (at most those among the last
    :data:`~redline.measure.timeline.RECENT_STEPS` steps); None before the first one."""
    if window_steps < 1:
        raise ValueError(f"window_steps must be >= 1, got {window_steps}")
    # The tracker's last steps, every one (the report's records may be a sample of a long
    # run): a scrape of a job a million steps long costs what one of a hundred does. list()
    # copies the deque in one step while the training thread appends to it.
    total = w.tracker.closed
    recent: list[StepRecord] = [step for step in reversed(list(w.tracker.recent))
                                if step.kind == "measured"][:window_steps]
    measured = w.measured_count
    if not recent:
        return None
    wall = sum(step.step_s for step in recent)
    if wall <= 0:
        return None
    samples = [step.samples for step in recent]
    phases = {name: sum(step.phases[k] for step in recent) / wall for k, name in enumerate(PHASES)}
    phases["other"] = max(0.0, 1.0 - sum(phases.values()))
    device_busy = None
    timer = w.cuda_timer
    if timer is not None:
        done = [(timer.device_s[step.index], step.step_s) for step in recent if step.index in timer.device_s]
        done_wall = sum(step_s for _, step_s in done)
        if done and done_wall > 0:
            device_busy = min(1.0, sum(device_s for device_s, _ in done) / done_wall)
    return LiveSnapshot(
        steps_measured=measured,
        window_steps=len(recent),
        step_time_mean_s=wall / len(recent),
        data_wait_fraction=sum(step.phases[DATA_WAIT] for step in recent) / wall,
        samples_per_s=(sum(count for count in samples if count is not None) / wall
                       if all(count is not None for count in samples) else None),
        device_busy_fraction=device_busy,
        mfu=_mfu(w, wall / len(recent)),
        phase_fractions=phases,
        steps_total=total,
    )


def _mfu(w: Recorder, step_time_mean_s: float) -> float | None:
    if w.device.type != "cuda" or w.flops.flops is None or w.inst is None:
        return None
    # One definition of MFU: the report's, over this window's mean step time.
    dev = device_info(w.device)
    res = mfu_for(dev, precision_info(w, dev).effective, w.flops.flops, w.flops.conv_flops,
                  step_time_mean_s, counted=True, cudnn_tf32=bool(torch.backends.cudnn.allow_tf32))
    return res.mfu
