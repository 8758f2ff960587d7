"""What a tuned plan is made for and what the path recorded (:class:`PlanCore`, :class:`PlanKey`;
the plan, :class:`~redline.tune.knobs.TunePlan`, adds every knob's fields; its files and store
are :mod:`redline.tune.plan_store`): what ``redline tune`` decided, remembered per model and
machine. (The parallelism planner, ``redline plan``, is :mod:`redline.plan`.)

A plan is keyed by the model's signature (class and parameter names, shapes and dtypes), the
device (type and name), the precision the user trained in and the input shapes (per sample):
the same script on the same GPU reuses its plan; another model, GPU or sequence length does
not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import warnings
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from redline.core.errors import RedlineError
from redline.core.typed_json import from_json
from redline.tune.decision import Decision

PLAN_SCHEMA = "redline.plan/2"
"""Version 2 embeds the DataLoader settings (``loader``) and types the decisions."""


class TunePlanError(RedlineError, ValueError):
    """A plan file that cannot be used; the message names the file and the field."""


class TunePlanMismatchError(TunePlanError):
    """A plan applied to a model, device or inputs it was not made for."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanKey:
    model_signature: str
    """sha256 (first 16 hex) of the model class and its parameters' names, shapes, dtypes."""
    model_class: str
    device: str
    """Device type and name, e.g. 'cuda:NVIDIA H100 80GB HBM3' or 'cpu:x86_64'."""
    precision: str
    """The precision the user's configuration trained in (before tuning)."""
    input_shapes: str
    """Per-sample shapes and dtypes of the batch, e.g. '(3,96,96):float32|():int64'."""
    world_size: int = 1
    """Processes of the job the plan was made for (``WORLD_SIZE``): its batch sizes are per
    rank, its loader workers a share of each host's CPUs, its DDP settings measured with that
    many peers."""

    def digest(self) -> str:
        parts = [self.model_signature, self.device, self.precision, self.input_shapes]
        if self.world_size != 1:  # single-process digests stay those of earlier plans
            parts.append(f"world{self.world_size}")
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


_Plan = TypeVar("_Plan", bound="PlanCore")


@dataclass(kw_only=True)
class PlanCore:
    """The fields of a :class:`~redline.tune.knobs.TunePlan` that no knob owns: what the plan
    was made for and what the path recorded. The knobs' fields come from their own modules
    (each knob's ``plan_fields``), and :class:`~redline.tune.knobs.TunePlan` joins them."""

    key: PlanKey
    source_batch_size: int | None = None
    """The DataLoader batch size of the configuration the plan was made from (its effective
    batch is this × the accumulation steps): :func:`redline.tune.apply_plan` refuses a loader
    of another batch size, which would change the effective batch without saying so."""
    schema: str = PLAN_SCHEMA
    decisions: list[Decision] = field(default_factory=list)
    """One entry per step of the path: what was tried, measured numbers, kept or why not."""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Every class of the plan checks its own fields (``check_fields``), the knobs' included.
        for cls in reversed(type(self).__mro__):
            check = cls.__dict__.get("check_fields")
            if check is not None:
                check(self)

    def check_fields(self) -> None:
        """Raise ValueError naming the field whose value is out of range."""
        if self.source_batch_size is not None and self.source_batch_size < 1:
            raise ValueError(f"source_batch_size must be >= 1 or None, got "
                             f"{self.source_batch_size}")
        if self.schema != PLAN_SCHEMA:
            raise ValueError(f"schema must be {PLAN_SCHEMA!r}, got {self.schema!r}")

    def to_dict(self) -> dict[str, Any]:
        as_dict = dataclasses.asdict(self)
        as_dict["decisions"] = [decision.to_dict() for decision in self.decisions]
        return as_dict

    @classmethod
    def from_dict(cls: type[_Plan], data: dict[str, Any]) -> _Plan:
        """Every field checked (types, ranges); raises ValueError naming the field's path."""
        schema = data.get("schema")
        if schema == "redline.plan/1":
            raise ValueError("the plan was made by an earlier redline (schema redline.plan/1, "
                             "loader settings not yet embedded); run `redline tune` again")
        if schema != PLAN_SCHEMA:
            raise ValueError(f"not a redline plan: schema is {schema!r}, expected "
                             f"{PLAN_SCHEMA!r}")
        data = dict(data)
        decisions = data.get("decisions")
        if isinstance(decisions, list):  # the printed label is derived, not data
            data["decisions"] = [_decision_fields(decision) if isinstance(decision, dict)
                                 else decision for decision in decisions]
        return from_json(cls, data)


