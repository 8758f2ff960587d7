"""A knob of the tuning path: one object that says everything about one setting.

A knob says when it applies (:meth:`TuneKnob.enabled`, the ``TuneConfig`` switches it
needs), how its candidates are measured and decided (:meth:`TuneKnob.run`, through the path's
A/B policy, and :meth:`TuneKnob.again` for a second visit), which fields of
:class:`~redline.tune.knobs.TunePlan` hold its setting (:attr:`TuneKnob.plan_fields`), how a
tuned loop applies it (the ``apply_*`` stages, called by :class:`~redline.tune.runtime.TunedLoop`
for every knob in path order), the Lightning and Hugging Face arguments that carry it
(:meth:`TuneKnob.framework_args`, their names in :attr:`TuneKnob.words`), and the
labels its decisions and the plan line print (:attr:`TuneKnob.records`,
:meth:`TuneKnob.summary`). One module per knob under :mod:`redline.tune.knobs`; the path is the
list :data:`redline.tune.knobs.PATH`.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch.utils.data import DataLoader

from redline.core.loader import LoaderSettings
from redline.data.cache_split import CacheSplit
from redline.data.device_decode import JpegSplit
from redline.measure.agree import Agreement
from redline.tune.batch_finder import BatchSearch
from redline.tune.config import TuneConfig
from redline.tune.decide import ABPolicy
from redline.tune.decision import Decision, KnobRecord
from redline.tune.kernels import AttentionSite
from redline.tune.precision import AutocastFactory, NumericsCheck
from redline.tune.setup import Factory, TrainSetup

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


class StepLoop(Protocol):
    """A tuned loop as a knob's trial drives it: steps on device batches, then closed."""

    def step(self, batch: Any, micro_batch: int | None = None) -> torch.Tensor: ...

    def close(self) -> None: ...


class TuningPath(Protocol):
    """What a knob's trial reads of the tuning it is part of
    (:class:`redline.tune.path.TunePath`): the setup's facts, the job, the A/B policy, and what
    the knobs found for the result."""

    factory: Factory
    cfg: TuneConfig
    log: Callable[[str], None]
    agree: Agreement
    policy: ABPolicy
    device: torch.device
    micro: int
    effective: int
    memory_limit: int | None
    run_steps: int
    conv: bool
    opt_impls: list[str]
    cache_split: CacheSplit | None
    jpeg_split: JpegSplit | None
    dataset_cached: bool
    cache_store: str | None
    batch_search: BatchSearch | None
    numerics_checks: list[NumericsCheck]
    attention_sites: list[AttentionSite]

    def steps_for(self, plan: TunePlan) -> int: ...

    def decide(self, plan: TunePlan, candidate: TunePlan, decision: Decision, *,
               step_only: bool = True) -> TunePlan: ...

    def tuned_loop(self, plan: TunePlan, setup: TrainSetup) -> StepLoop: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class FrameworkWords:
    """The framework arguments that carry a knob's setting, as plain data (no framework is
    imported here): exactly one of the names or the reason there is none, per framework."""

    lightning: tuple[str, ...] = ()
    """Keyword arguments of ``lightning.Trainer`` or of the training ``DataLoader``."""
    lightning_none: str = ""
    """Why Lightning has no argument for it (what the exported code does instead)."""
    hf: tuple[str, ...] = ()
    """Fields of ``transformers.TrainingArguments``."""
    hf_none: str = ""
    """Why ``TrainingArguments`` has no field for it (what the exported code does instead)."""


