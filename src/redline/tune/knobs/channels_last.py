"""channels_last: the model's 4-D weights and the batches' 4-D float inputs in NHWC, which
cuDNN's fast convolutions use (NVIDIA's "Convolutional Layers User's Guide", tensor layouts);
tried only for models with a Conv2d, kept only if measured faster."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from redline.data.prefetcher import map_tensors
from redline.tune.decision import KnobRecord
from redline.tune.knob import FrameworkArgs, FrameworkWords, LoopParts, TuneKnob, TuningPath

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan

_CODE_LINE = ("none: model.to(memory_format=torch.channels_last) and the 4-D inputs too "
              "(a code line)")


def to_channels_last(batch: Any) -> Any:
    """``batch`` with its 4-D floating-point tensors in channels_last (others as they are)."""
    return map_tensors(batch, lambda tensor: tensor.contiguous(memory_format=torch.channels_last)
                       if tensor.dim() == 4 and tensor.is_floating_point() else tensor)


@dataclass(kw_only=True)
class ChannelsLastFields:
    """The memory format in the plan. Part of :class:`~redline.tune.knobs.TunePlan`."""

    channels_last: bool = False
    """The model and its 4-D inputs in NHWC memory format."""


CHANNELS_LAST_RECORD = KnobRecord(label="channels_last")


class ChannelsLastKnob(TuneKnob):
    name = "channels_last"
    records = (CHANNELS_LAST_RECORD,)
    plan_fields = ChannelsLastFields
    switches = ("tune_kernels",)
    words: ClassVar[FrameworkWords] = FrameworkWords(lightning_none=_CODE_LINE,
                                                     hf_none=_CODE_LINE)

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        if not path.conv:  # only 4-D convolutions read the layout
            return plan
        return path.decide(plan, dataclasses.replace(plan, channels_last=True, decisions=[]),
                           CHANNELS_LAST_RECORD.decision())

    def apply_model(self, parts: LoopParts) -> None:
        if parts.plan.channels_last:
            parts.model = parts.model.to(  # type: ignore[call-overload]
                memory_format=torch.channels_last)

    def apply_step(self, parts: LoopParts) -> None:
        if parts.plan.channels_last:
            parts.batch_transforms.append(to_channels_last)

    def framework_args(self, plan: TunePlan, out: FrameworkArgs) -> None:
        if plan.channels_last:
            out.code.append("model = model.to(memory_format=torch.channels_last)  # and 4-D "
                            "inputs too")

    def summary(self, plan: TunePlan) -> list[str]:
        return [f"channels_last {plan.channels_last}"]


CHANNELS_LAST = ChannelsLastKnob()
