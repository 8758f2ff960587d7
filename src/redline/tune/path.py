"""One tuning of the path on the user's own model: what its knobs read and share.

The knobs (:mod:`redline.tune.knobs`, visited in the order of
:data:`redline.tune.knobs.PATH` by :func:`redline.tune.run.tune`) each keep a change only when
it measured faster (:class:`redline.tune.decide.ABPolicy`) and, for precision, numerically
safe. Every trial starts from a fresh setup (:mod:`redline.tune.trial`); the plan is remembered
per model signature, device, precision and input shapes (:class:`redline.tune.plan_store.PlanStore`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from redline.core.loader import LoaderSettings
from redline.data.cache import CachedDataset
from redline.data.prefetcher import map_tensors
from redline.measure.agree import Agreement
from redline.tune.batch_finder import BatchSearch
from redline.tune.config import DEFAULT_RUN_STEPS, TuneConfig
from redline.tune.decide import ABPolicy, MeasureFn
from redline.tune.decision import Decision
from redline.tune.decode_cache import remove_store
from redline.tune.job import job_trial
from redline.tune.kernels import (
    AttentionSite,
    has_conv2d,
    optimizer_impls,
)
from redline.tune.knobs import TunePlan
from redline.tune.precision import (
    NumericsCheck,
    check_numerics,
    worst_check,
)
from redline.tune.result import TrialMetrics
from redline.tune.runtime import TunedLoop
from redline.tune.samples import first_batches, fresh
from redline.tune.setup import Factory, TrainSetup, check_tunable_loader
from redline.tune.tuned import PlanKey, plan_key


def baseline_plan(key: PlanKey, micro: int, effective: int,
                  loader: DataLoader[Any] | None = None) -> TunePlan:
    """The user's configuration as a plan: their micro-batch and accumulation, fp32, and
    their DataLoader's settings (workers, prefetch, pinning, persistence), so "before" is
    what they run, not a worker-less stand-in."""
    settings = LoaderSettings.of(loader) if loader is not None else LoaderSettings()
    return TunePlan(key=key, effective_batch=effective, micro_batch=micro, loader=settings,
                    source_batch_size=micro)


def trial_measure(factory: Factory, cfg: TuneConfig, agree: Agreement | None = None,
                  ) -> MeasureFn:
    """The path's measuring function: one trial of a plan on a fresh setup (a compiled plan
    gets at least 2 warm-up steps, which absorb the compile), on every rank of the job."""
    job = agree or Agreement()

    def run(plan: TunePlan, label: str, step_only: bool) -> TrialMetrics:
        warmup = max(2, cfg.warmup_steps) if plan.compile else cfg.warmup_steps
        return job_trial(factory, plan, label, job, steps=cfg.steps_per_trial, warmup=warmup,
                         step_only=step_only)
    return run


class TunePath:
    """One tuning: the setup's facts, the job's ranks, the A/B policy, and what the knobs found
    (:class:`redline.tune.knob.TuningPath` is what a knob reads of it)."""

    def __init__(self, factory: Factory, cfg: TuneConfig, log: Callable[[str], None],
                 measure_fn: MeasureFn | None = None, agree: Agreement | None = None) -> None:
        self.factory, self.cfg, self.log = factory, cfg, log
        self.agree = agree or Agreement()
        """The job's ranks: every measured input of a decision is agreed through it."""
        self.policy = ABPolicy(cfg, measure_fn or trial_measure(factory, cfg, self.agree), log)
        setup = fresh(factory)
        check_tunable_loader(setup.loader)
        self.device = torch.device(setup.device)
        first = next(iter(DataLoader(setup.loader.dataset, batch_size=1,
                                     collate_fn=setup.loader.collate_fn)))
        self.key = plan_key(setup.model, self.device, "fp32", first, self.agree.world_size)
        self.user_loader = setup.loader
        """The factory's DataLoader: the baseline's loader settings come from it."""
        self.micro, self.effective = setup.micro_batch, setup.effective_batch
        self.memory_limit = setup.memory_limit_bytes
        self.run_steps = cfg.run_steps or setup.run_steps or DEFAULT_RUN_STEPS
        self.run_steps_source = ("TuneConfig.run_steps" if cfg.run_steps else
                                 "TrainSetup.run_steps" if setup.run_steps else
                                 f"default ({DEFAULT_RUN_STEPS:,}): set run_steps for a real "
                                 "projection")
        self.conv = has_conv2d(setup.model)
        self.opt_impls = optimizer_impls(setup.optimizer)
        self.cache_split = setup.cache_split
        self.jpeg_split = setup.jpeg_split
        self.dataset_cached = isinstance(setup.loader.dataset, CachedDataset)
        """The setup's dataset already is a CachedDataset (the decode cache is not tried)."""
        self.cache_store: str | None = None
        """The decode cache's folder for this tuning's trials (made when the knob is tried,
        removed by :meth:`close`)."""
        self.batch_search: BatchSearch | None = None
        """The batch finder's last search (the batch knob's)."""
        self.numerics_checks: list[NumericsCheck] = []
        """The precision knob's numerics checks."""
        self.attention_sites: list[AttentionSite] = []
        """Hand-written attention the kernels stage found."""

    def steps_for(self, plan: TunePlan) -> int:
        """Optimizer steps of the planned run under ``plan``: the same samples, so fewer
        steps where the effective batch grew."""
        return -(-self.run_steps * self.effective // plan.effective_batch)

    def close(self) -> None:
        """Remove what the trials left (the decode cache's folder)."""
        remove_store(self.cache_store)
        self.cache_store = None

    def numerics_refuse(self, plan: TunePlan) -> str | None:
        """Why a remembered plan's precision must not be reused for this job (its numerics
        check fails here), or None. Raises NonFiniteLossError when fp32 itself gives NaN/inf:
        a remembered plan is no reason to train on a broken loss."""
        setup = fresh(self.factory)
        batches = [map_tensors(batch, lambda tensor: tensor.to(self.device))
                   for batch in first_batches(setup.loader, self.effective, self.cfg.numerics_steps)]
        chk = worst_check(self.agree.run(
            lambda: check_numerics(setup.model, setup.optimizer, batches, plan.micro_batch,
                                   setup.loss_fn, precision=plan.precision, device=self.device,
                                   tolerance=self.cfg.tolerance),
            f"numerics {plan.precision}"))
        self.log(f"  numerics of the remembered plan ({plan.precision}): {chk.reason}")
        return None if chk.passed else chk.reason

    def decide(self, plan: TunePlan, candidate: TunePlan, decision: Decision, *,
               step_only: bool = True) -> TunePlan:
        return self.policy.decide(plan, candidate, decision, step_only=step_only)

    def tuned_loop(self, plan: TunePlan, setup: TrainSetup) -> TunedLoop:
        """``plan`` applied to a fresh ``setup`` on this tuning's device."""
        return TunedLoop(plan, setup.model, setup.optimizer, setup.loader, setup.loss_fn,
                         device=self.device, cache_split=setup.cache_split,
                         jpeg_split=setup.jpeg_split)
