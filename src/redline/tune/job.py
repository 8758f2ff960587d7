"""Trials of a multi-process job: every rank runs the trial on its own shard, in step with the
others, and all of them read the same merged row (:func:`redline.tune.result.merge_ranks`),
so every rank takes the same decision (:class:`redline.measure.agree.Agreement`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redline.measure.agree import Agreement
from redline.tune.result import TrialMetrics, merge_ranks
from redline.tune.setup import Factory
from redline.tune.trial import measure

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


def job_trial(factory: Factory, plan: TunePlan, label: str, agree: Agreement,
              **kwargs: Any) -> TrialMetrics:
    """:func:`redline.tune.trial.measure` on every rank, merged into the job's row; a trial that
    fails on one rank raises on all of them."""
    rows = agree.run(lambda: (agree.info.host, measure(factory, plan, label, agree=agree,
                                                        **kwargs)), f"trial {label}")
    return merge_ranks(rows)
