"""Advice measured in the user's own loop: a data-starvation finding whose fix names the
DataLoader settings that were timed, with their numbers, instead of a rule of thumb.

The timing itself is done by :func:`redline.data.advise.tune_starved_loader`; this module only
writes the new finding (the original is left as it was).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from redline.core.findings import Finding
from redline.core.loader import LoaderSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredLoader:
    """DataLoader settings timed in the user's loop, against the setting it started from."""

    settings: LoaderSettings
    torch_threads: int
    """Intra-op threads of the training process chosen with them."""
    samples_per_s: float
    data_wait_fraction: float
    baseline_samples_per_s: float
    """The first setting timed (no workers)."""
    baseline_data_wait_fraction: float
    compute_s: float
    """Seconds of compute per batch the loader was timed against (the measured step)."""
    reason: str
    """Why the search stopped where it did, in numbers."""


def with_measured_loader(finding: Finding, tuned: MeasuredLoader) -> Finding:
    """A copy of ``finding`` whose fix and evidence name the measured settings.

    Args:
        finding: the data finding to annotate (left unchanged).
        tuned: the loader settings measured in the user's loop and their rates.

    Returns:
        A copy whose evidence adds the tuned workers, prefetch factor, samples/s and data-wait
        fraction (and the num_workers=0 baseline's samples/s), and whose fix names the
        DataLoader arguments and thread count.
    """
    s = tuned.settings
    kw = ", ".join(f"{k}={v!r}" for k, v in s.loader_kwargs().items())
    evidence = {**finding.evidence,
                "tuned_num_workers": s.num_workers, "tuned_prefetch_factor": s.prefetch_factor,
                "tuned_samples_per_s": round(tuned.samples_per_s, 1),
                "tuned_data_wait_fraction": round(tuned.data_wait_fraction, 4),
                "baseline_samples_per_s": round(tuned.baseline_samples_per_s, 1)}
    fix = (f"Measured in your loop (against your step's {tuned.compute_s * 1e3:.1f} ms of "
           f"compute): DataLoader(..., {kw}) and torch.set_num_threads({tuned.torch_threads})"
           f" → {tuned.samples_per_s:,.0f} samples/s, data wait "
           f"{tuned.data_wait_fraction:.0%} (with num_workers=0: "
           f"{tuned.baseline_samples_per_s:,.0f} samples/s, "
           f"{tuned.baseline_data_wait_fraction:.0%}). {tuned.reason}.")
    return dataclasses.replace(finding, evidence=evidence, fix=fix)


def with_loader_not_tuned(finding: Finding, why: str) -> Finding:
    """A copy of ``finding`` whose evidence says why the loader was not timed.

    Args:
        finding: the data finding to annotate (left unchanged).
        why: the reason the loader autotune did not run, as a clause.

    Returns:
        A copy whose evidence has ``loader_tuning`` = "not run: <why>".
    """
    return dataclasses.replace(finding, evidence={**finding.evidence,
                                                  "loader_tuning": f"not run: {why}"})
