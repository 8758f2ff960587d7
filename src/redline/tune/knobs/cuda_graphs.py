"""The step replayed as CUDA graphs (torch.compile's reduce-overhead mode), where the step
allows it (:func:`redline.tune.cuda_graphs.graph_refusal`); measured and amortized like
torch.compile. Off CUDA there is nothing to replay: not tried."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from redline.data.prefetcher import map_tensors
from redline.tune.cuda_graphs import SHAPE_BATCHES, graph_blockers, graph_refusal
from redline.tune.decision import KnobRecord
from redline.tune.knob import FrameworkArgs, FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.knobs.compile import compile_trial
from redline.tune.samples import first_batches, fresh

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan

GRAPHS_MODE = "reduce-overhead"
"""torch.compile's mode that records the step as CUDA graphs."""


@dataclass(kw_only=True)
class CudaGraphsFields:
    """torch.compile's mode in the plan. Part of :class:`~redline.tune.knobs.TunePlan`."""

    compile_mode: str | None = None
    """torch.compile's mode: None (default) or 'reduce-overhead' (the step replayed as CUDA
    graphs: :mod:`redline.tune.cuda_graphs`)."""

    def check_fields(self) -> None:
        """Raise ValueError naming the field whose value is out of range."""
        if self.compile_mode not in (None, GRAPHS_MODE):
            raise ValueError(f"compile_mode must be {GRAPHS_MODE!r} or None, got "
                             f"{self.compile_mode!r}")


CUDA_GRAPHS_RECORD = KnobRecord(label="CUDA graphs")


class CudaGraphsKnob(TuneKnob):
    name = "cuda_graphs"
    records = (CUDA_GRAPHS_RECORD,)
    plan_fields = CudaGraphsFields
    switches = ("tune_kernels", "try_compile")
    words: ClassVar[FrameworkWords] = FrameworkWords(
        lightning_none="none: model = torch.compile(model, mode='reduce-overhead') before fit "
                       "(a code line)",
        hf=("torch_compile_mode",))

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        if path.device.type != "cuda":
            return plan
        setup = fresh(path.factory)
        batches = first_batches(setup.loader, plan.micro_batch, SHAPE_BATCHES)
        on_device = map_tensors(batches[0], lambda tensor: tensor.to(path.device))
        why = graph_refusal(batches, graph_blockers(setup.model, on_device, setup.loss_fn))
        if why is not None:
            plan.decisions.append(CUDA_GRAPHS_RECORD.decision(reason=f"not tried: {why}"))
            path.log(f"  CUDA graphs: not tried ({why})")
            return plan
        return compile_trial(path, plan, CUDA_GRAPHS_RECORD, mode=GRAPHS_MODE)

    def apply_step(self, parts: LoopParts) -> None:
        if parts.plan.compile and parts.plan.compile_mode == GRAPHS_MODE:
            parts.forward_model = torch.compile(parts.forward_model, mode=GRAPHS_MODE)

    def framework_args(self, plan: TunePlan, out: FrameworkArgs) -> None:
        if not (plan.compile and plan.compile_mode is not None):
            return
        if out.lightning:
            out.code.append(f"model = torch.compile(model, mode={plan.compile_mode!r})  # before "
                            "fit")
        else:
            out.arguments["torch_compile_mode"] = plan.compile_mode

    def summary(self, plan: TunePlan) -> list[str]:
        return ["CUDA graphs"] if plan.compile and plan.compile_mode == GRAPHS_MODE else []


CUDA_GRAPHS = CudaGraphsKnob()
