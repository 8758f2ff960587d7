"""How often evaluation ran inside the measured steps (the 'evaluation' phase of
:mod:`redline.measure.step_record`), for the ``evaluation_in_loop`` finding."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from redline.core.measurements import EvaluationMetrics
from redline.measure.optional import optional_section
from redline.measure.step_record import EVALUATION, StepRecord

PERIOD_MIN_EVALUATIONS = 3
"""Evaluations needed before a period is stated: two gaps that agree, not one."""

PERIOD_MIN_AGREEMENT = 0.75
"""Share of the gaps the most common one must make to be called the period (an evaluation
that ran late once, or the last one cut by the end of the run, leaves it standing)."""


@optional_section("evaluation")
def evaluation_metrics(steps: list[StepRecord]) -> EvaluationMetrics | None:
    """The measured steps' evaluations: how many steps held one, every how many steps, and
    what one cost; None where no step held any."""
    evaluating = [step for step in steps if step.phases[EVALUATION] > 0.0]
    if not evaluating:
        return None
    period: int | None = None
    if len(evaluating) >= PERIOD_MIN_EVALUATIONS:
        gaps = Counter(later.index - earlier.index for earlier, later in pairwise(evaluating))
        gap, count = gaps.most_common(1)[0]
        if count >= PERIOD_MIN_AGREEMENT * sum(gaps.values()):
            period = gap
    return EvaluationMetrics(
        steps_with_evaluation=len(evaluating),
        period_steps=period,
        mean_s_per_evaluating_step=sum(step.phases[EVALUATION] for step in evaluating) / len(evaluating),
    )