@dataclass(slots=True, kw_only=True)
class FrameworkArgs:
    """A plan in one framework's words, filled by every knob in path order
    (:meth:`TuneKnob.framework_args`; assembled by :mod:`redline.integrations.settings`)."""

    framework: str
    """'lightning' (``lightning.Trainer`` and its ``DataLoader``) or 'hf'
    (``transformers.TrainingArguments``)."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of ``lightning.Trainer`` or ``transformers.TrainingArguments``."""
    dataloader: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the training ``DataLoader`` (Lightning only)."""
    code: list[str] = field(default_factory=list)
    """Lines to add to the script for settings the framework has no argument for."""

    @property
    def lightning(self) -> bool:
        return self.framework == "lightning"


@dataclass(slots=True, kw_only=True)
class LoopParts:
    """The pieces of a tuned loop while the knobs apply a plan to them, stage by stage
    (data, model, optimizer, step): each stage runs every knob in path order."""

    plan: TunePlan
    device: torch.device
    user_loader: DataLoader[Any]
    """The loader given to ``apply_plan``: its dataset, sampler and collate are kept."""
    cache_split: CacheSplit | None
    jpeg_split: JpegSplit | None = None
    dataset: Any
    """The dataset the tuned loader reads."""
    collate_fn: Callable[[Any], Any] | None = None
    """The tuned loader's collate; None = the user's loader's."""
    loader_settings: LoaderSettings
    loader_batch_size: int
    """Samples per batch of the tuned loader (one effective batch)."""
    micro_batch: int
    """Samples per forward/backward of a step."""
    prefetch_to_device: bool = False
    model: torch.nn.Module
    """The model to train and checkpoint (channels-last, re-wrapped for DDP)."""
    forward_model: Any = None
    """What the step calls (the model, or its compiled form); the model after the model
    stage unless a knob changes it."""
    optimizer: torch.optim.Optimizer
    target_lrs: list[Any] | None = None
    """Every parameter group's scaled learning rate, where the plan scales it."""
    autocast: AutocastFactory | None = None
    scaler: Any = None
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    """Process-wide settings the loop sets, undone when it closes."""
    batch_transforms: list[Callable[[Any], Any]] = field(default_factory=list)
    """Applied to every device batch before the step, in order."""
    before_step: list[Callable[[int], None]] = field(default_factory=list)
    """Called with the number of optimizer steps taken so far, before each step."""


class TuneKnob(ABC):
    """One knob of the path (see the module docstring). Subclasses set the class attributes
    and implement :meth:`run`, and the ``apply_*`` stages that their plan fields need."""

    name: ClassVar[str]
    """The knob's module under :mod:`redline.tune.knobs`."""
    records: ClassVar[tuple[KnobRecord, ...]]
    """The kinds of decision it records, declared in its module: their labels are the ids plan
    files store and the steps the decisions table prints
    (:attr:`~redline.tune.decision.Decision.label`)."""
    plan_fields: ClassVar[type[Any] | None]
    """The dataclass of the :class:`~redline.tune.knobs.TunePlan` fields that hold its
    setting, declared in its module (None only with ``advice_only``)."""
    switches: ClassVar[tuple[str, ...]]
    """The ``TuneConfig`` booleans that must all be on for it to be tried."""
    heading: ClassVar[str | None] = None
    """Printed before its first visit (a stage of the path), or None."""
    words: ClassVar[FrameworkWords]
    advice_only: ClassVar[str] = ""
    """Why it changes no setting (a code change the user makes): reported, not applied."""

    def enabled(self, cfg: TuneConfig, path: TuningPath) -> bool:
        """Whether the path visits it in this tuning."""
        return all(getattr(cfg, switch) for switch in self.switches)

    @abstractmethod
    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        """Try it on ``plan`` and return the plan to keep, its decisions appended."""

    def again(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        """A second visit, after a later knob made it worth another look (only where the path
        lists one)."""
        raise NotImplementedError(f"the {self.name} knob has no second visit")

    def apply_data(self, parts: LoopParts) -> None:
        """Set the tuned loader's dataset, settings and batch sizes."""
        return None  # a knob that needs no change at this stage

    def apply_model(self, parts: LoopParts) -> None:
        """Change the model (before the optimizer and the step stages)."""
        return None  # a knob that needs no change at this stage

    def apply_optimizer(self, parts: LoopParts) -> None:
        """Change the optimizer or its learning rates."""
        return None  # a knob that needs no change at this stage

    def apply_step(self, parts: LoopParts) -> None:
        """Set how the step runs: the forward model, autocast, per-batch transforms, process
        settings."""
        return None  # a knob that needs no change at this stage

    def framework_args(self, plan: TunePlan, out: FrameworkArgs) -> None:
        """Add its setting to ``out`` in the framework's words (:attr:`words` names them):
        arguments where the framework has one, else lines of code."""
        return None  # a knob that changes no setting (advice only)

    def summary(self, plan: TunePlan) -> list[str]:
        """Its settings in the printed plan line ('channels_last True'), or nothing."""
        return []


APPLY_STAGES = ("apply_data", "apply_model", "apply_optimizer", "apply_step")
"""The stages of applying a plan, in the order a tuned loop runs them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Visit:
    """One entry of the path: a knob's first visit, or a second one (``again``) that also
    needs the ``TuneConfig`` switches of the stage it follows (``after``)."""

    knob: TuneKnob
    again: bool = False
    after: tuple[str, ...] = ()

    def enabled(self, cfg: TuneConfig, path: TuningPath) -> bool:
        return self.knob.enabled(cfg, path) and all(getattr(cfg, switch) for switch in self.after)
