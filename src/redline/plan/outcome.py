"""A plan's result made whole once: each listed candidate's "why" and job projection, and the
chosen layout's command, code and DeepSpeed config, so that every presentation (terminal,
JSON) shows the same texts and numbers and computes none of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redline.plan.emit import deepspeed_config, pytorch_snippet, torchrun_command
from redline.plan.limits import PlanInputError, whole
from redline.plan.search import Candidate, JobProjection, PlanResult, project, why


@dataclass(frozen=True, slots=True, kw_only=True)
class CandidateOutcome:
    """One listed layout with what is said of it."""

    candidate: Candidate
    """The layout, its memory and timing (from :func:`redline.plan.search`)."""
    why: str | None
    """Why this layout, as a paragraph; None when it does not fit."""
    projection: JobProjection | None
    """The whole job at its predicted step time; None when no step count was given."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanOutcome:
    """A search's result with everything its presentations show, computed once."""

    result: PlanResult
    """The ranked search."""
    steps: int | None
    """Optimizer steps of the job (for time, cost and energy); None = not projected."""
    listed: list[CandidateOutcome]
    """The fastest layouts that fit, fastest first (at most the ``top`` asked for)."""
    chosen: CandidateOutcome | None
    """The chosen (fastest) layout; None when nothing fits."""
    torchrun: str | None
    """The launch command of the chosen layout."""
    pytorch_snippet: str | None
    """The model wrapping of the chosen layout in PyTorch APIs."""
    deepspeed_config: dict[str, Any] | None
    """DeepSpeed's config for the chosen layout; None without ZeRO or without a layout."""


def _candidate(res: PlanResult, c: Candidate, steps: int | None) -> CandidateOutcome:
    return CandidateOutcome(candidate=c, why=why(res, c) if c.fits else None,
                            projection=project(res, c, steps) if steps is not None else None)


def plan_outcome(res: PlanResult, *, steps: int | None = None, top: int = 10,
                 script: str = "train.py") -> PlanOutcome:
    """Everything shown of ``res``, computed once.

    Args:
        res: the search's result.
        steps: optimizer steps of the job, for its time, cost and energy; None = none.
        top: how many of the fastest fitting layouts to list (≥ 1).
        script: the training script named in the launch command.

    Returns:
        The outcome; its ``chosen`` is None when no layout fits.

    Raises:
        PlanInputError: ``steps`` or ``top`` is not a whole number ≥ 1.
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise PlanInputError(f"`top` (layouts to list) must be a whole number >= 1, got {top!r}")
    if steps is not None:
        whole("steps", steps, what="optimizer steps of the job")
    best = res.best
    chosen = _candidate(res, best, steps) if best is not None else None
    listed = [chosen if c is best and chosen is not None else _candidate(res, c, steps)
              for c in res.ranked[:top]]
    return PlanOutcome(
        result=res, steps=steps, listed=listed, chosen=chosen,
        torchrun=torchrun_command(res.cluster, script) if best is not None else None,
        pytorch_snippet=pytorch_snippet(res.training, best.layout) if best is not None else None,
        deepspeed_config=(deepspeed_config(res.training, best.layout) if best is not None
                          else None))
