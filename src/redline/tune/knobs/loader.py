"""The data pipeline: the loader autotune (workers, prefetch, pinning, persistence, torch
threads) run in the real step, kept only when measured faster end to end; visited again at the
end of the path when a later knob made the step faster (the bottleneck may move to the input).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from redline.data.autotune import autotune_loader, rebuild_factory
from redline.data.prefetcher import map_tensors
from redline.measure.system import cpu_budget
from redline.tune.decision import Decision, Knob
from redline.tune.knob import FrameworkWords, LoopParts, TuneKnob, TuningPath
from redline.tune.knobs.gpu_decode import plan_data
from redline.tune.samples import fresh
from redline.tune.tuned import TunePlan


class LoaderKnob(TuneKnob):
    name = "loader"
    records = (Knob.LOADER,)
    plan_fields = ("loader", "torch_threads", "prefetch_to_device")
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
        if not any(decision.kept for decision in plan.decisions if decision.knob is not Knob.LOADER):
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
        decision = Decision(knob=Knob.LOADER, kept=False, reason="", again=again,
                            details={"autotune": loader_plan.reason,
                                     "trials": len(loader_plan.trials),
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

    def summary(self, plan: TunePlan) -> list[str]:
        return [f"workers {plan.loader.num_workers}", f"prefetch {plan.loader.prefetch_factor}",
                f"pin_memory {plan.loader.pin_memory}"]


LOADER = LoaderKnob()
