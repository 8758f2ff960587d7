"""A larger effective batch, the learning rate rescaled by its optimizer's rule
(:mod:`redline.tune.batch_change`): only with ``allow_batch_change``; checked against the
user's batch over the same samples, then kept only if measured faster. The tuned loop scales
every group's rate and reaches it over the plan's linear warm-up."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redline.tune.batch_change import GUARD_STEPS, MAX_GROWTH, check_batch_change, lr_rule
from redline.tune.decision import Detail, KnobRecord
from redline.tune.knob import FrameworkArgs, FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.knobs.batch import largest_micro
from redline.tune.samples import first_batches, fresh

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


def lr_factor(plan: TunePlan, step: int) -> float:
    """The share of the scaled learning rate at optimizer step ``step`` (from 0): it rises
    linearly from the user's rate (1 / lr_scale) to 1 over the plan's warm-up."""
    warmup, scale = plan.lr_warmup_steps, plan.lr_scale
    return 1.0 if step >= warmup else (1 + (scale - 1) * step / warmup) / scale


@dataclass(kw_only=True)
class BatchChangeFields:
    """The effective batch and its learning-rate rule in the plan. Part of
    :class:`~redline.tune.knobs.TunePlan`."""

    effective_batch: int
    """Samples per optimizer step: the user's, unless the tuning was allowed to change it."""
    lr_scale: float = 1.0
    """Every parameter group's learning rate × this (1: unchanged). Other than 1 only where
    the effective batch was allowed to change (``redline tune --allow-batch-change``)."""
    lr_rule: str | None = None
    """The rule behind ``lr_scale``: 'linear' (SGD) or 'sqrt' (adaptive optimizers)."""
    lr_warmup_steps: int = 0
    """Optimizer steps over which the rate rises linearly from the user's to the scaled one."""
    user_effective_batch: int | None = None
    """The user's effective batch where the plan changed it (else None: unchanged)."""

    def check_fields(self) -> None:
        """Raise ValueError naming the field whose value is out of range."""
        if not self.lr_scale > 0 or self.lr_warmup_steps < 0:
            raise ValueError(f"need lr_scale > 0 and lr_warmup_steps >= 0, got {self.lr_scale} "
                             f"and {self.lr_warmup_steps}")
        if self.lr_rule not in (None, "linear", "sqrt"):
            raise ValueError(f"lr_rule must be 'linear', 'sqrt' or None, got {self.lr_rule!r}")


BATCH_CHANGE_RECORD = KnobRecord(label="effective batch", value_in_label=True)


