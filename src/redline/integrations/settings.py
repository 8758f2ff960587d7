"""A tuning plan in a framework's words: the keyword arguments of Lightning's ``Trainer`` and
``DataLoader``, or of Hugging Face's ``TrainingArguments``, and the lines of code for what the
framework has no setting for.

Pure functions of :class:`redline.tune.TunePlan`: neither framework is imported here, so the
export runs (and is tested) where the framework is not installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redline.tune.tuned import TunePlan

LIGHTNING_PRECISION = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed",
                       "fp16": "16-mixed"}
"""The plan's precision as Lightning's ``Trainer(precision=...)`` (TF32 is fp32 storage with
TF32 matmuls, set by one line of code: Lightning has no flag for it)."""

TF32_LINE = 'torch.set_float32_matmul_precision("high")  # TF32 matmuls'


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


def _common_code(plan: TunePlan, *, compile_arg: bool) -> list[str]:
    code = _batch_note(plan)
    if plan.precision == "tf32":
        code.append(TF32_LINE)
    if plan.torch_threads is not None:
        code.append(f"torch.set_num_threads({plan.torch_threads})")
    if plan.channels_last:
        code.append("model = model.to(memory_format=torch.channels_last)  # and 4-D inputs too")
    if plan.compile and not compile_arg:
        code.append("model = torch.compile(model)  # before fit")
    if plan.decode_cache:
        code.append("# decode cache: serve the dataset from redline.data.CachedDataset(source, "
                    "deterministic, random), the split your tuned setup declared")
    if plan.user_effective_batch:
        code.append(
            f"# the effective batch changed {plan.user_effective_batch} → "
            f"{plan.effective_batch} (the tuning was allowed to change it): learning rate × "
            f"{plan.lr_scale:.4g} ({plan.lr_rule} rule)"
            + (f", a linear warm-up from your rate over {plan.lr_warmup_steps} steps"
               if plan.lr_warmup_steps else "")
            + "; validate against your baseline before adopting it")
    return code


def lightning_settings(plan: TunePlan) -> FrameworkSettings:
    """``Trainer`` and ``DataLoader`` arguments (and code lines) that train as ``plan`` says:
    micro-batch × ``accumulate_grad_batches`` = the plan's effective batch.

    Args:
        plan: the tuned plan.

    Returns:
        :class:`FrameworkSettings` for Lightning: ``Trainer`` arguments (precision,
        accumulation, benchmark, DDP strategy), ``DataLoader`` arguments and code lines.
    """
    args: dict[str, Any] = {"precision": LIGHTNING_PRECISION[plan.precision],
                            "accumulate_grad_batches": _accumulation(plan)}
    if plan.cudnn_benchmark:
        args["benchmark"] = True
    code = _common_code(plan, compile_arg=False)
    if plan.optimizer_impl is not None:
        code.append(f"# in configure_optimizers: build the optimizer with {plan.optimizer_impl}"
                    "=True")
    ddp = plan.ddp
    if ddp.bucket_cap_mb is not None or ddp.gradient_as_bucket_view is not None:
        kw = {k: v for k, v in (("bucket_cap_mb", ddp.bucket_cap_mb),
                                ("gradient_as_bucket_view", ddp.gradient_as_bucket_view))
              if v is not None}
        code.append("from lightning.pytorch.strategies import DDPStrategy")
        args["strategy"] = f"DDPStrategy({', '.join(f'{k}={v!r}' for k, v in kw.items())})"
    if plan.prefetch_to_device:
        code.append("# the plan copies batches to the GPU ahead of the step: Lightning copies "
                    "at the step; pin_memory=True makes that copy asynchronous")
    return FrameworkSettings(framework="lightning", arguments=args, dataloader=_loader_kwargs(plan),
                             code=code,
                             effective_batch=plan.effective_batch)


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
    ls = plan.loader
    args: dict[str, Any] = {
        "per_device_train_batch_size": _micro(plan),
        "gradient_accumulation_steps": _accumulation(plan),
        "bf16": plan.precision == "bf16",
        "fp16": plan.precision == "fp16",
        "dataloader_num_workers": ls.num_workers,
        "dataloader_pin_memory": ls.pin_memory,
        "dataloader_persistent_workers": ls.persistent_workers and ls.num_workers > 0,
        "torch_compile": plan.compile,
    }
    if plan.precision == "tf32":
        args["tf32"] = True  # TrainingArguments accepts it on Ampere or later GPUs only
    if ls.num_workers > 0:
        args["dataloader_prefetch_factor"] = ls.prefetch_factor or 2
    if plan.optimizer_impl == "fused":
        args["optim"] = "adamw_torch_fused"  # the Trainer's own AdamW, fused
    if plan.ddp.bucket_cap_mb is not None:
        args["ddp_bucket_cap_mb"] = max(1, round(plan.ddp.bucket_cap_mb))
    if plan.lr_warmup_steps:
        args["warmup_steps"] = plan.lr_warmup_steps
    code = _common_code(plan, compile_arg=True)
    if plan.cudnn_benchmark:
        code.append("torch.backends.cudnn.benchmark = True")
    if plan.ddp.gradient_as_bucket_view:
        code.append("# DDP gradient_as_bucket_view=True has no TrainingArguments field: "
                    "wrap the model yourself or leave it")
    return FrameworkSettings(framework="hf", arguments=args, dataloader={}, code=code,
                             effective_batch=plan.effective_batch)


def _micro(plan: TunePlan) -> int:
    """The micro-batch to export: the plan's, or where it does not divide the effective batch
    (the plain loop's last micro-batch is then smaller), the largest one that does. The
    frameworks take one micro-batch size × a whole number of accumulation steps, and the
    effective batch is kept exactly."""
    return max(d for d in range(1, plan.micro_batch + 1) if plan.effective_batch % d == 0)


def _accumulation(plan: TunePlan) -> int:
    return plan.effective_batch // _micro(plan)


def _batch_note(plan: TunePlan) -> list[str]:
    m = _micro(plan)
    if m == plan.micro_batch:
        return []
    return [f"# micro-batch {m}: the largest that divides the effective batch "
            f"{plan.effective_batch} at or below the plan's {plan.micro_batch}"]


def _loader_kwargs(plan: TunePlan) -> dict[str, Any]:
    return {"batch_size": _micro(plan), **plan.loader.loader_kwargs()}
