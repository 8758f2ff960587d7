"""The A/B decision policy of the path: measure a candidate plan against the current one side
by side, keep it only if it is faster by ``min_gain`` and above the noise.

The measuring function is a parameter (:data:`MeasureFn`): the path passes the real trial
(:func:`redline.tune.trial.measure` on a fresh setup); tests pass one with known speeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redline.measure.agree import RanksDivergedError
from redline.tune.config import TuneConfig
from redline.tune.decision import Decision
from redline.tune.precision import NonFiniteLossError
from redline.tune.rank_test import p_smaller, smallest_p
from redline.tune.result import TrialMetrics
from redline.tune.setup import SetupError

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan

MeasureFn = Callable[["TunePlan", str, bool], TrialMetrics]
"""``measure(plan, label, step_only)``: one trial of ``plan`` (see :func:`redline.tune.trial.
measure`; ``step_only`` times the training step alone, on batches fetched beforehand)."""


@dataclass(slots=True, kw_only=True)
class Comparison:
    """Both sides of an A/B comparison over alternating rounds."""

    current_samples_per_s: float
    candidate_samples_per_s: float
    current_step_times_s: list[float]
    candidate_step_times_s: list[float]


def one_off_pays(one_off_s: float, current_step_s: float, new_step_s: float, run_steps: int,
                 min_gain: float) -> tuple[bool, float, float]:
    """(keep, current job seconds, new job seconds incl. the one-off cost): a change that costs
    once before it pays per step (compiling, filling a cache) is kept only if the whole planned
    run of ``run_steps`` steps is ≥ ``min_gain`` shorter with it."""
    t_cur = run_steps * current_step_s
    t_new = one_off_s + run_steps * new_step_s
    return t_new <= t_cur * (1 - min_gain), t_cur, t_new


class ABPolicy:
    """Decides knob by knob; remembers the current plan's last measured speed (the compile
    knob is held to it)."""

    def __init__(self, cfg: TuneConfig, measure: MeasureFn,
                 log: Callable[[str], None] = lambda message: None) -> None:
        self.cfg, self.measure, self.log = cfg, measure, log
        self.current_tp: float | None = None
        self.current_step_only = False
        """Whether ``current_tp`` was measured on the step alone."""

    def compare(self, plan: TunePlan, candidate: TunePlan, label: str, step_only: bool,
                ) -> Comparison:
        """(current, candidate) samples/s and per-step seconds, measured alternately
        (A B A B …): a shared machine's speed drifts within minutes, so two trials far apart
        would compare the drift."""
        tot = {"a": [0.0, 0.0], "b": [0.0, 0.0]}
        times: dict[str, list[float]] = {"a": [], "b": []}
        for _ in range(self.cfg.rounds):
            for side, side_plan in (("a", plan), ("b", candidate)):
                metrics = self.measure(side_plan, label, step_only)
                if metrics.throughput_samples_per_s and metrics.step_time_s:
                    tot[side][0] += metrics.throughput_samples_per_s * metrics.steps
                    tot[side][1] += metrics.steps
                    times[side] += metrics.step_times_s
        cur = tot["a"][0] / tot["a"][1] if tot["a"][1] else 0.0
        new = tot["b"][0] / tot["b"][1] if tot["b"][1] else 0.0
        return Comparison(current_samples_per_s=cur, candidate_samples_per_s=new,
                          current_step_times_s=times["a"], candidate_step_times_s=times["b"])

    def decide(self, plan: TunePlan, candidate: TunePlan, decision: Decision, *,
               step_only: bool = True) -> TunePlan:
        """Measure ``candidate`` against ``plan`` side by side; return the one to keep, with
        ``decision`` (the knob and what was tried; ``kept`` and the numbers filled in here)
        appended to its decisions.

        ``step_only``: measure the training step alone, on batches fetched beforehand. The
        batch, precision and kernel knobs change the step, not the input; measured end to
        end, a step faster than the input pipeline can feed shows no gain (a greedy path then
        rejects every compute knob while the input is at capacity, and the input is never
        asked to go faster). The data pipeline is tuned again for the final step."""
        what = decision.label
        try:
            comparison = self.compare(plan, candidate, what, step_only)
        except (SetupError, NonFiniteLossError, RanksDivergedError):
            raise  # the job itself is broken, whatever the knob: say so, do not tune on
        except Exception as e:  # a knob that cannot run here (compile without a compiler…)
            decision.kept, decision.reason = False, f"failed: {type(e).__name__}: {e}"[:400]
            plan.decisions.append(decision)
            self.log(f"  {what}: failed ({type(e).__name__}), not kept")
            return plan
        cur, new = comparison.current_samples_per_s, comparison.candidate_samples_per_s
        # per sample: a candidate with a larger effective batch takes longer steps of more
        # samples (for every other knob both sides divide by the same batch)
        t_cur = [step_s / plan.effective_batch for step_s in comparison.current_step_times_s]
        t_new = [step_s / candidate.effective_batch for step_s in comparison.candidate_step_times_s]
        scope = "step alone" if step_only else "end to end"
        gain = bool(cur) and new >= cur * (1 + self.cfg.min_gain)
        p_value = p_smaller(t_cur, t_new)
        # End to end, loader workers deliver batches in bursts: per-step times alternate
        # between waits and none, so they are not comparable one by one; the throughput over
        # alternating rounds decides.
        testable = step_only and smallest_p(len(t_cur), len(t_new)) < self.cfg.max_p
        kept = gain and (p_value < self.cfg.max_p or not testable)
        sig = (f"Mann–Whitney p={p_value:.3g} over {len(t_cur)}+{len(t_new)} steps" if testable
               else "threshold only: per-step times are bursty end to end" if not step_only
               else f"too few steps ({len(t_cur)}+{len(t_new)}) for a significance test")
        reason = (f"{new / cur:.2f}× throughput ({scope}; {sig})" if kept else
                  f"{new:,.0f} vs {cur:,.0f} samples/s ({scope}): not ≥ "
                  f"{self.cfg.min_gain:.0%} faster" if not gain else
                  f"{new / cur:.2f}× but not above the noise ({sig} ≥ {self.cfg.max_p:g})")
        done = dataclasses.replace(decision, kept=kept, reason=reason, samples_per_s_before=cur,
                                   samples_per_s_after=new, measured=scope,
                                   p_value=p_value if testable else None)
        self.log(f"  {what}: {cur:,.0f} → {new:,.0f} samples/s ({scope}) — "
                 f"{'kept' if kept else 'not kept'}"
                 + ("" if kept or not gain else f" (not above the noise: {sig})"))
        self.current_tp = new if kept else cur
        self.current_step_only = step_only
        if kept:
            candidate.decisions = plan.decisions
            candidate.decisions.append(done)
            return candidate
        plan.decisions.append(done)
        return plan
