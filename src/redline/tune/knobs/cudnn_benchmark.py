"""``torch.backends.cudnn.benchmark`` while the tuned loop runs: cuDNN times its convolution
algorithms for each new input shape once and keeps the fastest (PyTorch docs, "CUDA semantics:
cuDNN auto-tuner"). Tried only where cuDNN runs convolutions (a Conv2d on CUDA): elsewhere
nothing reads the flag, and a trial would only measure noise."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from redline.tune.decision import KnobRecord
from redline.tune.kernels import cudnn_benchmark, cudnn_benchmark_applies
from redline.tune.knob import FrameworkArgs, FrameworkWords, LoopParts, TuneKnob, TuningPath

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


@dataclass(kw_only=True)
class CudnnBenchmarkFields:
    """cuDNN's auto-tuner in the plan. Part of :class:`~redline.tune.knobs.TunePlan`."""

    cudnn_benchmark: bool = False
    """``torch.backends.cudnn.benchmark`` on while the tuned loop runs: cuDNN times its
    convolution algorithms for each new shape once and keeps the fastest (CUDA conv nets)."""


CUDNN_BENCHMARK_RECORD = KnobRecord(label="cudnn.benchmark")


class CudnnBenchmarkKnob(TuneKnob):
    name = "cudnn_benchmark"
    records = (CUDNN_BENCHMARK_RECORD,)
    plan_fields = CudnnBenchmarkFields
    switches = ("tune_kernels",)
    words: ClassVar[FrameworkWords] = FrameworkWords(
        lightning=("benchmark",),
        hf_none="none: torch.backends.cudnn.benchmark = True (a code line)")

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        if not cudnn_benchmark_applies(path.conv, path.device):
            return plan
        return path.decide(plan, dataclasses.replace(plan, cudnn_benchmark=True, decisions=[]),
                           CUDNN_BENCHMARK_RECORD.decision())

    def apply_step(self, parts: LoopParts) -> None:
        if parts.plan.cudnn_benchmark:
            parts.stack.enter_context(cudnn_benchmark(True))

    def framework_args(self, plan: TunePlan, out: FrameworkArgs) -> None:
        if plan.cudnn_benchmark:
            if out.lightning:
                out.arguments["benchmark"] = True
            else:
                out.code.append("torch.backends.cudnn.benchmark = True")

    def summary(self, plan: TunePlan) -> list[str]:
        return [f"cudnn.benchmark {plan.cudnn_benchmark}"]


CUDNN_BENCHMARK = CudnnBenchmarkKnob()
