"""The micro-batch: the largest that fits the device's memory (the predictive finder,
:mod:`redline.tune.batch_finder`), the effective batch kept by gradient accumulation; searched
again once a 16-bit precision is kept (16-bit activations take about half the memory)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from redline.tune.accumulate import train_step
from redline.tune.batch_finder import BatchDoesNotFitError, BatchSearch, find_batch_size
from redline.tune.ddp import rewrap
from redline.tune.decision import Detail, KnobRecord
from redline.tune.knob import FrameworkArgs, FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.knobs.precision import PRECISION_RECORD
from redline.tune.precision import SIXTEEN_BIT, autocast_for, make_scaler
from redline.tune.samples import fresh, probe_batch, state_tensors

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


def exported_micro_batch(plan: TunePlan) -> int:
    """The micro-batch to give a framework: the plan's, or where it does not divide the
    effective batch (the plain loop's last micro-batch is then smaller), the largest one that
    does. The frameworks take one micro-batch size × a whole number of accumulation steps, and
    the effective batch is kept exactly."""
    return max(size for size in range(1, plan.micro_batch + 1)
               if plan.effective_batch % size == 0)


def largest_micro(path: TuningPath, plan: TunePlan, max_batch: int) -> tuple[BatchSearch, str]:
    """The largest micro-batch up to ``max_batch`` that fits the device's memory (the
    setup's limit; on CUDA the free memory), with the plan's precision and layout; and
    which sample the probes were built from."""
    setup = fresh(path.factory)
    device = path.device
    make, how = probe_batch(setup, device)
    autocast = autocast_for(plan.precision, device)
    scaler = make_scaler(plan.precision, device)
    model = (setup.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
             if plan.channels_last else setup.model)
    model = rewrap(model, plan.ddp)

    def step(batch_size: int) -> None:
        train_step(model, setup.optimizer, make(batch_size), batch_size, setup.loss_fn,
                   autocast=autocast, scaler=scaler)

    limit = path.memory_limit
    if limit is None and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        limit = free + torch.cuda.memory_allocated(device)
    try:
        search = find_batch_size(
            step, state=lambda: state_tensors(model, setup.optimizer),
            max_batch=max_batch, limit_bytes=limit,
            cuda_device=device if device.type == "cuda" else None,
            agree=path.agree)
    except BatchDoesNotFitError as e:
        # What `redline plan` needs to spread the model over more devices.
        e.params = sum(param.numel() for param in model.parameters() if param.requires_grad)
        e.global_batch = plan.effective_batch * path.agree.world_size
        raise
    path.log(f"  batch finder: {search.reason} ({search.trials} trials, {search.ooms} OOM; "
             f"probes use the {how})")
    return search, how


@dataclass(kw_only=True)
class BatchFields:
    """The micro-batch in the plan. Part of :class:`~redline.tune.knobs.TunePlan`."""

    micro_batch: int
    """Samples per forward/backward; ``effective_batch`` is split into micro-batches of this
    size, the last one weighted by its size."""

    def check_fields(self) -> None:
        """Raise ValueError naming the field whose value is out of range."""
        if self.micro_batch < 1:
            raise ValueError(f"micro_batch must be >= 1, got {self.micro_batch}")


BATCH_RECORD = KnobRecord(label="batch size")


class BatchKnob(TuneKnob):
    name = "batch"
    records = (BATCH_RECORD,)
    plan_fields = BatchFields
    switches = ("tune_batch",)
    heading = "2/4 batch size (effective batch kept)"
    words: ClassVar[FrameworkWords] = FrameworkWords(
        lightning=("batch_size", "accumulate_grad_batches"),
        hf=("per_device_train_batch_size", "gradient_accumulation_steps"))

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        plan, search = self._search(path, plan, again=False)
        path.batch_search = search
        return plan

    def again(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        """Once a 16-bit precision is kept, search the batch again (once): 16-bit activations
        take about half the memory, so a larger micro-batch may fit."""
        if (plan.precision not in SIXTEEN_BIT or plan.micro_batch >= plan.effective_batch
                or any(decision.knob == BATCH_RECORD.label and decision.again
                       for decision in plan.decisions)):
            return plan
        path.log("batch size, again (16-bit activations are smaller)")
        try:
            plan, search = self._search(path, plan, again=True)
        except BatchDoesNotFitError as e:
            # Autocast keeps 16-bit copies of the weights beside the fp32 ones: under a tight
            # memory budget the 16-bit step can need more than the fp32 one. The precision was
            # kept for speed on trials that do not enforce the budget; it does not fit: revert.
            kept = next(decision for decision in reversed(plan.decisions)
                        if decision.knob == PRECISION_RECORD.label and decision.kept)
            why = str(e).split(". Options")[0]
            kept.kept = False
            kept.reason += f"; reverted: {why} in {plan.precision}"
            path.log(f"  {plan.precision} reverted: {why}")
            before = next((decision.value for decision in reversed(plan.decisions)
                           if decision.knob == PRECISION_RECORD.label and decision.kept
                           and decision.value), "fp32")
            plan = dataclasses.replace(plan, precision=before)
            plan.decisions.append(BATCH_RECORD.decision(
                reason=f"not searched again: {kept.value} was reverted (its step does not fit "
                       "the memory budget)", again=True))
            return plan
        path.batch_search = search or path.batch_search
        return plan

    def _search(self, path: TuningPath, plan: TunePlan, *, again: bool,
                ) -> tuple[TunePlan, BatchSearch | None]:
        if plan.micro_batch >= plan.effective_batch:
            plan.decisions.append(BATCH_RECORD.decision(
                reason=f"the micro-batch already is the effective batch ({plan.effective_batch});"
                       " a larger one would change the optimization (set accumulation_steps in "
                       "the setup to allow a larger effective batch)", again=again))
            return plan, None
        search, how = largest_micro(path, plan, plan.effective_batch)
        details: dict[str, Detail] = {"finder": search.reason, "trials": search.trials,
                                      "ooms": search.ooms, "probe_sample": how}
        if search.batch <= plan.micro_batch:
            plan.decisions.append(BATCH_RECORD.decision(
                reason=f"the largest micro-batch that fits is {search.batch} (now "
                       f"{plan.micro_batch})", value=str(search.batch), again=again,
                details=details))
            return plan, search
        cand = dataclasses.replace(plan, micro_batch=search.batch, decisions=[])
        details["accumulation_steps"] = cand.accumulation_steps
        decision = BATCH_RECORD.decision(value=str(search.batch), again=again, details=details)
        return path.decide(plan, cand, decision), search

    def apply_data(self, parts: LoopParts) -> None:
        # The tuned loader yields effective batches; the step splits them into micro-batches.
        parts.loader_batch_size = parts.plan.effective_batch
        parts.micro_batch = parts.plan.micro_batch

    def framework_args(self, plan: TunePlan, out: FrameworkArgs) -> None:
        micro = exported_micro_batch(plan)
        if out.lightning:
            out.arguments["accumulate_grad_batches"] = plan.effective_batch // micro
        else:
            out.arguments["per_device_train_batch_size"] = micro
            out.arguments["gradient_accumulation_steps"] = plan.effective_batch // micro
        if micro != plan.micro_batch:
            out.code.append(f"# micro-batch {micro}: the largest that divides the effective "
                            f"batch {plan.effective_batch} at or below the plan's "
                            f"{plan.micro_batch}")


BATCH = BatchKnob()
