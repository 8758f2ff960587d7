"""A tuning plan in a framework's words: the keyword arguments of Lightning's ``Trainer`` and
``DataLoader``, or of Hugging Face's ``TrainingArguments``, and the lines of code for what the
framework has no setting for.

Pure functions of :class:`redline.tune.TunePlan`: each knob of the tuning path says its own
setting (:meth:`redline.tune.knob.TuneKnob.framework_args`), and neither framework is imported,
so the export runs (and is tested) where the framework is not installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkSettings:
    """What to pass to the framework to train as the plan says."""

    framework: str
    """'lightning' or 'hf'."""
    arguments: dict[str, Any]
    """Keyword arguments of ``lightning.Trainer`` or ``transformers.TrainingArguments``."""
    dataloader: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the training ``DataLoader`` (Lightning: the datamodule builds it;
    empty for HF, whose arguments hold the loader settings)."""
    code: list[str] = field(default_factory=list)
    """Lines to add to the script for plan settings the framework has no argument for."""
    effective_batch: int = 0
    """Samples per optimizer step the settings give (per process): the plan's."""

    def snippet(self) -> str:
        """The settings as Python source to paste into the script."""
        what = "L.Trainer" if self.framework == "lightning" else "TrainingArguments"
        lines = [*self.code]
        lines.append(f"{what}(" + ", ".join(f"{k}={v!r}" for k, v in self.arguments.items())
                     + ", ...)")
        if self.dataloader:
            lines.append("DataLoader(dataset, " + ", ".join(
                f"{k}={v!r}" for k, v in self.dataloader.items()) + ", ...)")
        return "\n".join(lines)


def _settings(plan: TunePlan, framework: str) -> FrameworkSettings:
    # Here, not at import: the framework callbacks import this package inside the user's
    # training process, which need not load the tuning path's knobs for that.
    from redline.tune.knob import FrameworkArgs
    from redline.tune.knobs import KNOBS

    # Every knob says its own setting in the framework's words, in path order.
    out = FrameworkArgs(framework=framework)
    for knob in KNOBS:
        knob.framework_args(plan, out)
    return FrameworkSettings(framework=framework, arguments=out.arguments,
                             dataloader=out.dataloader, code=out.code,
                             effective_batch=plan.effective_batch)


def lightning_settings(plan: TunePlan) -> FrameworkSettings:
    """``Trainer`` and ``DataLoader`` arguments (and code lines) that train as ``plan`` says:
    micro-batch × ``accumulate_grad_batches`` = the plan's effective batch.

    Args:
        plan: the tuned plan.

    Returns:
        :class:`FrameworkSettings` for Lightning: ``Trainer`` arguments (precision,
        accumulation, benchmark, DDP strategy), ``DataLoader`` arguments and code lines.
    """
    return _settings(plan, "lightning")


def hf_settings(plan: TunePlan) -> FrameworkSettings:
    """``TrainingArguments`` that train as ``plan`` says: ``per_device_train_batch_size`` ×
    ``gradient_accumulation_steps`` = the plan's effective batch.

    Args:
        plan: the tuned plan.

    Returns:
        :class:`FrameworkSettings` for Hugging Face's Trainer: the ``TrainingArguments``
        fields (batch, accumulation, precision, loader workers, compile, optimizer, DDP bucket,
        warm-up steps) and the code lines that have no field.
    """
    return _settings(plan, "hf")
