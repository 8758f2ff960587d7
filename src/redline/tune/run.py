"""``redline tune`` from end to end: the path's knobs in order (:data:`redline.tune.knobs.
PATH`, on a :class:`~redline.tune.path.TunePath`), a remembered plan reused where it still
holds, and the before/after comparison.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from redline.diagnose.limits import remaining_limits
from redline.measure.agree import Agreement
from redline.tune.config import TuneConfig
from redline.tune.decide import MeasureFn
from redline.tune.decode_cache import trial_store
from redline.tune.job import job_trial
from redline.tune.knobs import PATH
from redline.tune.path import TunePath, baseline_plan
from redline.tune.plan_store import PlanStore
from redline.tune.result import TrialMetrics, TuneResult, merge_trials, project
from redline.tune.setup import Factory, dataset_failure

if TYPE_CHECKING:
    from redline.tune.knobs import TunePlan


def compare(factory: Factory, before: TunePlan, after: TunePlan, cfg: TuneConfig,
            agree: Agreement | None = None) -> tuple[TrialMetrics, TrialMetrics]:
    """Before and after, alternating ``cfg.rounds`` times; the first round also counts FLOPs
    (MFU) and peak memory, and on CUDA traces a few steps for the kernel-union device busy
    (the CUDA-event span is an upper bound that a host-bound loop inflates)."""
    rows: dict[str, list[TrialMetrics]] = {"before": [], "after": []}
    cuda = before.key.device.startswith("cuda")
    job = agree or Agreement()
    for round_index in range(cfg.rounds):
        for label, side_plan in (("before", before), ("after", after)):
            rows[label].append(job_trial(factory, side_plan, label, job, steps=cfg.steps_per_trial,
                                         warmup=cfg.warmup_steps,
                                         count_flops=round_index == 0 and not side_plan.compile,
                                         memory=round_index == 0,
                                         trace=round_index == 0 and cuda))
    return merge_trials(rows["before"]), merge_trials(rows["after"])


def run_path(path: TunePath, plan: TunePlan, cfg: TuneConfig) -> TunePlan:
    """The path's visits in order (:data:`redline.tune.knobs.PATH`), each knob that is on in
    ``cfg`` and applies here returning the plan to keep."""
    for visit in PATH:
        if not visit.enabled(cfg, path):
            continue
        if visit.again:
            plan = visit.knob.again(path, plan)
            continue
        if visit.knob.heading is not None:
            path.log(visit.knob.heading)
        plan = visit.knob.run(path, plan)
    return plan


def tune(factory: Factory, config: TuneConfig | None = None,
         log: Callable[[str], None] = lambda message: None,
         measure_fn: MeasureFn | None = None) -> TuneResult:
    """Run the path on ``factory``'s setup; return the plan and the before/after numbers.

    ``measure_fn`` replaces the trials that decide each knob (default: real trials, see
    :func:`trial_measure`); the before/after comparison is always measured for real.

    Args:
        factory: called with no argument, returns the :class:`TrainSetup` to tune.
        config: how hard the path looks and what projections assume; None = the defaults of
            :class:`TuneConfig`.
        log: called with each progress line (default: discard them).
        measure_fn: replaces the trials that decide each knob; None = real trials.

    Returns:
        A :class:`TuneResult`: the plan and the measured before/after numbers.

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
    start_s = time.perf_counter()
    agree = Agreement.for_job()
    if agree.rank != 0:
        log = _silent  # rank 0 speaks for the job; every rank takes the same path
    path = TunePath(factory, cfg, log, measure_fn, agree)
    try:
        store = PlanStore(cfg.store_dir)
        base = baseline_plan(path.key, path.micro, path.effective, path.user_loader)
        base_loader = base.loader
        ranks = (f" per rank, × {agree.world_size} ranks = {path.effective * agree.world_size} "
                 "samples per optimizer step" if agree.world_size > 1 else "")
        log(f"redline tune: baseline is micro-batch {path.micro} × {path.effective // path.micro} = "
            f"effective batch {path.effective}{ranks}, fp32, the loader as given "
            f"({base_loader.num_workers} workers, prefetch {base_loader.prefetch_factor}, "
            f"pin_memory {base_loader.pin_memory}, persistent {base_loader.persistent_workers})")
        # Rank 0's memory of plans is the job's: a plan remembered on one host only is not
        # reused on some ranks and searched again on others.
        reused = agree.first(store.get(path.key) if cfg.reuse and agree.rank == 0 else None,
                             "remembered plan")
        if reused is not None and reused.user_effective_batch and not cfg.allow_batch_change:
            log(f"not reusing the remembered plan {store.path(path.key)}: it changes the effective "
                f"batch ({reused.user_effective_batch} → {reused.effective_batch}) and "
                "`allow_batch_change` was not given; searching again")
            reused = None
        if reused is not None:
            refused = path.numerics_refuse(reused)
            if refused is not None:
                log(f"not reusing the remembered plan {store.path(path.key)}: {refused}; searching "
                    "again")
                reused = None
        if reused is not None:
            plan = reused
            log(f"reusing the remembered plan {store.path(path.key)}")
        else:
            plan = run_path(path, dataclasses.replace(base, decisions=[]), cfg)
        if plan.decode_cache and plan.decode_cache_store is None:
            # a remembered plan: its trials fill a store of their own, removed after them
            path.cache_store = trial_store()
            plan = dataclasses.replace(plan, decode_cache_store=path.cache_store)
        log("measuring before and after, side by side...")
        before, after = compare(factory, base, plan, cfg, agree)
        # the plan as remembered and returned: the cache at CachedDataset's default folder,
        # not at the trials' (removed when tuning ends)
        plan = dataclasses.replace(plan, decode_cache_store=None)
        path_str = None
        if reused is None and agree.rank == 0:
            path_str = str(store.put(plan))
        world = agree.world_size
        return TuneResult(
            plan=plan, before=before, after=after,
            before_projection=project(before, path.run_steps, cfg.price_per_device_hour, devices=world,
                                      samples_per_step=path.effective * world),
            after_projection=project(after, path.steps_for(plan), cfg.price_per_device_hour,
                                     devices=world, samples_per_step=plan.effective_batch * world),
            run_steps_source=path.run_steps_source, price_per_device_hour=cfg.price_per_device_hour,
            batch_search=path.batch_search, numerics=path.numerics_checks,
            attention_sites=path.attention_sites,
            reused_plan=str(store.path(path.key)) if reused is not None else None,
            plan_path=path_str, seconds=time.perf_counter() - start_s,
            limits=remaining_limits(after.data_wait_fraction, after.device_busy_kernels_fraction,
                                    after.device_busy_fraction))

    finally:
        path.close()  # the trials' decode cache

def _silent(_: str) -> None:
    """The log of ranks other than 0."""
