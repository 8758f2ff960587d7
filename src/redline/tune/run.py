"""``redline tune`` from end to end: the path's knobs in order (:class:`~redline.tune.path.
TunePath`), a remembered plan reused where it still holds, and the before/after comparison.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from redline.diagnose.limits import remaining_limits
from redline.measure.agree import Agreement
from redline.tune.batch_finder import BatchDoesNotFitError, BatchSearch
from redline.tune.config import TuneConfig
from redline.tune.decide import MeasureFn
from redline.tune.decision import Decision, Knob
from redline.tune.decode_cache import trial_store
from redline.tune.job import job_trial
from redline.tune.kernels import AttentionSite
from redline.tune.path import SIXTEEN_BIT, TunePath, baseline_plan
from redline.tune.plan import PlanStore, TunePlan
from redline.tune.precision import NumericsCheck
from redline.tune.result import TuneResult, merge_trials, project
from redline.tune.setup import Factory, dataset_failure
from redline.tune.trial import TrialMetrics


def compare(factory: Factory, before: TunePlan, after: TunePlan, cfg: TuneConfig,
            agree: Agreement | None = None) -> tuple[TrialMetrics, TrialMetrics]:
    """Before and after, alternating ``cfg.rounds`` times; the first round also counts FLOPs
    (MFU) and peak memory, and on CUDA traces a few steps for the kernel-union device busy
    (the CUDA-event span is an upper bound that a host-bound loop inflates)."""
    rows: dict[str, list[TrialMetrics]] = {"before": [], "after": []}
    cuda = before.key.device.startswith("cuda")
    job = agree or Agreement()
    for r in range(cfg.rounds):
        for label, pl in (("before", before), ("after", after)):
            rows[label].append(job_trial(factory, pl, label, job, steps=cfg.steps_per_trial,
                                         warmup=cfg.warmup_steps,
                                         count_flops=r == 0 and not pl.compile, memory=r == 0,
                                         trace=r == 0 and cuda))
    return merge_trials(rows["before"]), merge_trials(rows["after"])


def _batch_again(p: TunePath, plan: TunePlan, cfg: TuneConfig, search: BatchSearch | None,
                 log: Callable[[str], None]) -> tuple[TunePlan, BatchSearch | None]:
    """Once a 16-bit precision is kept, search the batch again (once): 16-bit activations take
    about half the memory, so a larger micro-batch may fit."""
    if (not cfg.tune_batch or plan.precision not in SIXTEEN_BIT
            or plan.micro_batch >= plan.effective_batch
            or any(d.knob is Knob.BATCH and d.again for d in plan.decisions)):
        return plan, search
    log("batch size, again (16-bit activations are smaller)")
    try:
        plan, again = p.batch(plan, again=True)
    except BatchDoesNotFitError as e:
        # Autocast keeps 16-bit copies of the weights beside the fp32 ones: under a tight
        # memory budget the 16-bit step can need more than the fp32 one. The precision was
        # kept for speed on trials that do not enforce the budget; it does not fit: revert.
        kept = next(d for d in reversed(plan.decisions)
                    if d.knob is Knob.PRECISION and d.kept)
        why = str(e).split(". Options")[0]
        kept.kept = False
        kept.reason += f"; reverted: {why} in {plan.precision}"
        log(f"  {plan.precision} reverted: {why}")
        before = next((d.value for d in reversed(plan.decisions) if d.knob is Knob.PRECISION
                       and d.kept and d.value), "fp32")
        plan = dataclasses.replace(plan, precision=before)
        plan.decisions.append(Decision(
            Knob.BATCH, False, f"not searched again: {kept.value} was reverted (its step "
            "does not fit the memory budget)", again=True))
        return plan, search
    return plan, again or search


def tune(factory: Factory, config: TuneConfig | None = None,
         log: Callable[[str], None] = lambda s: None,
         measure_fn: MeasureFn | None = None) -> TuneResult:
    """Run the path on ``factory``'s setup; return the plan and the before/after numbers.

    ``measure_fn`` replaces the trials that decide each knob (default: real trials, see
    :func:`trial_measure`); the before/after comparison is always measured for real.

    Raises:
        SetupError: the factory raised or returned something unusable, or reading a sample
            of its dataset raised (the sample and the error named).
        BatchDoesNotFitError: the model does not fit at micro-batch 1.
        NonFiniteLossError: the loss is NaN/inf in fp32 already.
    """
    try:
        return _tune(factory, config, log, measure_fn)
    except Exception as e:
        failure = dataset_failure(e)
        if failure is not None:
            raise failure from e
        raise


def _tune(factory: Factory, config: TuneConfig | None, log: Callable[[str], None],
          measure_fn: MeasureFn | None) -> TuneResult:
    cfg = config or TuneConfig()
    t0 = time.perf_counter()
    agree = Agreement.for_job()
    if agree.rank != 0:
        log = _silent  # rank 0 speaks for the job; every rank takes the same path
    p = TunePath(factory, cfg, log, measure_fn, agree)
    try:
        store = PlanStore(cfg.store_dir)
        base = baseline_plan(p.key, p.micro, p.effective, p.user_loader)
        ls = base.loader
        ranks = (f" per rank, × {agree.world_size} ranks = {p.effective * agree.world_size} "
                 "samples per optimizer step" if agree.world_size > 1 else "")
        log(f"redline tune: baseline is micro-batch {p.micro} × {p.effective // p.micro} = "
            f"effective batch {p.effective}{ranks}, fp32, the loader as given ({ls.num_workers} "
            f"workers, prefetch {ls.prefetch_factor}, pin_memory {ls.pin_memory}, persistent "
            f"{ls.persistent_workers})")
        # Rank 0's memory of plans is the job's: a plan remembered on one host only is not
        # reused on some ranks and searched again on others.
        reused = agree.first(store.get(p.key) if cfg.reuse and agree.rank == 0 else None,
                             "remembered plan")
        if reused is not None and reused.user_effective_batch and not cfg.allow_batch_change:
            log(f"not reusing the remembered plan {store.path(p.key)}: it changes the effective "
                f"batch ({reused.user_effective_batch} → {reused.effective_batch}) and "
                "--allow-batch-change was not given; searching again")
            reused = None
        if reused is not None:
            refused = p.numerics_refuse(reused)
            if refused is not None:
                log(f"not reusing the remembered plan {store.path(p.key)}: {refused}; searching "
                    "again")
                reused = None
        search: BatchSearch | None = None
        checks: list[NumericsCheck] = []
        sites: list[AttentionSite] = []
        if reused is not None:
            plan = reused
            log(f"reusing the remembered plan {store.path(p.key)}")
        else:
            plan = dataclasses.replace(base, decisions=[])
            if cfg.tune_loader:
                log("1/4 data pipeline")
                plan = p.loader(plan)
                plan = p.decode_cache(plan)
            if cfg.tune_batch:
                log("2/4 batch size (effective batch kept)")
                plan, search = p.batch(plan)
                if cfg.allow_batch_change:
                    log("effective batch (allowed to change: --allow-batch-change)")
                    plan = p.batch_change(plan)
            if cfg.tune_precision:
                log("3/4 precision")
                plan, checks = p.precision(plan)
                plan, search = _batch_again(p, plan, cfg, search, log)
            if cfg.tune_kernels:
                log("4/4 kernels")
                plan, sites = p.kernels(plan)
                # 16-bit kept only with channels_last (precision_again): the same reason to look
                # at the batch again as after the precision step.
                plan, search = _batch_again(p, plan, cfg, search, log)
            if cfg.tune_ddp and agree.world_size > 1:
                log("DDP communication")
                plan = p.ddp(plan)
            if cfg.tune_loader and any(d.kept for d in plan.decisions if d.knob is not Knob.LOADER):
                # A faster step moves the bottleneck to the input pipeline: provision it for the
                # final step (the loader autotune stops at once if the input keeps up).
                log("data pipeline, again (the step got faster)")
                plan = p.loader(plan, again=True)
        if plan.decode_cache and plan.decode_cache_store is None:
            # a remembered plan: its trials fill a store of their own, removed after them
            p.cache_store = trial_store()
            plan = dataclasses.replace(plan, decode_cache_store=p.cache_store)
        log("measuring before and after, side by side...")
        before, after = compare(factory, base, plan, cfg, agree)
        # the plan as remembered and returned: the cache at CachedDataset's default folder,
        # not at the trials' (removed when tuning ends)
        plan = dataclasses.replace(plan, decode_cache_store=None)
        path_str = None
        if reused is None and agree.rank == 0:
            path_str = str(store.put(plan))
        n = agree.world_size
        return TuneResult(plan, before, after,
                          project(before, p.run_steps, cfg.price_per_device_hour, devices=n,
                                  samples_per_step=p.effective * n),
                          project(after, p.steps_for(plan), cfg.price_per_device_hour,
                                  devices=n, samples_per_step=plan.effective_batch * n),

                          p.run_steps_source, cfg.price_per_device_hour, search, checks, sites,
                          str(store.path(p.key)) if reused is not None else None, path_str,
                          time.perf_counter() - t0,
                          remaining_limits(after.data_wait_fraction,
                                           after.device_busy_kernels_fraction,
                                           after.device_busy_fraction))

    finally:
        p.close()  # the trials' decode cache

def _silent(_: str) -> None:
    """The log of ranks other than 0."""
