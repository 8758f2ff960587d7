"""torch.compile, kept only if the whole planned run is shorter with its compile time
(:func:`redline.tune.decide.one_off_pays`): the compiled trial times the step alone, and so
does the eager side it is held to."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from redline.measure.agree import RanksDivergedError
from redline.tune.decide import one_off_pays
from redline.tune.decision import KnobRecord
from redline.tune.knob import FrameworkArgs, FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.precision import NonFiniteLossError
from redline.tune.setup import SetupError

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


def compile_trial(path: TuningPath, plan: TunePlan, record: KnobRecord,
                  mode: str | None = None) -> TunePlan:
    """torch.compile (``mode`` 'reduce-overhead': CUDA graphs) measured against the current
    step and amortized over the planned run; the plan to keep, its decision of kind
    ``record``."""
    name = "torch.compile" if mode is None else f"torch.compile(mode={mode!r})"
    cand = dataclasses.replace(plan, compile=True, compile_mode=mode, decisions=[])
    policy = path.policy
    start_s = time.perf_counter()
    try:
        # The first steps carry the compile; the trial's warm-up absorbs them.
        compiled = policy.measure(cand, name, True)
    except (SetupError, NonFiniteLossError, RanksDivergedError):
        raise
    except Exception as e:  # no compiler here; an operator a CUDA graph cannot capture
        plan.decisions.append(record.decision(reason=f"failed: {type(e).__name__}: {e}"[:400]))
        path.log(f"  {name}: failed ({type(e).__name__}), not kept")
        return plan
    wall = path.agree.max(time.perf_counter() - start_s, "compile trial wall time")

    if not policy.current_step_only or not policy.current_tp:
        # The compiled trial times the step alone: so must the eager side it is held to.
        policy.current_tp = policy.measure(plan, "eager", True).throughput_samples_per_s
        policy.current_step_only = True
    cur = policy.current_tp or 0.0
    new = compiled.throughput_samples_per_s or 0.0
    if not (cur and new and compiled.step_time_s):
        return plan
    eff = plan.effective_batch
    steady = wall - compiled.steps * compiled.step_time_s
    compile_s = max(0.0, steady - (max(2, path.cfg.warmup_steps) + 1) * compiled.step_time_s)
    steps = path.steps_for(plan)
    kept, t_eager, t_comp = one_off_pays(compile_s, eff / cur, eff / new, steps,
                                         path.cfg.min_gain)
    now = ("eager" if not plan.compile else
           f"compiled{'' if plan.compile_mode is None else f' ({plan.compile_mode})'}")
    decision = record.decision(
        reason=f"over {steps:,} steps: {t_comp:,.0f} s compiled (incl. {compile_s:.1f} s "
               f"compiling{'' if mode is None else ' and recording the graphs'}) vs "
               f"{t_eager:,.0f} s {now}",
        details={"compile_s": round(compile_s, 2)})
    decision.kept = kept
    decision.samples_per_s_before, decision.samples_per_s_after = cur, new
    decision.measured = "step alone"
    path.log(f"  {name}: {decision.reason} — {'kept' if kept else 'not kept'}")
    if kept:
        cand.decisions = plan.decisions
        cand.decisions.append(decision)
        policy.current_tp = new
        return cand
    plan.decisions.append(decision)
    return plan


@dataclass(kw_only=True)
class CompileFields:
    """torch.compile in the plan. Part of :class:`~redline.tune.knobs.TunePlan`."""

    compile: bool = False
    """The model through ``torch.compile`` (in the mode of ``compile_mode``)."""


COMPILE_RECORD = KnobRecord(label="torch.compile")


class CompileKnob(TuneKnob):
    name = "compile"
    records = (COMPILE_RECORD,)
    plan_fields = CompileFields
    switches = ("tune_kernels", "try_compile")
    words: ClassVar[FrameworkWords] = FrameworkWords(
        lightning_none="none: model = torch.compile(model) before fit (a code line)",
        hf=("torch_compile",))

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        return compile_trial(path, plan, COMPILE_RECORD)

    def apply_step(self, parts: LoopParts) -> None:
        if parts.plan.compile and parts.plan.compile_mode is None:
            parts.forward_model = torch.compile(parts.forward_model)

    def framework_args(self, plan: TunePlan, out: FrameworkArgs) -> None:
        if not out.lightning:
            out.arguments["torch_compile"] = plan.compile
        elif plan.compile and plan.compile_mode is None:
            out.code.append("model = torch.compile(model)  # before fit")

    def summary(self, plan: TunePlan) -> list[str]:
        return [f"compile {plan.compile}"]


COMPILE = CompileKnob()