def _decision_fields(decision: dict[str, Any]) -> dict[str, Any]:
    """A stored decision's fields: its printed step dropped (derived from them), and where the
    plan predates ``value_in_label``, that flag read back from the printed step."""
    fields = {key: value for key, value in decision.items() if key != "step"}
    step, value = decision.get("step"), decision.get("value")
    if "value_in_label" not in fields and isinstance(step, str) and value is not None:
        fields["value_in_label"] = step.startswith(f"{decision.get('knob')} {value}")
    return fields


def model_signature(model: torch.nn.Module) -> tuple[str, str]:
    """(digest, class name) of the model's structure: parameter and buffer names, shapes and
    dtypes. Weights' values do not matter: a plan depends on shapes, not on training state."""
    inner = getattr(model, "module", model)  # DDP / DataParallel wrap the model
    inner = getattr(inner, "_orig_mod", inner)  # torch.compile's wrapper
    digest = hashlib.sha256(type(inner).__qualname__.encode())
    for name, tensor in list(inner.named_parameters()) + list(inner.named_buffers()):
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
    return digest.hexdigest()[:16], f"{type(inner).__module__}.{type(inner).__qualname__}"


def device_label(device: torch.device) -> str:
    if device.type == "cuda" and torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(device)}"
    import platform
    return f"{device.type}:{platform.machine()}"


def input_shapes(batch: Any) -> str:
    """Per-sample shapes/dtypes of every tensor in a batch (first dimension dropped)."""
    from redline.data.prefetcher import map_tensors

    seen: list[str] = []
    map_tensors(batch, lambda tensor: seen.append(
        f"{tuple(tensor.shape[1:])}:{str(tensor.dtype).removeprefix('torch.')}"))
    return "|".join(seen)


def plan_key(model: torch.nn.Module, device: torch.device, precision: str,
             batch: Any, world_size: int = 1) -> PlanKey:
    sig, cls = model_signature(model)
    return PlanKey(model_signature=sig, model_class=cls, device=device_label(device),
                   precision=precision, input_shapes=input_shapes(batch), world_size=world_size)


def check_plan(plan: PlanCore, key: PlanKey) -> None:
    """Raise :class:`TunePlanMismatchError` naming every field that differs; warn when only the
    world size does (the per-rank batch still fits; the loader's share of CPUs and the DDP
    settings were measured for another job)."""
    if plan.key.world_size != key.world_size:
        warnings.warn(
            f"this plan was made for {plan.key.world_size} process(es) and is applied in a job "
            f"of {key.world_size}: its micro-batch (per rank) still fits, but its loader workers "
            "and DDP settings were measured for the other job; run `redline tune` under this "
            "job's launcher to measure them here", stacklevel=3)

    diffs = [f"{name}: plan has {getattr(plan.key, name)!r}, this run has {getattr(key, name)!r}"
             for name in ("model_signature", "device", "input_shapes")
             if getattr(plan.key, name) != getattr(key, name)]
    if diffs:
        raise TunePlanMismatchError(
            "this plan was made for another configuration (" + "; ".join(diffs) + "). Its batch "
            "and memory decisions do not carry over: run `redline tune` for this one.")
