"""Mixed precision: bf16 or fp16 autocast (fp16 with a GradScaler) and TF32 matmuls, each
checked by the numerics guard (:mod:`redline.tune.precision`) and kept only if measured
faster; a 16-bit precision that passed the guard is tried again once channels_last is kept."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redline.data.prefetcher import map_tensors
from redline.tune.decision import KnobRecord
from redline.tune.knob import FrameworkArgs, FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.precision import (
    PRECISIONS,
    SIXTEEN_BIT,
    autocast_for,
    check_numerics,
    make_scaler,
    supported,
    tf32,
    worst_check,
)
from redline.tune.samples import first_batches, fresh

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


@dataclass(kw_only=True)
class PrecisionFields:
    """The training precision in the plan. Part of :class:`~redline.tune.knobs.TunePlan`."""

    precision: str = "fp32"
    """'fp32' | 'tf32' | 'bf16' (autocast) | 'fp16' (autocast + GradScaler)."""

    def check_fields(self) -> None:
        """Raise ValueError naming the field whose value is out of range."""
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")


LIGHTNING_PRECISION = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed",
                       "fp16": "16-mixed"}
"""The plan's precision as Lightning's ``Trainer(precision=...)`` (TF32 is fp32 storage with
TF32 matmuls, set by one line of code: Lightning has no flag for it)."""
TF32_LINE = 'torch.set_float32_matmul_precision("high")  # TF32 matmuls'

PRECISION_RECORD = KnobRecord(label="precision", value_in_label=True)


class PrecisionKnob(TuneKnob):
    name = "precision"
    records = (PRECISION_RECORD,)
    plan_fields = PrecisionFields
    switches = ("tune_precision",)
    heading = "3/4 precision"
    words: ClassVar[FrameworkWords] = FrameworkWords(lightning=("precision",),
                                                     hf=("bf16", "fp16", "tf32"))

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        checks = []
        for prec, why in supported(path.device).items():
            if prec == "fp32":
                continue
            if why is not None:
                plan.decisions.append(PRECISION_RECORD.decision(reason=why, value=prec))
                continue
            setup = fresh(path.factory)
            batches = [map_tensors(batch, lambda tensor: tensor.to(path.device)) for batch in
                       first_batches(setup.loader, path.effective, path.cfg.numerics_steps)]
            check = worst_check(path.agree.run(functools.partial(
                check_numerics, setup.model, setup.optimizer, batches, plan.micro_batch,
                setup.loss_fn, precision=prec, device=path.device,
                tolerance=path.cfg.tolerance), f"numerics {prec}"))
            checks.append(check)
            path.log(f"  numerics {prec}: {check.reason}")
            if not check.passed:
                plan.decisions.append(PRECISION_RECORD.decision(reason=check.reason, value=prec))
                continue
            cand = dataclasses.replace(plan, precision=prec, decisions=[])
            plan = path.decide(plan, cand, PRECISION_RECORD.decision(value=prec,
                                                                     numerics=check.reason))
        path.numerics_checks = checks
        return plan

    def again(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        """A 16-bit precision that passed the numerics guard but was not faster in NCHW is
        tried once more with channels_last: the two knobs interact (cuDNN's fast bf16/fp16
        convolutions are NHWC; in NCHW it transposes around them — NVIDIA's "Convolutional
        Layers User's Guide", tensor layouts)."""
        if not plan.channels_last or plan.precision not in ("fp32", "tf32"):
            return plan
        refused = [earlier for earlier in plan.decisions
                   if earlier.knob == PRECISION_RECORD.label and earlier.value in SIXTEEN_BIT
                   and not earlier.kept
                   and earlier.numerics is not None and not earlier.again]
        for decision in refused:
            assert decision.value is not None
            cand = dataclasses.replace(plan, precision=decision.value, decisions=[])
            before = plan
            plan = path.decide(plan, cand, PRECISION_RECORD.decision(
                value=decision.value, again=True,
                context="channels_last", numerics=decision.numerics))
            if plan is not before:
                break
        return plan

    def apply_step(self, parts: LoopParts) -> None:
        plan, device = parts.plan, parts.device
        parts.autocast = autocast_for(plan.precision, device)
        parts.scaler = make_scaler(plan.precision, device)
        if plan.precision == "tf32" and device.type == "cuda":
            parts.stack.enter_context(tf32(True))

    def framework_args(self, plan: TunePlan, out: FrameworkArgs) -> None:
        if out.lightning:
            out.arguments["precision"] = LIGHTNING_PRECISION[plan.precision]
        else:
            out.arguments["bf16"] = plan.precision == "bf16"
            out.arguments["fp16"] = plan.precision == "fp16"
            if plan.precision == "tf32":
                out.arguments["tf32"] = True  # accepted on Ampere or later GPUs only
        if plan.precision == "tf32":
            out.code.append(TF32_LINE)

    def summary(self, plan: TunePlan) -> list[str]:
        return [plan.precision]


PRECISION = PrecisionKnob()
