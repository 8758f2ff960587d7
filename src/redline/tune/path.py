"""``redline tune``: the systematic path on the user's own model, in its order.

data pipeline → batch size with gradient accumulation → mixed precision → kernels; each change
is kept only when it measured faster (:class:`redline.tune.decide.ABPolicy`) and, for
precision, numerically safe. Every trial starts from a fresh setup (:mod:`redline.tune.trial`);
the plan is remembered per model signature, device, precision and input shapes
(:class:`redline.tune.plan.PlanStore`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from redline.core.loader import LoaderSettings
from redline.data.autotune import autotune_loader, rebuild_factory
from redline.data.cache import CachedDataset
from redline.data.cache_split import fill
from redline.data.prefetcher import map_tensors
from redline.measure.agree import Agreement, RanksDivergedError
from redline.measure.system import cpu_budget
from redline.tune.batch_change import GUARD_STEPS, MAX_GROWTH, check_batch_change, lr_rule
from redline.tune.batch_finder import BatchDoesNotFitError, BatchSearch, find_batch_size
from redline.tune.config import DEFAULT_RUN_STEPS, TuneConfig
from redline.tune.cuda_graphs import SHAPE_BATCHES, graph_blockers, graph_refusal
from redline.tune.ddp import as_ddp, bucket_candidate, cannot_rewrap, rewrap
from redline.tune.decide import ABPolicy, MeasureFn, one_off_pays
from redline.tune.decision import Decision, Knob
from redline.tune.decode_cache import remove_store, trial_store
from redline.tune.job import job_trial
from redline.tune.kernels import (
    AttentionSite,
    cudnn_benchmark_applies,
    find_unfused_attention,
    has_conv2d,
    optimizer_impls,
)
from redline.tune.plan import PlanKey, TunePlan, plan_key
from redline.tune.precision import (
    NonFiniteLossError,
    NumericsCheck,
    autocast_for,
    check_numerics,
    make_scaler,
    supported,
    worst_check,
)
from redline.tune.runtime import TunedLoop, plan_dataset, train_step
from redline.tune.setup import Factory, SetupError, check_tunable_loader
from redline.tune.trial import (
    TrialMetrics,
    first_batches,
    fresh,
    probe_batch,
    state_tensors,
)

SIXTEEN_BIT = ("bf16", "fp16")
"""The 16-bit precisions (activations about half the bytes of fp32 ones)."""


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
    """The knobs of the path, each a method that returns the plan to keep."""

    def __init__(self, factory: Factory, cfg: TuneConfig, log: Callable[[str], None],
                 measure_fn: MeasureFn | None = None, agree: Agreement | None = None) -> None:
        self.factory, self.cfg, self.log = factory, cfg, log
        self.agree = agree or Agreement()
        """The job's ranks: every measured input of a decision is agreed through it."""
        self.policy = ABPolicy(cfg, measure_fn or trial_measure(factory, cfg, self.agree), log)
        s = fresh(factory)
        check_tunable_loader(s.loader)
        self.device = torch.device(s.device)
        first = next(iter(DataLoader(s.loader.dataset, batch_size=1,
                                     collate_fn=s.loader.collate_fn)))
        self.key = plan_key(s.model, self.device, "fp32", first, self.agree.world_size)
        self.user_loader = s.loader
        """The factory's DataLoader: the baseline's loader settings come from it."""
        self.micro, self.effective = s.micro_batch, s.effective_batch
        self.memory_limit = s.memory_limit_bytes
        self.run_steps = cfg.run_steps or s.run_steps or DEFAULT_RUN_STEPS
        self.run_steps_source = ("TuneConfig.run_steps" if cfg.run_steps else
                                 "TrainSetup.run_steps" if s.run_steps else
                                 f"default ({DEFAULT_RUN_STEPS:,}): set run_steps for a real "
                                 "projection")
        self.conv = has_conv2d(s.model)
        self.opt_impls = optimizer_impls(s.optimizer)
        self.cache_split = s.cache_split
        self.dataset_cached = isinstance(s.loader.dataset, CachedDataset)
        """The setup's dataset already is a CachedDataset (the decode cache is not tried)."""
        self.cache_store: str | None = None
        """The decode cache's folder for this tuning's trials (made when the knob is tried,
        removed by :meth:`close`)."""

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
        s = fresh(self.factory)
        batches = [map_tensors(b, lambda t: t.to(self.device))
                   for b in first_batches(s.loader, self.effective, self.cfg.numerics_steps)]
        chk = worst_check(self.agree.run(
            lambda: check_numerics(s.model, s.optimizer, batches, plan.micro_batch, s.loss_fn,
                                   plan.precision, self.device, self.cfg.tolerance),
            f"numerics {plan.precision}"))
        self.log(f"  numerics of the remembered plan ({plan.precision}): {chk.reason}")
        return None if chk.passed else chk.reason

    def decide(self, plan: TunePlan, candidate: TunePlan, decision: Decision, *,
               step_only: bool = True) -> TunePlan:
        return self.policy.decide(plan, candidate, decision, step_only=step_only)

    # -- the knobs -----------------------------------------------------------------------------
    def loader(self, plan: TunePlan, again: bool = False) -> TunePlan:
        s = fresh(self.factory)
        loop = TunedLoop(plan, s.model, s.optimizer, s.loader, s.loss_fn, self.device,
                         s.cache_split)
        make = rebuild_factory(s.loader, batch_size=plan.effective_batch,
                               dataset=plan_dataset(plan, s.loader, s.cache_split))
        dev = self.device

        def consume(batch: Any) -> None:
            loop.step(map_tensors(batch, lambda t: t.to(dev, non_blocking=True)))

        job = self.agree.info
        try:
            # Ranks on one host share its CPUs: each may use its share for workers.
            lp = autotune_loader(make, consume, device=dev.type,
                                 batches_per_trial=self.cfg.loader_batches_per_trial,
                                 cpus=(cpu_budget().cpus / job.local_world_size
                                       if job.distributed else None),
                                 agree=self.agree)
        finally:
            loop.close()
        cand = dataclasses.replace(plan, loader=lp.settings, torch_threads=lp.torch_threads,
                                   prefetch_to_device=dev.type == "cuda", decisions=[])
        self.log(f"  loader: {lp.reason}")
        decision = Decision(Knob.LOADER, False, "", again=again,
                            details={"autotune": lp.reason, "trials": len(lp.trials),
                                     "tuning_s": round(lp.tuning_s, 2)})
        if dataclasses.replace(cand, decisions=plan.decisions) == plan:
            decision.reason = "the autotune chose the current settings"
            plan.decisions.append(decision)
            return plan
        return self.decide(plan, cand, decision, step_only=False)

    def decode_cache(self, plan: TunePlan) -> TunePlan:
        """Serve the loader from a cache of the dataset's deterministic part (the setup's
        ``cache_split``): the cache filled once and timed, the cached pipeline measured end to
        end against the current one, kept only if the planned run is shorter with the fill."""
        if self.dataset_cached:
            plan.decisions.append(Decision(Knob.DECODE_CACHE, False,
                                           "not tried: the dataset already is a CachedDataset"))
            return plan
        if self.cache_split is None:
            self.log("  decode cache: not tried (the setup declares no cache_split)")
            return plan
        s = fresh(self.factory)
        if self.cache_store is None:
            self.cache_store = trial_store()
        cand = dataclasses.replace(plan, decode_cache=True, decode_cache_store=self.cache_store,
                                   decisions=[])
        workers = plan.loader.num_workers
        fill_s, items = fill(plan_dataset(cand, s.loader, s.cache_split), workers)
        fill_s = self.agree.max(fill_s, "decode cache fill")
        self.log(f"  decode cache: filled {items:,} items in {fill_s:.1f} s "
                 f"({workers} workers)")
        details: dict[str, str | int | float | bool | None] = {
            "fill_s": round(fill_s, 2), "items": items, "fill_workers": workers}
        kept = self.decide(plan, cand, Decision(Knob.DECODE_CACHE, False, "", details=details),
                           step_only=False)
        if kept is plan:
            return plan
        d = kept.decisions[-1]
        cur, new = d.samples_per_s_before or 0.0, d.samples_per_s_after or 0.0
        n, eff = self.steps_for(plan), plan.effective_batch
        pays, t_cur, t_new = one_off_pays(fill_s, eff / cur, eff / new, n, self.cfg.min_gain)
        d.reason += (f"; over {n:,} steps: {t_new:,.0f} s cached (incl. {fill_s:.1f} s "
                     f"filling) vs {t_cur:,.0f} s")
        if pays:
            return kept
        d.kept = False
        self.policy.current_tp = cur
        self.log("  decode cache: the fill does not pay over the planned run — not kept")
        return plan  # its decisions are the same list, with ``d`` in it

    def batch(self, plan: TunePlan, again: bool = False) -> tuple[TunePlan, BatchSearch | None]:
        if plan.micro_batch >= plan.effective_batch:
            plan.decisions.append(Decision(
                Knob.BATCH, False,
                f"the micro-batch already is the effective batch ({plan.effective_batch}); a "
                "larger one would change the optimization (set accumulation_steps in the setup "
                "to allow a larger effective batch)", again=again))
            return plan, None
        search, how = self._largest_micro(plan, plan.effective_batch)
        details: dict[str, str | int | float | bool | None] = {
            "finder": search.reason, "trials": search.trials, "ooms": search.ooms,
            "probe_sample": how}
        if search.batch <= plan.micro_batch:
            plan.decisions.append(Decision(
                Knob.BATCH, False, f"the largest micro-batch that fits is {search.batch} (now "
                f"{plan.micro_batch})", value=str(search.batch), again=again, details=details))
            return plan, search
        cand = dataclasses.replace(plan, micro_batch=search.batch, decisions=[])
        details["accumulation_steps"] = cand.accumulation_steps
        return self.decide(plan, cand, Decision(Knob.BATCH, False, "", value=str(search.batch),
                                                again=again, details=details)), search

    def _largest_micro(self, plan: TunePlan, max_batch: int) -> tuple[BatchSearch, str]:
        """The largest micro-batch up to ``max_batch`` that fits the device's memory (the
        setup's limit; on CUDA the free memory), with the plan's precision and layout; and
        which sample the probes were built from."""
        s = fresh(self.factory)
        make, how = probe_batch(s, self.device)
        ac = autocast_for(plan.precision, self.device)
        scaler = make_scaler(plan.precision, self.device)
        model = s.model.to(memory_format=torch.channels_last) if plan.channels_last else s.model  # type: ignore[call-overload]
        model = rewrap(model, plan.ddp)

        def step(b: int) -> None:
            train_step(model, s.optimizer, make(b), b, s.loss_fn, ac, scaler)

        limit = self.memory_limit
        if limit is None and self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            limit = free + torch.cuda.memory_allocated(self.device)
        try:
            search = find_batch_size(
                step, state=lambda: state_tensors(model, s.optimizer),
                max_batch=max_batch, limit_bytes=limit,
                cuda_device=self.device if self.device.type == "cuda" else None,
                agree=self.agree)
        except BatchDoesNotFitError as e:
            # What `redline plan` needs to spread the model over more devices.
            e.params = sum(p.numel() for p in model.parameters() if p.requires_grad)
            e.global_batch = plan.effective_batch * self.agree.world_size
            raise
        self.log(f"  batch finder: {search.reason} ({search.trials} trials, {search.ooms} OOM; "
                 f"probes use the {how})")
        return search, how

    def batch_change(self, plan: TunePlan) -> TunePlan:
        """A larger effective batch, the learning rate rescaled by its optimizer's rule
        (:mod:`redline.tune.batch_change`): only with ``allow_batch_change``; checked against
        the user's batch over the same samples, then kept only if measured faster."""
        s = fresh(self.factory)
        rule = lr_rule(s.optimizer)
        if rule is None:
            plan.decisions.append(Decision(
                Knob.BATCH_CHANGE, False, f"not tried: {type(s.optimizer).__name__} has no "
                "stated learning-rate rule here (linear for SGD, square root for the Adam "
                "family)"))
            return plan
        eff = plan.effective_batch
        search, _ = self._largest_micro(plan, MAX_GROWTH * eff)
        ratio = search.batch // eff
        if ratio < 2:
            plan.decisions.append(Decision(
                Knob.BATCH_CHANGE, False, f"the largest micro-batch that fits is {search.batch}:"
                f" no multiple of the effective batch {eff} above it fits in memory"))
            return plan
        # on the host, moved one step at a time: up to 8 × 8 + 1 effective batches
        batches = first_batches(s.loader, eff, GUARD_STEPS * ratio + 1)
        refused: list[str] = []
        while True:  # the largest ratio the guard passes, halving from what memory allows
            to, scale = ratio * eff, rule.scale(ratio)
            checks = self.agree.run(functools.partial(
                check_batch_change, s.model, s.optimizer, batches[:GUARD_STEPS * ratio],
                batches[-1], eff, ratio, plan.micro_batch, to, s.loss_fn, scale,
                self.cfg.tolerance.batch_change_min_progress, self.device),
                f"batch change to {to}")
            chk = next((c for c in checks if not c.passed), checks[0])
            self.log(f"  effective batch {to}: {chk.reason}")
            if chk.passed or ratio // 2 < 2:
                break
            refused.append(f"{to}: {chk.progress:.0%} of the user's progress")
            ratio //= 2
        details: dict[str, str | int | float | bool | None] = {
            "from_batch": eff, "lr_rule": rule.name, "lr_rule_source": rule.source,
            "lr_scale": round(scale, 4), "guard": chk.reason,
            "refused_larger": "; ".join(refused) or None}
        if not chk.passed:
            plan.decisions.append(Decision(Knob.BATCH_CHANGE, False, chk.reason,
                                           value=str(to), details=details))
            return plan
        cand = dataclasses.replace(
            plan, effective_batch=to, micro_batch=to, lr_scale=scale, lr_rule=rule.name,
            user_effective_batch=eff, decisions=[])
        steps = self.steps_for(cand)  # the same samples in fewer, larger steps
        cand.lr_warmup_steps = rule.warmup_steps(steps)
        details["lr_warmup_steps"] = cand.lr_warmup_steps
        kept = self.decide(plan, cand, Decision(Knob.BATCH_CHANGE, False, "", value=str(to),
                                                numerics=chk.reason, details=details))
        if kept is cand:
            cand.notes.append(
                f"The optimization changed: effective batch {eff} → {to} (allowed by "
                f"--allow-batch-change), learning rate × {scale:.3g} ({rule.name} rule, "
                f"{rule.source})" + (f", reached over {cand.lr_warmup_steps:,} warm-up steps"
                                     if cand.lr_warmup_steps else "")
                + f"; the same samples take {steps:,} steps instead of {self.run_steps:,}. "
                "Validate before adopting it: train it to your usual end and compare the "
                "validation loss and metrics with your baseline's; build learning-rate "
                "schedulers after apply_plan (they read the rates it sets), or pass those "
                "built before: apply_plan(..., schedulers=[scheduler]).")
        return kept

    def precision(self, plan: TunePlan) -> tuple[TunePlan, list[NumericsCheck]]:
        checks = []
        for prec, why in supported(self.device).items():
            if prec == "fp32":
                continue
            if why is not None:
                plan.decisions.append(Decision(Knob.PRECISION, False, why, value=prec))
                continue
            s = fresh(self.factory)
            batches = [map_tensors(b, lambda t: t.to(self.device)) for b in
                       first_batches(s.loader, self.effective, self.cfg.numerics_steps)]
            chk = worst_check(self.agree.run(functools.partial(
                check_numerics, s.model, s.optimizer, batches, plan.micro_batch, s.loss_fn,
                prec, self.device, self.cfg.tolerance), f"numerics {prec}"))
            checks.append(chk)
            self.log(f"  numerics {prec}: {chk.reason}")
            if not chk.passed:
                plan.decisions.append(Decision(Knob.PRECISION, False, chk.reason, value=prec))
                continue
            cand = dataclasses.replace(plan, precision=prec, decisions=[])
            plan = self.decide(plan, cand, Decision(Knob.PRECISION, False, "", value=prec,
                                                    numerics=chk.reason))
        return plan, checks

    def precision_again(self, plan: TunePlan) -> TunePlan:
        """A 16-bit precision that passed the numerics guard but was not faster in NCHW is
        tried once more with channels_last: the two knobs interact (cuDNN's fast bf16/fp16
        convolutions are NHWC; in NCHW it transposes around them — NVIDIA's "Convolutional
        Layers User's Guide", tensor layouts)."""
        if plan.precision not in ("fp32", "tf32"):
            return plan
        refused = [d for d in plan.decisions
                   if d.knob is Knob.PRECISION and d.value in SIXTEEN_BIT and not d.kept
                   and d.numerics is not None and not d.again]
        for d in refused:
            assert d.value is not None
            cand = dataclasses.replace(plan, precision=d.value, decisions=[])
            before = plan
            plan = self.decide(plan, cand, Decision(
                Knob.PRECISION, False, "", value=d.value, again=True, context="channels_last",
                numerics=d.numerics))
            if plan is not before:
                break
        return plan

    def kernels(self, plan: TunePlan) -> tuple[TunePlan, list[AttentionSite]]:
        s = fresh(self.factory)
        first = map_tensors(next(iter(s.loader)), lambda t: t.to(self.device))
        sites = find_unfused_attention(s.model, first, s.loss_fn)
        for site in sites:
            plan.decisions.append(Decision(
                Knob.SDPA, False,
                f"hand-written attention at {site.location} (scores {list(site.score_shape)}, "
                f"{site.calls_per_forward}× per forward): replace matmul→softmax→matmul with "
                "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...) — a "
                "code change, so not applied or measured here",
                details={"location": site.location}))
        if self.conv:
            plan = self.decide(plan, dataclasses.replace(plan, channels_last=True, decisions=[]),
                               Decision(Knob.CHANNELS_LAST, False, ""))
            if plan.channels_last:
                plan = self.precision_again(plan)
        if cudnn_benchmark_applies(self.conv, self.device):
            plan = self.decide(plan, dataclasses.replace(plan, cudnn_benchmark=True,
                                                         decisions=[]),
                               Decision(Knob.CUDNN_BENCHMARK, False, ""))
        for impl in self.opt_impls:
            before = plan
            plan = self.decide(plan, dataclasses.replace(plan, optimizer_impl=impl, decisions=[]),
                               Decision(Knob.OPTIMIZER, False, "", value=impl))
            if plan is not before:
                break
        if self.cfg.try_compile:
            plan = self.compile(plan)
            plan = self.cuda_graphs(plan)
        return plan, sites

    def cuda_graphs(self, plan: TunePlan) -> TunePlan:
        """The step replayed as CUDA graphs (torch.compile's reduce-overhead mode), where the
        step allows it (:func:`~redline.tune.cuda_graphs.graph_refusal`); measured and
        amortized like torch.compile. Off CUDA there is nothing to replay: not tried."""
        if self.device.type != "cuda":
            return plan
        s = fresh(self.factory)
        batches = first_batches(s.loader, plan.micro_batch, SHAPE_BATCHES)
        on_device = map_tensors(batches[0], lambda t: t.to(self.device))
        why = graph_refusal(batches, graph_blockers(s.model, on_device, s.loss_fn))
        if why is not None:
            plan.decisions.append(Decision(Knob.CUDA_GRAPHS, False, f"not tried: {why}"))
            self.log(f"  CUDA graphs: not tried ({why})")
            return plan
        return self.compile(plan, mode="reduce-overhead")

    def ddp(self, plan: TunePlan) -> TunePlan:
        """A DDP model's bucket capacity (one candidate, :func:`bucket_candidate`) and
        ``gradient_as_bucket_view``, each kept only when measured faster."""
        s = fresh(self.factory)
        ddp = as_ddp(s.model)
        if ddp is None:
            return plan
        why = cannot_rewrap(ddp)
        if why is not None:
            plan.decisions.append(Decision(Knob.DDP_BUCKET, False, f"not tried: {why}"))
            return plan
        cand_mb = bucket_candidate(ddp)
        view = bool(getattr(ddp, "gradient_as_bucket_view", False))
        del s, ddp
        if cand_mb is not None:
            mb, why = cand_mb
            settings = dataclasses.replace(plan.ddp, bucket_cap_mb=round(mb, 4))
            plan = self.decide(plan, dataclasses.replace(plan, ddp=settings, decisions=[]),
                               Decision(Knob.DDP_BUCKET, False, "", value=f"{mb:.4g}",
                                        details={"why": why}))
        if not view:
            settings = dataclasses.replace(plan.ddp, gradient_as_bucket_view=True)
            plan = self.decide(plan, dataclasses.replace(plan, ddp=settings, decisions=[]),
                               Decision(Knob.DDP_BUCKET_VIEW, False, ""))
        return plan

    def compile(self, plan: TunePlan, mode: str | None = None) -> TunePlan:
        """torch.compile (``mode`` 'reduce-overhead': CUDA graphs), kept only if the whole
        planned run is shorter with its compile time (:func:`~redline.tune.decide.
        one_off_pays`)."""
        knob = Knob.COMPILE if mode is None else Knob.CUDA_GRAPHS
        name = "torch.compile" if mode is None else f"torch.compile(mode={mode!r})"
        cand = dataclasses.replace(plan, compile=True, compile_mode=mode, decisions=[])
        policy = self.policy
        t0 = time.perf_counter()
        try:
            # The first steps carry the compile; the trial's warm-up absorbs them.
            m = policy.measure(cand, name, True)
        except (SetupError, NonFiniteLossError, RanksDivergedError):
            raise
        except Exception as e:  # no compiler here; an operator a CUDA graph cannot capture
            plan.decisions.append(Decision(knob, False,
                                           f"failed: {type(e).__name__}: {e}"[:400]))
            self.log(f"  {name}: failed ({type(e).__name__}), not kept")
            return plan
        wall = self.agree.max(time.perf_counter() - t0, "compile trial wall time")

        if not policy.current_step_only or not policy.current_tp:
            # The compiled trial times the step alone: so must the eager side it is held to.
            policy.current_tp = policy.measure(plan, "eager", True).throughput_samples_per_s
            policy.current_step_only = True
        cur = policy.current_tp or 0.0
        new = m.throughput_samples_per_s or 0.0
        if not (cur and new and m.step_time_s):
            return plan
        eff = plan.effective_batch
        steady = wall - m.steps * m.step_time_s
        compile_s = max(0.0, steady - (max(2, self.cfg.warmup_steps) + 1) * m.step_time_s)
        n = self.steps_for(plan)
        kept, t_eager, t_comp = one_off_pays(compile_s, eff / cur, eff / new, n,
                                             self.cfg.min_gain)
        now = ("eager" if not plan.compile else
               f"compiled{'' if plan.compile_mode is None else f' ({plan.compile_mode})'}")
        d = Decision(knob, kept,
                     f"over {n:,} steps: {t_comp:,.0f} s compiled (incl. {compile_s:.1f} s "
                     f"compiling{'' if mode is None else ' and recording the graphs'}) vs "
                     f"{t_eager:,.0f} s {now}",
                     samples_per_s_before=cur, samples_per_s_after=new, measured="step alone",
                     details={"compile_s": round(compile_s, 2)})
        self.log(f"  {name}: {d.reason} — {'kept' if kept else 'not kept'}")
        if kept:
            cand.decisions = plan.decisions
            cand.decisions.append(d)
            policy.current_tp = new
            return cand
        plan.decisions.append(d)
        return plan
