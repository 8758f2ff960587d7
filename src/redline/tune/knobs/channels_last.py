"""channels_last: the model's 4-D weights and the batches' 4-D float inputs in NHWC, which
cuDNN's fast convolutions use (NVIDIA's "Convolutional Layers User's Guide", tensor layouts);
tried only for models with a Conv2d, kept only if measured faster."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from redline.data.prefetcher import map_tensors
from redline.tune.decision import Decision, Knob
from redline.tune.knob import FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.tuned import TunePlan

_CODE_LINE = ("none: model.to(memory_format=torch.channels_last) and the 4-D inputs too "
              "(a code line)")


def to_channels_last(batch: Any) -> Any:
    """``batch`` with its 4-D floating-point tensors in channels_last (others as they are)."""
    return map_tensors(batch, lambda tensor: tensor.contiguous(memory_format=torch.channels_last)
                       if tensor.dim() == 4 and tensor.is_floating_point() else tensor)


class ChannelsLastKnob(TuneKnob):
    name = "channels_last"
    records = (Knob.CHANNELS_LAST,)
    plan_fields = ("channels_last",)
    switches = ("tune_kernels",)
    words: ClassVar[FrameworkWords] = FrameworkWords(lightning_none=_CODE_LINE,
                                                     hf_none=_CODE_LINE)

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        if not path.conv:  # only 4-D convolutions read the layout
            return plan
        return path.decide(plan, dataclasses.replace(plan, channels_last=True, decisions=[]),
                           Decision(knob=Knob.CHANNELS_LAST, kept=False, reason=""))

    def apply_model(self, parts: LoopParts) -> None:
        if parts.plan.channels_last:
            parts.model = parts.model.to(  # type: ignore[call-overload]
                memory_format=torch.channels_last)

    def apply_step(self, parts: LoopParts) -> None:
        if parts.plan.channels_last:
            parts.batch_transforms.append(to_channels_last)

    def summary(self, plan: TunePlan) -> list[str]:
        return [f"channels_last {plan.channels_last}"]


CHANNELS_LAST = ChannelsLastKnob()
