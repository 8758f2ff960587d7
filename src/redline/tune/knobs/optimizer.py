"""The optimizer's fused or foreach implementation (the first its class offers that measures
faster), switched in place on the user's optimizer before its first step: whatever refers to
it (a learning-rate scheduler, a GradScaler, checkpoint code) goes on driving the optimizer that
steps."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from redline.tune.decision import KnobRecord
from redline.tune.knob import FrameworkArgs, FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.tuned import TunePlanError

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


def rebuild_optimizer(optimizer: torch.optim.Optimizer, impl: str | None) -> torch.optim.Optimizer:
    """``optimizer`` switched, in place, to its ``fused=True`` or ``foreach=True``
    implementation (returned: the same object). Kept the same object so that what refers to
    it — a learning-rate scheduler, a GradScaler, the loop's own checkpoint code — goes on
    driving the optimizer that steps. Only before the first step: there is no state to carry.

    Raises:
        TunePlanError: the optimizer already holds state, or its class has no such
            implementation (or refuses it for these parameters: a probe built over the same
            parameter groups says why).
    """
    if impl is None:
        return optimizer
    if optimizer.state:
        raise TunePlanError(
            f"the plan switches the optimizer to its {impl} implementation and this "
            f"{type(optimizer).__name__} has already stepped (it holds state, kept per "
            "implementation): call apply_plan before the first optimizer step")
    accepted = inspect.signature(type(optimizer).__init__).parameters
    if impl not in accepted or impl not in optimizer.defaults:
        raise TunePlanError(f"{type(optimizer).__name__} has no {impl!r} implementation: set "
                        "optimizer_impl to null in the plan")
    groups = [{key: value for key, value in group.items() if key not in ("fused", "foreach")}
              for group in optimizer.param_groups]
    # defaults may hold entries the constructor does not take (AdamW's decoupled_weight_decay)
    defaults = {key: value for key, value in optimizer.defaults.items()
                if key in accepted and key not in ("fused", "foreach", "differentiable")}
    defaults[impl] = True
    if impl == "fused":
        defaults["foreach"] = None
    try:
        # the constructor validates the implementation for these parameters; its flags are
        # then what the step reads (each group's "fused"/"foreach" and a few attributes)
        probe = type(optimizer)(groups, **defaults)
    except (RuntimeError, ValueError, TypeError) as e:
        raise TunePlanError(f"{type(optimizer).__name__} refuses {impl}=True here ({e}): set "
                        "optimizer_impl to null in the plan") from None
    for group, probe_group in zip(optimizer.param_groups, probe.param_groups, strict=True):
        group["fused"], group["foreach"] = probe_group.get("fused"), probe_group.get("foreach")
    optimizer.defaults.update({key: probe.defaults.get(key) for key in ("fused", "foreach")})
    for key, value in vars(probe).items():
        if isinstance(value, bool) and key.startswith("_"):  # _step_supports_amp_scaling, ...
            setattr(optimizer, key, value)
    return optimizer


@dataclass(kw_only=True)
class OptimizerFields:
    """The optimizer's implementation in the plan. Part of :class:`~redline.tune.knobs.TunePlan`."""

    optimizer_impl: str | None = None
    """'fused' | 'foreach' | None (the optimizer as built)."""

    def check_fields(self) -> None:
        """Raise ValueError naming the field whose value is out of range."""
        if self.optimizer_impl not in (None, "fused", "foreach"):
            raise ValueError(f"optimizer_impl must be 'fused', 'foreach' or None, got "
                             f"{self.optimizer_impl!r}")


OPTIMIZER_RECORD = KnobRecord(label="optimizer", value_in_label=True)


class OptimizerKnob(TuneKnob):
    name = "optimizer"
    records = (OPTIMIZER_RECORD,)
    plan_fields = OptimizerFields
    switches = ("tune_kernels",)
    words: ClassVar[FrameworkWords] = FrameworkWords(
        lightning_none="none: build the optimizer with fused=True or foreach=True in "
                       "configure_optimizers (a code comment)",
        hf=("optim",))

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        for impl in path.opt_impls:  # fused first: the first kept ends the knob
            before = plan
            plan = path.decide(plan, dataclasses.replace(plan, optimizer_impl=impl, decisions=[]),
                               OPTIMIZER_RECORD.decision(value=impl))
            if plan is not before:
                break
        return plan

    def apply_optimizer(self, parts: LoopParts) -> None:
        parts.optimizer = rebuild_optimizer(parts.optimizer, parts.plan.optimizer_impl)

    def framework_args(self, plan: TunePlan, out: FrameworkArgs) -> None:
        if plan.optimizer_impl is None:
            return
        if out.lightning:
            out.code.append(f"# in configure_optimizers: build the optimizer with "
                            f"{plan.optimizer_impl}=True")
        elif plan.optimizer_impl == "fused":
            out.arguments["optim"] = "adamw_torch_fused"  # the Trainer's own AdamW, fused

    def summary(self, plan: TunePlan) -> list[str]:
        return [f"optimizer {plan.optimizer_impl or 'as built'}"]


OPTIMIZER = OptimizerKnob()
