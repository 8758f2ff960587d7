"""What the tuning path decided at each step, typed: which knob, what was tried, kept or not,
and the measured numbers behind it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

Detail = str | int | float | bool | None


class Knob(str, Enum):
    """The path's knobs, in the order it visits them."""

    GPU_DECODE = "GPU decode"
    DECODE_CACHE = "decode cache"
    LOADER = "data pipeline"
    BATCH = "batch size"
    BATCH_CHANGE = "effective batch"
    PRECISION = "precision"
    CHANNELS_LAST = "channels_last"
    CUDNN_BENCHMARK = "cudnn.benchmark"
    OPTIMIZER = "optimizer"
    COMPILE = "torch.compile"
    CUDA_GRAPHS = "CUDA graphs"
    SDPA = "sdpa"
    DDP_BUCKET = "DDP bucket_cap_mb"
    DDP_BUCKET_VIEW = "DDP gradient_as_bucket_view"


_VALUE_IN_LABEL = (Knob.PRECISION, Knob.OPTIMIZER, Knob.DDP_BUCKET, Knob.BATCH_CHANGE)



@dataclass(slots=True, kw_only=True)
class Decision:
    """One step of the path: a knob tried (or refused before trying) and the outcome."""

    knob: Knob
    kept: bool
    reason: str
    """Why, in words and numbers."""
    value: str | None = None
    """The setting tried: 'bf16', 'fused', a micro-batch size; None for on/off knobs."""
    again: bool = False
    """A second visit of this knob after a later change made it worth another look."""
    context: str | None = None
    """What changed since the first visit (e.g. 'channels_last'), for a second visit."""
    samples_per_s_before: float | None = None
    samples_per_s_after: float | None = None
    measured: str | None = None
    """'step alone' or 'end to end' (None when nothing was measured)."""
    p_value: float | None = None
    """One-sided Mann–Whitney p-value of the per-step times, when the test could decide."""
    numerics: str | None = None
    """The precision guard's verdict, for a precision that passed it."""
    details: dict[str, Detail] = field(default_factory=dict)
    """Knob-specific numbers (the batch finder's trials, the autotune's reason, compile time,
    the location of hand-written attention, …)."""

    @property
    def label(self) -> str:
        """The step as the table prints it, e.g. 'precision bf16 (again, channels_last)'."""
        label = self.knob.value
        if self.knob in _VALUE_IN_LABEL and self.value is not None:
            label += f" {self.value}"
        if self.again:
            label += f" (again{', ' + self.context if self.context else ''})"
        return label

    def to_dict(self) -> dict[str, Any]:
        as_dict = dataclasses.asdict(self)
        as_dict["knob"] = self.knob.value
        return {"step": self.label, **as_dict}

