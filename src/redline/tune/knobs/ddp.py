"""A DistributedDataParallel model's gradient buckets: its bucket capacity (one candidate,
:func:`redline.tune.ddp.bucket_candidate`) and ``gradient_as_bucket_view``, each kept only when
measured faster; the tuned loop re-wraps the user's DDP model with them
(:func:`redline.tune.ddp.rewrap`). Visited only in a job of more than one process."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from redline.tune.config import TuneConfig
from redline.tune.ddp import as_ddp, bucket_candidate, cannot_rewrap, rewrap
from redline.tune.decision import Decision, Knob
from redline.tune.knob import FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.samples import fresh
from redline.tune.tuned import TunePlan


class DdpKnob(TuneKnob):
    name = "ddp"
    records = (Knob.DDP_BUCKET, Knob.DDP_BUCKET_VIEW)
    plan_fields = ("ddp",)
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
            plan.decisions.append(Decision(knob=Knob.DDP_BUCKET, kept=False,
                                           reason=f"not tried: {why}"))
            return plan
        candidate_mb = bucket_candidate(ddp)
        view = bool(getattr(ddp, "gradient_as_bucket_view", False))
        del setup, ddp
        if candidate_mb is not None:
            bucket_mb, why = candidate_mb
            settings = dataclasses.replace(plan.ddp, bucket_cap_mb=round(bucket_mb, 4))
            plan = path.decide(plan, dataclasses.replace(plan, ddp=settings, decisions=[]),
                               Decision(knob=Knob.DDP_BUCKET, kept=False, reason="",
                                        value=f"{bucket_mb:.4g}", details={"why": why}))
        if not view:
            settings = dataclasses.replace(plan.ddp, gradient_as_bucket_view=True)
            plan = path.decide(plan, dataclasses.replace(plan, ddp=settings, decisions=[]),
                               Decision(knob=Knob.DDP_BUCKET_VIEW, kept=False, reason=""))
        return plan

    def apply_model(self, parts: LoopParts) -> None:
        parts.model = rewrap(parts.model, parts.plan.ddp)

    def summary(self, plan: TunePlan) -> list[str]:
        return [f"{label} {value}" for label, value in (
            ("DDP bucket_cap_mb", plan.ddp.bucket_cap_mb),
            ("DDP gradient_as_bucket_view", plan.ddp.gradient_as_bucket_view))
            if value is not None]


DDP = DdpKnob()
