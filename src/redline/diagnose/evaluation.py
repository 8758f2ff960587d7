"""evaluation_in_loop: evaluation that runs inside the training loop, between optimizer steps,
takes a measured share of the training time."""

from __future__ import annotations

from redline.core.findings import Finding, ceiling_speedup, severity_for
from redline.core.measurements import Measurements
from redline.diagnose.thresholds import EVALUATION_MIN_FRACTION


def evaluation_in_loop(m: Measurements) -> list[Finding]:
    """The 'evaluation' phase (outermost forwards with gradients disabled or in eval mode and
    no backward after them in the step) makes ≥ EVALUATION_MIN_FRACTION of the measured step
    time: its share, how often it runs, and the ceiling if it ran outside the loop."""
    f = m.fraction("evaluation")
    step = m.timing.step_time_mean_s
    if f < EVALUATION_MIN_FRACTION or step is None:
        return []
    ev = m.evaluation
    n = m.timing.steps_measured
    period = ev.period_steps if ev is not None else None
    each_s = ev.mean_s_per_evaluating_step if ev is not None else None
    steps_with = ev.steps_with_evaluation if ev is not None else None
    every_step = period == 1 or (steps_with is not None and steps_with == n)
    if every_step:
        how = "in every step"
    elif period is not None:
        how = f"every {period} steps"
    elif steps_with is not None:
        how = f"in {steps_with} of {n} measured steps"
    else:
        how = "inside the loop"
    each = f", {each_s * 1e3:.1f} ms each time" if each_s is not None and not every_step else ""
    evidence: dict[str, float | int | str | bool | None] = {
        "evaluation_fraction": round(f, 4),
        "evaluation_ms_per_step": round(f * step * 1e3, 3),
        "steps_measured": n,
        "steps_with_evaluation": steps_with,
        "period_steps": period,
        "ms_per_evaluation": None if each_s is None else round(each_s * 1e3, 3),
        "evaluation_forwards": m.counts.get("evaluation"),
    }
    if every_step:
        fix = ("Forwards without gradients (or in eval mode, with no backward after them) run "
               "in every step. If this is an evaluation, run it every k steps or in a separate "
               "process that reads the saved checkpoints; if it is a model the training needs "
               "(a teacher, a target network, a frozen encoder), freeze its parameters "
               "(module.requires_grad_(False)) so that redline counts it as training, and "
               "consider computing its outputs once and caching them.")
    else:
        half = f"every {2 * period} steps halves this share; " if period else ""
        fix = ("Evaluate less often (" + half + "or on fewer batches: a fixed subset of the "
               "validation set), or asynchronously: save a checkpoint and evaluate it in "
               "another process, on another rank or machine, while training goes on. Keep "
               "torch.inference_mode() (or no_grad) around the evaluation forwards.")
    return [Finding(
        id="evaluation_in_loop", severity=severity_for(f),
        title=f"Evaluation inside the training loop takes {f:.0%} of the step time ({how}{each})",
        evidence=evidence, ceiling_speedup=ceiling_speedup(f), fix=fix)]
