"""The tuned settings (:class:`TunePlan`): what ``redline tune`` decided, as JSON, remembered per
model and machine. (The parallelism planner, ``redline plan``, is :mod:`redline.plan`.)

A plan is keyed by the model's signature (class and parameter names, shapes and dtypes), the
device (type and name), the precision the user trained in and the input shapes (per sample):
the same script on the same GPU reuses its plan; another model, GPU or sequence length does
not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from redline.core.errors import RedlineError
from redline.core.files import write_text_atomic
from redline.core.loader import LoaderSettings
from redline.core.typed_json import from_json
from redline.tune.decision import Decision

PLAN_SCHEMA = "redline.plan/2"
"""Version 2 embeds the DataLoader settings (``loader``) and types the decisions."""
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


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


@dataclass(frozen=True, slots=True, kw_only=True)
class DdpSettings:
    """DistributedDataParallel settings the tuned loop re-wraps the user's DDP model with
    (:func:`redline.tune.ddp.rewrap`); None keeps what the user built."""

    bucket_cap_mb: float | None = None
    """Gradient bucket capacity in MiB (DDP's default is 25): smaller buckets start
    all-reducing earlier in the backward pass, larger ones launch fewer collectives."""
    gradient_as_bucket_view: bool | None = None
    """Gradients as views into the communication buckets: one copy of every gradient less in
    memory and no copy into the buckets per step."""

    def __post_init__(self) -> None:
        if self.bucket_cap_mb is not None and not self.bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be > 0 or None, got {self.bucket_cap_mb}")


@dataclass(slots=True, kw_only=True)
class TunePlan:
    """Settings to apply to the plain loop (see :func:`redline.tune.apply_plan`)."""

    key: PlanKey
    effective_batch: int
    """Samples per optimizer step: the user's, unchanged."""
    micro_batch: int
    """Samples per forward/backward; ``effective_batch`` is split into micro-batches of this
    size, the last one weighted by its size."""
    source_batch_size: int | None = None
    """The DataLoader batch size of the configuration the plan was made from (its effective
    batch is this × the accumulation steps): :func:`redline.tune.apply_plan` refuses a loader
    of another batch size, which would change the effective batch without saying so."""
    loader: LoaderSettings = field(default_factory=LoaderSettings)
    """The DataLoader settings to rebuild the loader with (its batch size is the effective
    batch)."""
    torch_threads: int | None = None
    """Intra-op threads of the training process; None = leave as is."""
    prefetch_to_device: bool = False
    """Wrap the loader in :class:`redline.data.DevicePrefetcher` (CUDA only)."""
    decode_cache: bool = False
    """Serve the loader from a cache of the deterministic part of each sample (the setup's
    ``cache_split``, :class:`redline.data.CacheSplit`): filled on first access, kept."""
    decode_cache_store: str | None = None
    """The cache's folder; None = ``CachedDataset``'s default (``/dev/shm/redline-cache``
    where /dev/shm has room for it, else ``~/.cache/redline/redline-cache``)."""
    gpu_decode: bool = False
    """The loader ships encoded JPEGs and the device decodes and augments them (the setup's
    ``jpeg_split``, :class:`redline.data.JpegSplit`; :mod:`redline.data.device_decode`)."""
    precision: str = "fp32"
    """'fp32' | 'tf32' | 'bf16' (autocast) | 'fp16' (autocast + GradScaler)."""
    channels_last: bool = False
    cudnn_benchmark: bool = False
    """``torch.backends.cudnn.benchmark`` on while the tuned loop runs: cuDNN times its
    convolution algorithms for each new shape once and keeps the fastest (CUDA conv nets)."""
    compile: bool = False
    compile_mode: str | None = None
    """torch.compile's mode: None (default) or 'reduce-overhead' (the step replayed as CUDA
    graphs: :mod:`redline.tune.cuda_graphs`)."""
    optimizer_impl: str | None = None
    """'fused' | 'foreach' | None (the optimizer as built)."""
    ddp: DdpSettings = field(default_factory=DdpSettings)
    """DDP settings to re-wrap a DistributedDataParallel model with (ignored for others)."""
    lr_scale: float = 1.0
    """Every parameter group's learning rate × this (1: unchanged). Other than 1 only where
    the effective batch was allowed to change (``redline tune --allow-batch-change``)."""
    lr_rule: str | None = None
    """The rule behind ``lr_scale``: 'linear' (SGD) or 'sqrt' (adaptive optimizers)."""
    lr_warmup_steps: int = 0
    """Optimizer steps over which the rate rises linearly from the user's to the scaled one."""
    user_effective_batch: int | None = None
    """The user's effective batch where the plan changed it (else None: unchanged)."""

    schema: str = PLAN_SCHEMA
    decisions: list[Decision] = field(default_factory=list)
    """One entry per step of the path: what was tried, measured numbers, kept or why not."""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not 1 <= self.micro_batch <= self.effective_batch:
            raise ValueError(f"need 1 <= micro_batch <= effective_batch, got {self.micro_batch}"
                             f" and {self.effective_batch}")
        if self.compile_mode not in (None, "reduce-overhead"):
            raise ValueError(f"compile_mode must be 'reduce-overhead' or None, got "
                             f"{self.compile_mode!r}")
        if self.optimizer_impl not in (None, "fused", "foreach"):
            raise ValueError(f"optimizer_impl must be 'fused', 'foreach' or None, got "
                             f"{self.optimizer_impl!r}")
        if not self.lr_scale > 0 or self.lr_warmup_steps < 0:
            raise ValueError(f"need lr_scale > 0 and lr_warmup_steps >= 0, got {self.lr_scale} "
                             f"and {self.lr_warmup_steps}")
        if self.lr_rule not in (None, "linear", "sqrt"):
            raise ValueError(f"lr_rule must be 'linear', 'sqrt' or None, got {self.lr_rule!r}")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1 or None, got {self.torch_threads}")
        if self.source_batch_size is not None and self.source_batch_size < 1:
            raise ValueError(f"source_batch_size must be >= 1 or None, got "
                             f"{self.source_batch_size}")
        if self.schema != PLAN_SCHEMA:
            raise ValueError(f"schema must be {PLAN_SCHEMA!r}, got {self.schema!r}")

    @property
    def accumulation_steps(self) -> int:
        return -(-self.effective_batch // self.micro_batch)

    def to_dict(self) -> dict[str, Any]:
        as_dict = dataclasses.asdict(self)
        as_dict["decisions"] = [decision.to_dict() for decision in self.decisions]
        return as_dict

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TunePlan:
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
            data["decisions"] = [
                {key: value for key, value in decision.items() if key != "step"}
                if isinstance(decision, dict) else decision for decision in decisions]
        return from_json(cls, data)


def save_plan(plan: TunePlan, path: str | os.PathLike[str]) -> None:
    """Write the plan as JSON (atomically: a crash leaves no half-written file).

    Args:
        plan: the plan to write.
        path: the destination file; its folder must exist.

    Raises:
        OSError: the folder is missing or not writable, or the disk is full (the path named).
    """
    write_text_atomic(json.dumps(plan.to_dict(), indent=2) + "\n", path)


def load_plan(path: str | os.PathLike[str]) -> TunePlan:
    """Read a plan written by :func:`save_plan` or ``redline tune``.

    Args:
        path: the plan's JSON file.

    Returns:
        The :class:`TunePlan`.

    Raises:
        FileNotFoundError: no file at ``path``.
        TunePlanError: the file is not a usable plan; the message names it and says why.
    """
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except FileNotFoundError:
        raise FileNotFoundError(f"no plan at {str(path)!r}: run `redline tune SCRIPT` to make "
                                "one") from None
    except UnicodeDecodeError as e:
        raise TunePlanError(f"{path} is not UTF-8 text (byte {e.start}: {e.reason}); expected a "
                        "plan written by redline tune") from None
    except json.JSONDecodeError as e:
        raise TunePlanError(f"{path} is not JSON ({e}); expected a plan written by redline tune") \
            from None
    if not isinstance(data, dict):
        raise TunePlanError(f"{path} holds a JSON {type(data).__name__}, expected a redline plan")
    try:
        return TunePlan.from_dict(data)
    except (TypeError, ValueError) as e:
        raise TunePlanError(f"{path} is not a usable redline plan: {e}") from None


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


def check_plan(plan: TunePlan, key: PlanKey) -> None:
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


class PlanStore:
    """Plans remembered on disk, one JSON file per key digest.

    Default folder: ``$REDLINE_CACHE_DIR/plans`` or ``~/.cache/redline/plans``.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        if root is None:
            base = os.environ.get("REDLINE_CACHE_DIR") or os.path.join(
                os.path.expanduser("~"), ".cache", "redline")
            root = os.path.join(base, "plans")
        self.root = Path(root)

    def path(self, key: PlanKey) -> Path:
        return self.root / f"{key.digest()}.json"

    def get(self, key: PlanKey) -> TunePlan | None:
        file = self.path(key)
        if not file.exists():
            return None
        try:
            plan = load_plan(file)
        except (ValueError, OSError):
            return None  # unreadable or from another version: tune again
        return plan if plan.key == key else None

    def put(self, plan: TunePlan) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        file = self.path(plan.key)
        save_plan(plan, file)
        return file