class BatchChangeKnob(TuneKnob):
    name = "batch_change"
    records = (BATCH_CHANGE_RECORD,)
    plan_fields = BatchChangeFields
    switches = ("tune_batch", "allow_batch_change")
    heading = "effective batch (allowed to change: `allow_batch_change`)"
    words: ClassVar[FrameworkWords] = FrameworkWords(
        lightning=("batch_size", "accumulate_grad_batches"),
        hf=("per_device_train_batch_size", "gradient_accumulation_steps", "warmup_steps"))

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        setup = fresh(path.factory)
        rule = lr_rule(setup.optimizer)
        if rule is None:
            plan.decisions.append(BATCH_CHANGE_RECORD.decision(
                reason=f"not tried: {type(setup.optimizer).__name__} has no stated "
                       "learning-rate rule here (linear for SGD, square root for the Adam "
                       "family)"))
            return plan
        eff = plan.effective_batch
        search, _ = largest_micro(path, plan, MAX_GROWTH * eff)
        ratio = search.batch // eff
        if ratio < 2:
            plan.decisions.append(BATCH_CHANGE_RECORD.decision(
                reason=f"the largest micro-batch that fits is {search.batch}: no multiple of "
                       f"the effective batch {eff} above it fits in memory"))
            return plan
        # on the host, moved one step at a time: up to 8 × 8 + 1 effective batches
        batches = first_batches(setup.loader, eff, GUARD_STEPS * ratio + 1)
        refused: list[str] = []
        while True:  # the largest ratio the guard passes, halving from what memory allows
            to_batch, scale = ratio * eff, rule.scale(ratio)
            checks = path.agree.run(functools.partial(
                check_batch_change, setup.model, setup.optimizer, batches[:GUARD_STEPS * ratio],
                heldout=batches[-1], effective=eff, ratio=ratio, micro=plan.micro_batch,
                to_micro=to_batch, loss_fn=setup.loss_fn, lr_scale=scale,
                min_progress=path.cfg.tolerance.batch_change_min_progress,
                device=path.device),
                f"batch change to {to_batch}")
            check = next((rank_check for rank_check in checks if not rank_check.passed), checks[0])
            path.log(f"  effective batch {to_batch}: {check.reason}")
            if check.passed or ratio // 2 < 2:
                break
            refused.append(f"{to_batch}: {check.progress:.0%} of the user's progress")
            ratio //= 2
        details: dict[str, Detail] = {
            "from_batch": eff, "lr_rule": rule.name, "lr_rule_source": rule.source,
            "lr_scale": round(scale, 4), "guard": check.reason,
            "refused_larger": "; ".join(refused) or None}
        if not check.passed:
            plan.decisions.append(BATCH_CHANGE_RECORD.decision(
                reason=check.reason, value=str(to_batch), details=details))
            return plan
        cand = dataclasses.replace(
            plan, effective_batch=to_batch, micro_batch=to_batch, lr_scale=scale, lr_rule=rule.name,
            user_effective_batch=eff, decisions=[])
        steps = path.steps_for(cand)  # the same samples in fewer, larger steps
        cand.lr_warmup_steps = rule.warmup_steps(steps)
        details["lr_warmup_steps"] = cand.lr_warmup_steps
        kept = path.decide(plan, cand, BATCH_CHANGE_RECORD.decision(
            value=str(to_batch), numerics=check.reason, details=details))
        if kept is cand:
            cand.notes.append(
                f"The optimization changed: effective batch {eff} → {to_batch} (the tuning was "
                f"allowed to change it), learning rate × {scale:.3g} ({rule.name} rule, "
                f"{rule.source})" + (f", reached over {cand.lr_warmup_steps:,} warm-up steps"
                                     if cand.lr_warmup_steps else "")
                + f"; the same samples take {steps:,} steps instead of {path.run_steps:,}. "
                "Validate before adopting it: train it to your usual end and compare the "
                "validation loss and metrics with your baseline's; build learning-rate "
                "schedulers after apply_plan (they read the rates it sets), or pass those "
                "built before: apply_plan(..., schedulers=[scheduler]).")
        return kept

    def apply_optimizer(self, parts: LoopParts) -> None:
        plan = parts.plan
        if plan.lr_scale == 1.0:
            return
        # a larger effective batch: the scaled rates, reached over the plan's warm-up
        groups = parts.optimizer.param_groups
        targets = [group["lr"] * plan.lr_scale for group in groups]
        parts.target_lrs = targets

        def warm(steps_taken: int) -> None:
            if steps_taken > plan.lr_warmup_steps:
                return
            share = lr_factor(plan, steps_taken)
            for group, target in zip(groups, targets, strict=True):
                group["lr"] = target * share

        warm(0)
        parts.before_step.append(warm)

    def framework_args(self, plan: TunePlan, out: FrameworkArgs) -> None:
        if plan.lr_warmup_steps and not out.lightning:
            out.arguments["warmup_steps"] = plan.lr_warmup_steps
        if plan.user_effective_batch:
            out.code.append(
                f"# the effective batch changed {plan.user_effective_batch} → "
                f"{plan.effective_batch} (the tuning was allowed to change it): learning rate × "
                f"{plan.lr_scale:.4g} ({plan.lr_rule} rule)"
                + (f", a linear warm-up from your rate over {plan.lr_warmup_steps} steps"
                   if plan.lr_warmup_steps else "")
                + "; validate against your baseline before adopting it")


BATCH_CHANGE = BatchChangeKnob()
