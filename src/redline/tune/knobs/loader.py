"""The data pipeline: the loader autotune (workers, prefetch, pinning, persistence, torch
threads) run in the real step, kept only when measured faster end to end; visited again at the
end of the path when a later knob made the step faster (the bottleneck may move to the input).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.utils.data import DataLoader

from redline.core.loader import LoaderSettings
from redline.data.autotune import autotune_loader, rebuild_factory
from redline.data.cache_split import CacheSplit
from redline.data.device_decode import EncodedJpegs, JpegSplit, collate_encoded
from redline.data.prefetcher import map_tensors
from redline.measure.system import cpu_budget
from redline.tune.decision import KnobRecord
from redline.tune.knob import FrameworkArgs, FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.knobs.batch import exported_micro_batch
from redline.tune.knobs.decode_cache import plan_dataset
from redline.tune.samples import fresh
from redline.tune.tuned import TunePlanMismatchError

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


def plan_data(plan: TunePlan, loader: DataLoader[Any], cache_split: CacheSplit | None,
              jpeg_split: JpegSplit | None) -> tuple[Any, Callable[[Any], Any] | None]:
    """The dataset and collate the tuned loader reads: encoded JPEGs where the plan decodes on
    the device, else the loader's own dataset or its decode cache (and the loader's collate).

    Args:
        plan: the tuned settings.
        loader: the user's loader.
        cache_split: the setup's decode-cache split, or None.
        jpeg_split: the setup's JPEG split, or None.

    Returns:
        (dataset, collate_fn or None for the loader's own).

    Raises:
        TunePlanMismatchError: the plan decodes on the device and no ``jpeg_split`` was given.
    """
    if not plan.gpu_decode:
        return plan_dataset(plan, loader, cache_split), None
    if jpeg_split is None:
        raise TunePlanMismatchError(
            "the plan decodes JPEGs on the device (gpu_decode: true) and no JPEG split was "
            "given: pass jpeg_split=redline.data.JpegSplit(...) (the setup's) to apply_plan, "
            "or set gpu_decode to false in the plan to decode on the CPU")
    return EncodedJpegs(jpeg_split, len(loader.dataset)), collate_encoded  # type: ignore[arg-type]


@dataclass(kw_only=True)
class LoaderFields:
    """The input pipeline's settings in the plan. Part of :class:`~redline.tune.knobs.TunePlan`."""

    loader: LoaderSettings = field(default_factory=LoaderSettings)
    """The DataLoader settings to rebuild the loader with (its batch size is the effective
    batch)."""
    torch_threads: int | None = None
    """Intra-op threads of the training process; None = leave as is."""
    prefetch_to_device: bool = False
    """Wrap the loader in :class:`redline.data.DevicePrefetcher` (CUDA only)."""

    def check_fields(self) -> None:
        """Raise ValueError naming the field whose value is out of range."""
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1 or None, got {self.torch_threads}")


LOADER_RECORD = KnobRecord(label="data pipeline")


class LoaderKnob(TuneKnob):
    name = "loader"
    records = (LOADER_RECORD,)
    plan_fields = LoaderFields
    switches = ("tune_loader",)
    heading = "1/4 data pipeline"
    words: ClassVar[FrameworkWords] = FrameworkWords(
        lightning=("num_workers", "prefetch_factor", "pin_memory", "persistent_workers"),
        hf=("dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
            "dataloader_prefetch_factor"))

    def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        return self._autotune(path, plan, again=False)

    def again(self, path: TuningPath, plan: TunePlan) -> TunePlan:
        """A faster step moves the bottleneck to the input pipeline: provision it for the final
        step (the loader autotune stops at once if the input keeps up)."""
        if not any(decision.kept for decision in plan.decisions if decision.knob != LOADER_RECORD.label):
            return plan
        path.log("data pipeline, again (the step got faster)")
        return self._autotune(path, plan, again=True)

    def _autotune(self, path: TuningPath, plan: TunePlan, *, again: bool) -> TunePlan:
        setup = fresh(path.factory)
        loop = path.tuned_loop(plan, setup)
        dataset, collate = plan_data(plan, setup.loader, setup.cache_split, setup.jpeg_split)
        make = rebuild_factory(setup.loader, batch_size=plan.effective_batch, dataset=dataset,
                               collate_fn=collate)
        device = path.device

        def consume(batch: Any) -> None:
            loop.step(map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=True)))

        job = path.agree.info
        try:
            # Ranks on one host share its CPUs: each may use its share for workers.
            loader_plan = autotune_loader(
                make, consume, device=device.type,
                batches_per_trial=path.cfg.loader_batches_per_trial,
                cpus=(cpu_budget().cpus / job.local_world_size if job.distributed else None),
                agree=path.agree)
        finally:
            loop.close()
        cand = dataclasses.replace(plan, loader=loader_plan.settings,
                                   torch_threads=loader_plan.torch_threads,
                                   prefetch_to_device=device.type == "cuda", decisions=[])
        path.log(f"  loader: {loader_plan.reason}")
        decision = LOADER_RECORD.decision(again=again, details={
            "autotune": loader_plan.reason, "trials": len(loader_plan.trials),
            "tuning_s": round(loader_plan.tuning_s, 2)})
        if dataclasses.replace(cand, decisions=plan.decisions) == plan:
            decision.reason = "the autotune chose the current settings"
            plan.decisions.append(decision)
            return plan
        return path.decide(plan, cand, decision, step_only=False)

    def apply_data(self, parts: LoopParts) -> None:
        plan = parts.plan
        # Pinned host memory only speeds up copies to a CUDA device.
        parts.loader_settings = dataclasses.replace(
            plan.loader, pin_memory=plan.loader.pin_memory and parts.device.type == "cuda")
        parts.prefetch_to_device = plan.prefetch_to_device
        if plan.torch_threads is not None:
            parts.stack.callback(torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(plan.torch_threads)

    def framework_args(self, plan: TunePlan, out: FrameworkArgs) -> None:
        settings = plan.loader
        if out.lightning:
            out.dataloader.update(batch_size=exported_micro_batch(plan),
                                  **settings.loader_kwargs())
        else:
            out.arguments.update(
                dataloader_num_workers=settings.num_workers,
                dataloader_pin_memory=settings.pin_memory,
                dataloader_persistent_workers=settings.persistent_workers
                and settings.num_workers > 0)
            if settings.num_workers > 0:
                out.arguments["dataloader_prefetch_factor"] = settings.prefetch_factor or 2
        if plan.torch_threads is not None:
            out.code.append(f"torch.set_num_threads({plan.torch_threads})")
        if plan.prefetch_to_device and out.lightning:
            out.code.append("# the plan copies batches to the GPU ahead of the step: Lightning "
                            "copies at the step; pin_memory=True makes that copy asynchronous")

    def summary(self, plan: TunePlan) -> list[str]:
        return [f"workers {plan.loader.num_workers}", f"prefetch {plan.loader.prefetch_factor}",
                f"pin_memory {plan.loader.pin_memory}"]


LOADER = LoaderKnob()
