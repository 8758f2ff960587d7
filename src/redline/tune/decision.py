"""What the tuning path decided at each step, typed: which knob, what was tried, kept or not,
and the measured numbers behind it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

Detail = str | int | float | bool | None


@dataclass(frozen=True, slots=True, kw_only=True)
class KnobRecord:
    """A kind of decision a knob of the tuning path records, declared by the knob's own module
    (:attr:`redline.tune.knob.TuneKnob.records`): its id in plan files, which is also its label
    in the decisions table."""

    label: str
    """'precision', 'data pipeline', 'DDP bucket_cap_mb': unique across the path's knobs."""
    value_in_label: bool = False
    """The setting tried is part of the printed step ('precision bf16'); False where the value
    is a detail (a micro-batch size, a cache folder)."""

    def decision(self, *, reason: str = "", value: str | None = None, again: bool = False,
                 context: str | None = None, numerics: str | None = None,
                 details: dict[str, Detail] | None = None) -> Decision:
        """A decision of this kind, not kept until the path's A/B policy or the knob says so.

        Args:
            reason: why, in words and numbers ('' until measured).
            value: the setting tried, or None for on/off knobs.
            again: a second visit of the knob.
            context: what changed since the first visit, for a second one.
            numerics: the precision guard's verdict.
            details: knob-specific numbers.

        Returns:
            The :class:`Decision`.
        """
        return Decision(knob=self.label, value_in_label=self.value_in_label, kept=False,
                        reason=reason, value=value, again=again, context=context,
                        numerics=numerics, details=dict(details or {}))


@dataclass(slots=True, kw_only=True)
class Decision:
    """One step of the path: a knob tried (or refused before trying) and the outcome."""

    knob: str
    """The knob's record label ('precision'; :class:`KnobRecord`), as plan files store it."""
    value_in_label: bool = False
    """The value is part of the printed step, as the knob's record says."""
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
        label = self.knob
        if self.value_in_label and self.value is not None:
            label += f" {self.value}"
        if self.again:
            label += f" (again{', ' + self.context if self.context else ''})"
        return label

    def to_dict(self) -> dict[str, Any]:
        as_dict = dataclasses.asdict(self)
        return {"step": self.label, **as_dict}

