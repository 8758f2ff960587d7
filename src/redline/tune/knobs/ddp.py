"""A DistributedDataParallel model's gradient buckets: its bucket capacity (one candidate,
:func:`redline.tune.ddp.bucket_candidate`) and ``gradient_as_bucket_view``, each kept only when
measured faster; the tuned loop re-wraps the user's DDP model with them
(:func:`redline.tune.ddp.rewrap`). Visited only in a job of more than one process."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from redline.tune.config import TuneConfig
from redline.tune.ddp import DdpSettings, as_ddp, bucket_candidate, cannot_rewrap, rewrap
from redline.tune.decision import KnobRecord
from redline.tune.knob import FrameworkArgs, FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.samples import fresh

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


@dataclass(kw_only=True)
class DdpFields:
    """The DDP settings in the plan. Part of :class:`~redline.tune.knobs.TunePlan`."""

    ddp: DdpSettings = field(default_factory=DdpSettings)
    """DDP settings to re-wrap a DistributedDataParallel model with (ignored for others)."""


DDP_BUCKET_RECORD = KnobRecord(label="DDP bucket_cap_mb", value_in_label=True)
DDP_BUCKET_VIEW_RECORD = KnobRecord(label="DDP gradient_as_bucket_view")


class DdpKnob(TuneKnob):
    name = "ddp"
    records = (DDP_BUCKET_RECORD, DDP_BUCKET_VIEW_RECORD)
    plan_fields = DdpFields
    switches = ("tune_ddp",)
    heading = "DDP communication"
    words: ClassVar[FrameworkWords] = FrameworkWords(
        lightning=("strategy",), hf=("ddp_bucket_cap_mb",))

    def enabled(self, cfg: TuneConfig, path: TuningPath) -> bool:
        return super().enabled(cfg, path) and path.agree.world_size > 1

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        setup = fresh(path.factory)
        ddp = as_ddp(setup.model)
        if ddp is None:
            return plan
        why = cannot_rewrap(ddp)
        if why is not None:
            plan.decisions.append(DDP_BUCKET_RECORD.decision(reason=f"not tried: {why}"))
            return plan
        candidate_mb = bucket_candidate(ddp)
        view = bool(getattr(ddp, "gradient_as_bucket_view", False))
        del setup, ddp
        if candidate_mb is not None:
            bucket_mb, why = candidate_mb
            settings = dataclasses.replace(plan.ddp, bucket_cap_mb=round(bucket_mb, 4))
            plan = path.decide(plan, dataclasses.replace(plan, ddp=settings, decisions=[]),
                               DDP_BUCKET_RECORD.decision(value=f"{bucket_mb:.4g}",
                                                          details={"why": why}))
        if not view:
            settings = dataclasses.replace(plan.ddp, gradient_as_bucket_view=True)
            plan = path.decide(plan, dataclasses.replace(plan, ddp=settings, decisions=[]),
                               DDP_BUCKET_VIEW_RECORD.decision())
        return plan

    def apply_model(self, parts: LoopParts) -> None:
        parts.model = rewrap(parts.model, parts.plan.ddp)

    def framework_args(self, plan: TunePlan, out: FrameworkArgs) -> None:
        ddp = plan.ddp
        if out.lightning:
            given = {name: value for name, value in (
                ("bucket_cap_mb", ddp.bucket_cap_mb),
                ("gradient_as_bucket_view", ddp.gradient_as_bucket_view)) if value is not None}
            if given:
                out.code.append("from lightning.pytorch.strategies import DDPStrategy")
                out.arguments["strategy"] = "DDPStrategy(" + ", ".join(
                    f"{name}={value!r}" for name, value in given.items()) + ")"
            return
        if ddp.bucket_cap_mb is not None:
            out.arguments["ddp_bucket_cap_mb"] = max(1, round(ddp.bucket_cap_mb))
        if ddp.gradient_as_bucket_view:
            out.code.append("# DDP gradient_as_bucket_view=True has no TrainingArguments field: "
                            "wrap the model yourself or leave it")

    def summary(self, plan: TunePlan) -> list[str]:
        return [f"{label} {value}" for label, value in (
            ("DDP bucket_cap_mb", plan.ddp.bucket_cap_mb),
            ("DDP gradient_as_bucket_view", plan.ddp.gradient_as_bucket_view))
            if value is not None]


DDP = DdpKnob()
