"""The step replayed as CUDA graphs (torch.compile's reduce-overhead mode), where the step
allows it (:func:`redline.tune.cuda_graphs.graph_refusal`); measured and amortized like
torch.compile. Off CUDA there is nothing to replay: not tried."""

from __future__ import annotations

from typing import ClassVar

import torch

from redline.data.prefetcher import map_tensors
from redline.tune.cuda_graphs import SHAPE_BATCHES, graph_blockers, graph_refusal
from redline.tune.decision import Decision, Knob
from redline.tune.knob import FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.knobs.compile import compile_trial
from redline.tune.samples import first_batches, fresh
from redline.tune.tuned import TunePlan

GRAPHS_MODE = "reduce-overhead"
"""torch.compile's mode that records the step as CUDA graphs."""


class CudaGraphsKnob(TuneKnob):
    name = "cuda_graphs"
    records = (Knob.CUDA_GRAPHS,)
    plan_fields = ("compile_mode",)
    switches = ("tune_kernels", "try_compile")
    words: ClassVar[FrameworkWords] = FrameworkWords(
        lightning_none="none: model = torch.compile(model, mode='reduce-overhead') before fit "
                       "(a code line)",
        hf=("torch_compile",))

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        if path.device.type != "cuda":
            return plan
        setup = fresh(path.factory)
        batches = first_batches(setup.loader, plan.micro_batch, SHAPE_BATCHES)
        on_device = map_tensors(batches[0], lambda tensor: tensor.to(path.device))
        why = graph_refusal(batches, graph_blockers(setup.model, on_device, setup.loss_fn))
        if why is not None:
            plan.decisions.append(Decision(knob=Knob.CUDA_GRAPHS, kept=False,
                                           reason=f"not tried: {why}"))
            path.log(f"  CUDA graphs: not tried ({why})")
            return plan
        return compile_trial(path, plan, mode=GRAPHS_MODE)

    def apply_step(self, parts: LoopParts) -> None:
        if parts.plan.compile and parts.plan.compile_mode == GRAPHS_MODE:
            parts.forward_model = torch.compile(parts.forward_model, mode=GRAPHS_MODE)

    def summary(self, plan: TunePlan) -> list[str]:
        return ["CUDA graphs"] if plan.compile and plan.compile_mode == GRAPHS_MODE else []


CUDA_GRAPHS = CudaGraphsKnob()
