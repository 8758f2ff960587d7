"""``torch.backends.cudnn.benchmark`` while the tuned loop runs: cuDNN times its convolution
algorithms for each new input shape once and keeps the fastest (PyTorch docs, "CUDA semantics:
cuDNN auto-tuner"). Tried only where cuDNN runs convolutions (a Conv2d on CUDA): elsewhere
nothing reads the flag, and a trial would only measure noise."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from redline.tune.decision import Decision, Knob
from redline.tune.kernels import cudnn_benchmark, cudnn_benchmark_applies
from redline.tune.knob import FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.tuned import TunePlan


class CudnnBenchmarkKnob(TuneKnob):
    name = "cudnn_benchmark"
    records = (Knob.CUDNN_BENCHMARK,)
    plan_fields = ("cudnn_benchmark",)
    switches = ("tune_kernels",)
    words: ClassVar[FrameworkWords] = FrameworkWords(
        lightning=("benchmark",),
        hf_none="none: torch.backends.cudnn.benchmark = True (a code line)")

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        if not cudnn_benchmark_applies(path.conv, path.device):
            return plan
        return path.decide(plan, dataclasses.replace(plan, cudnn_benchmark=True, decisions=[]),
                           Decision(knob=Knob.CUDNN_BENCHMARK, kept=False, reason=""))

    def apply_step(self, parts: LoopParts) -> None:
        if parts.plan.cudnn_benchmark:
            parts.stack.enter_context(cudnn_benchmark(True))

    def summary(self, plan: TunePlan) -> list[str]:
        return [f"cudnn.benchmark {plan.cudnn_benchmark}"]


CUDNN_BENCHMARK = CudnnBenchmarkKnob()
