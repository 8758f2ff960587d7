"""``redline tune``: the systematic path on the user's own model.

data pipeline → batch size with gradient accumulation → mixed precision → kernels; each change
is kept only when it measured faster (by ``min_gain``, above the noise by a rank test on per-step
times) and, for precision, numerically safe.
Every trial starts from a fresh setup (:mod:`redline.tune.trial`); the plan is remembered per
model signature, device, precision and input shapes (:class:`redline.tune.PlanStore`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from redline.data.autotune import autotune_loader, rebuild_factory
from redline.data.prefetcher import map_tensors
from redline.tune.batch_finder import BatchSearch, find_batch_size
from redline.tune.kernels import (
    AttentionSite,
    cudnn_benchmark_applies,
    find_unfused_attention,
    has_conv2d,
    optimizer_impls,
)
from redline.tune.limits import Limit, remaining_limits
from redline.tune.plan import PlanKey, PlanStore, TunePlan, plan_key
from redline.tune.precision import (
    NumericsCheck,
    NumericsTolerance,
    autocast_for,
    check_numerics,
    make_scaler,
    supported,
)
from redline.tune.runtime import TunedLoop, train_step
from redline.tune.setup import Factory
from redline.tune.stats import p_smaller, smallest_p
from redline.tune.trial import TrialMetrics, endless, fresh, measure, probe_batch, state_tensors

DEFAULT_RUN_STEPS = 10_000


@dataclass(kw_only=True, slots=True)
class TuneConfig:
    """How hard ``tune`` looks, and what the projections assume."""

    steps_per_trial: int = 6
    """Measured optimizer steps per throughput trial (after warm-up)."""
    rounds: int = 2
    """Each comparison alternates current and candidate this many times (A B A B)."""
    warmup_steps: int = 2
    """Steps before each trial's measurement (allocator, workers, compile)."""
    numerics_steps: int = 6
    """Steps of the fp32-vs-candidate comparison."""
    tolerance: NumericsTolerance = field(default_factory=NumericsTolerance)
    """How far a lower precision may drift from fp32."""
    min_gain: float = 0.05
    """A change is kept only if it is ≥ 5 % faster (smaller differences are noise on shared
    machines; the loader autotune uses the same threshold)."""
    max_p: float = 0.05
    """…and, for knobs timed on the step alone, its per-step times are smaller than the current
    plan's with a one-sided Mann–Whitney p-value below this (tune/stats.py). Where the trials
    are too short for any outcome to reach it, and for end-to-end (loader) comparisons, whose
    per-step times are bursty, only ``min_gain`` decides; the decision says which."""
    run_steps: int | None = None
    """Optimizer steps of the planned job (overrides ``TrainSetup.run_steps``)."""
    price_per_device_hour: float | None = None
    """Currency units per device-hour for the cost projection; None = cost unknown."""
    loader_batches_per_trial: int = 16
    tune_loader: bool = True
    tune_batch: bool = True
    tune_precision: bool = True
    tune_kernels: bool = True
    try_compile: bool = True
    """torch.compile is measured (its compile time is amortized over ``run_steps``)."""
    store_dir: str | None = None
    """Plan store folder; None = $REDLINE_CACHE_DIR/plans or ~/.cache/redline/plans."""
    reuse: bool = True
    """Reuse a remembered plan for the same key instead of searching again."""

    def __post_init__(self) -> None:
        for name in ("steps_per_trial", "rounds", "numerics_steps", "loader_batches_per_trial"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.min_gain < 1:
            raise ValueError(f"min_gain must be in [0, 1), got {self.min_gain}")
        if not 0 < self.max_p <= 1:
            raise ValueError(f"max_p must be in (0, 1], got {self.max_p}")
        if self.run_steps is not None and self.run_steps < 1:
            raise ValueError(f"run_steps must be >= 1, got {self.run_steps}")
        if self.price_per_device_hour is not None and self.price_per_device_hour < 0:
            raise ValueError(f"price_per_device_hour must be >= 0, got "
                             f"{self.price_per_device_hour}")


@dataclass(slots=True)
class Projection:
    """The planned job at a measured speed."""

    run_steps: int
    job_time_s: float | None
    cost: float | None
    energy_kwh: float | None


@dataclass(slots=True)
class TuneResult:
    plan: TunePlan
    before: TrialMetrics
    after: TrialMetrics
    before_projection: Projection
    after_projection: Projection
    run_steps_source: str
    price_per_device_hour: float | None
    batch_search: BatchSearch | None = None
    numerics: list[NumericsCheck] = field(default_factory=list)
    attention_sites: list[AttentionSite] = field(default_factory=list)
    reused_plan: str | None = None
    """Path of the remembered plan that was reused, if one was."""
    plan_path: str | None = None
    seconds: float = 0.0
    limits: list[Limit] = field(default_factory=list)
    """What still limits the tuned step (:func:`redline.tune.limits.remaining_limits`)."""

    @property
    def speedup(self) -> float | None:
        a, b = self.after.throughput_samples_per_s, self.before.throughput_samples_per_s
        return a / b if a and b else None


def project(m: TrialMetrics, run_steps: int, price: float | None, devices: int = 1) -> Projection:
    t = m.step_time_s * run_steps if m.step_time_s else None
    cost = t / 3600 * price * devices if t is not None and price is not None else None
    e = m.energy_j_per_step * run_steps / 3.6e6 if m.energy_j_per_step is not None else None
    return Projection(run_steps, t, cost, e)


def _merge(ms: list[TrialMetrics]) -> TrialMetrics:
    """One row from alternating trials of one configuration: throughput over all measured
    steps, medians of step times, means of fractions; memory, MFU and energy from the trials
    that measured them."""
    import statistics

    def mean(xs: list[float | None]) -> float | None:
        v = [x for x in xs if x is not None]
        return statistics.fmean(v) if v else None

    steps = sum(m.steps for m in ms)
    tp = [(m.throughput_samples_per_s, m.steps) for m in ms if m.throughput_samples_per_s]
    first = ms[0]
    return TrialMetrics(
        first.label,
        sum(t * n for t, n in tp) / sum(n for _, n in tp) if tp else None,
        mean([m.step_time_s for m in ms]),
        mean([m.data_wait_fraction for m in ms]),
        mean([m.device_busy_fraction for m in ms]),
        mean([m.mfu for m in ms]),
        next((m.peak_memory_bytes for m in ms if m.peak_memory_bytes is not None), None),
        first.peak_memory_source,
        mean([m.energy_j_per_step for m in ms]),
        first.energy_source, steps, sum(m.wall_s for m in ms),
        step_times_s=[t for m in ms for t in m.step_times_s],
        device_busy_kernels_fraction=next((m.device_busy_kernels_fraction for m in ms
                                           if m.device_busy_kernels_fraction is not None), None),
        device_busy_kernels_source=next((m.device_busy_kernels_source for m in ms
                                         if m.device_busy_kernels_fraction is not None),
                                        first.device_busy_kernels_source))


def compare(factory: Factory, before: TunePlan, after: TunePlan, cfg: TuneConfig,
            ) -> tuple[TrialMetrics, TrialMetrics]:
    """Before and after, alternating ``cfg.rounds`` times; the first round also counts FLOPs
    (MFU) and peak memory, and on CUDA traces a few steps for the kernel-union device busy
    (the CUDA-event span is an upper bound that a host-bound loop inflates)."""
    rows: dict[str, list[TrialMetrics]] = {"before": [], "after": []}
    cuda = before.key.device.startswith("cuda")
    for r in range(cfg.rounds):
        for label, pl in (("before", before), ("after", after)):
            rows[label].append(measure(factory, pl, label, steps=cfg.steps_per_trial,
                                       warmup=cfg.warmup_steps,
                                       count_flops=r == 0 and not pl.compile, memory=r == 0,
                                       trace=r == 0 and cuda))
    return _merge(rows["before"]), _merge(rows["after"])


def baseline_plan(key: PlanKey, micro: int, effective: int,
                  loader: DataLoader[Any] | None = None) -> TunePlan:
    """The user's configuration as a plan: their micro-batch and accumulation, fp32, and
    their DataLoader's settings (workers, prefetch, pinning, persistence), so "before" is
    what they run, not a worker-less stand-in."""
    if loader is None or loader.num_workers == 0:
        return TunePlan(key=key, effective_batch=effective, micro_batch=micro,
                        pin_memory=bool(loader is not None and loader.pin_memory))
    return TunePlan(key=key, effective_batch=effective, micro_batch=micro,
                    num_workers=loader.num_workers, prefetch_factor=loader.prefetch_factor,
                    pin_memory=loader.pin_memory, persistent_workers=loader.persistent_workers)


class _Path:
    def __init__(self, factory: Factory, cfg: TuneConfig, log: Callable[[str], None]) -> None:
        self.factory, self.cfg, self.log = factory, cfg, log
        s = fresh(factory)
        self.device = torch.device(s.device)
        first = next(iter(DataLoader(s.loader.dataset, batch_size=1,
                                     collate_fn=s.loader.collate_fn)))
        self.key = plan_key(s.model, self.device, "fp32", first)
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
        self.current_tp: float | None = None
        self.current_step_only = False
        """Whether ``current_tp`` was measured on the step alone (compile compares with it)."""

    def trial(self, plan: TunePlan, label: str, step_only: bool) -> TrialMetrics:
        return measure(self.factory, plan, label, steps=self.cfg.steps_per_trial,
                       warmup=self.cfg.warmup_steps, step_only=step_only)

    def ab(self, plan: TunePlan, candidate: TunePlan, what: str, step_only: bool
           ) -> tuple[float, float, list[float], list[float]]:
        """(current, candidate) samples/s and per-step seconds, measured alternately
        (A B A B …): this machine's speed drifts within minutes, so two trials far apart
        would compare the drift."""
        tot = {"a": [0.0, 0.0], "b": [0.0, 0.0]}
        times: dict[str, list[float]] = {"a": [], "b": []}
        for _ in range(self.cfg.rounds):
            for side, pl in (("a", plan), ("b", candidate)):
                m = self.trial(pl, what, step_only)
                if m.throughput_samples_per_s and m.step_time_s:
                    tot[side][0] += m.throughput_samples_per_s * m.steps
                    tot[side][1] += m.steps
                    times[side] += m.step_times_s
        cur = tot["a"][0] / tot["a"][1] if tot["a"][1] else 0.0
        new = tot["b"][0] / tot["b"][1] if tot["b"][1] else 0.0
        return cur, new, times["a"], times["b"]

    def decide(self, plan: TunePlan, candidate: TunePlan, what: str, *, step_only: bool = True,
               **info: Any) -> TunePlan:
        """Measure ``candidate`` against ``plan`` side by side; keep it if faster.

        ``step_only``: measure the training step alone, on batches fetched beforehand. The
        batch, precision and kernel knobs change the step, not the input; measured end to
        end, a step faster than the input pipeline can feed shows no gain (a greedy path then
        rejects every compute knob while the input is at capacity, and the input is never
        asked to go faster). The data pipeline is tuned again for the final step."""
        try:
            cur, new, t_cur, t_new = self.ab(plan, candidate, what, step_only)
        except Exception as e:  # a knob that cannot run here (compile without a compiler…)
            plan.decisions.append({"step": what, "kept": False, **info,
                                   "reason": f"failed: {type(e).__name__}: {e}"[:400]})
            self.log(f"  {what}: failed ({type(e).__name__}), not kept")
            return plan
        scope = "step alone" if step_only else "end to end"
        gain = bool(cur) and new >= cur * (1 + self.cfg.min_gain)
        p = p_smaller(t_cur, t_new)
        # End to end, loader workers deliver batches in bursts: per-step times alternate
        # between waits and none, so they are not comparable one by one (a real 1.26× from a
        # second worker read p = 0.1 here); the throughput over alternating rounds decides.
        testable = step_only and smallest_p(len(t_cur), len(t_new)) < self.cfg.max_p
        kept = gain and (p < self.cfg.max_p or not testable)
        sig = (f"Mann–Whitney p={p:.3g} over {len(t_cur)}+{len(t_new)} steps" if testable
               else "threshold only: per-step times are bursty end to end" if not step_only
               else f"too few steps ({len(t_cur)}+{len(t_new)}) for a significance test")
        reason = (f"{new / cur:.2f}× throughput ({scope}; {sig})" if kept else
                  f"{new:,.0f} vs {cur:,.0f} samples/s ({scope}): not ≥ "
                  f"{self.cfg.min_gain:.0%} faster" if not gain else
                  f"{new / cur:.2f}× but not above the noise ({sig} ≥ {self.cfg.max_p:g})")
        entry = {"step": what, "kept": kept, **info, "samples_per_s_before": cur,
                 "samples_per_s_after": new, "measured": scope,
                 "p_value": p if testable else None, "reason": reason}
        self.log(f"  {what}: {cur:,.0f} → {new:,.0f} samples/s ({scope}) — "
                 f"{'kept' if kept else 'not kept'}"
                 + ("" if kept or not gain else f" (not above the noise: {sig})"))
        self.current_tp = new if kept else cur
        self.current_step_only = step_only
        if kept:
            candidate.decisions = plan.decisions
            candidate.decisions.append(entry)
            return candidate
        plan.decisions.append(entry)
        return plan

    # -- the steps -------------------------------------------------------------------------
    def loader(self, plan: TunePlan, what: str = "data pipeline") -> TunePlan:
        s = fresh(self.factory)
        loop = TunedLoop(plan, s.model, s.optimizer, s.loader, s.loss_fn, self.device)
        make = rebuild_factory(s.loader, batch_size=self.effective)
        dev = self.device

        def consume(batch: Any) -> None:
            loop.step(map_tensors(batch, lambda t: t.to(dev, non_blocking=True)))

        try:
            lp = autotune_loader(make, consume, device=dev.type,
                                 batches_per_trial=self.cfg.loader_batches_per_trial)
        finally:
            loop.close()
        st = lp.settings
        cand = dataclasses.replace(
            plan, num_workers=st.num_workers, prefetch_factor=st.prefetch_factor,
            pin_memory=st.pin_memory, persistent_workers=st.persistent_workers,
            torch_threads=st.torch_threads, prefetch_to_device=dev.type == "cuda",
            decisions=[])
        self.log(f"  loader: {lp.reason}")
        if dataclasses.replace(cand, decisions=plan.decisions) == plan:
            plan.decisions.append({"step": what, "kept": False, "autotune": lp.reason,
                                   "reason": "the autotune chose the current settings"})
            return plan
        return self.decide(plan, cand, what, step_only=False, autotune=lp.reason,
                           trials=len(lp.trials), tuning_s=round(lp.tuning_s, 2))

    def batch(self, plan: TunePlan, what: str = "batch size"
              ) -> tuple[TunePlan, BatchSearch | None]:
        if plan.micro_batch >= plan.effective_batch:
            plan.decisions.append({
                "step": what, "kept": False,
                "reason": f"the micro-batch already is the effective batch "
                          f"({plan.effective_batch}); a larger one would change the "
                          "optimization (set accumulation_steps in the setup to allow a "
                          "larger effective batch)"})
            return plan, None
        s = fresh(self.factory)
        make, how = probe_batch(s, self.device)
        ac = autocast_for(plan.precision, self.device)
        scaler = make_scaler(plan.precision, self.device)
        model = s.model.to(memory_format=torch.channels_last) if plan.channels_last else s.model  # type: ignore[call-overload]

        def step(b: int) -> None:
            train_step(model, s.optimizer, make(b), b, s.loss_fn, ac, scaler)

        limit = self.memory_limit
        if limit is None and self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            limit = free + torch.cuda.memory_allocated(self.device)
        search = find_batch_size(step, state=lambda: state_tensors(model, s.optimizer),
                                 max_batch=plan.effective_batch, limit_bytes=limit,
                                 cuda_device=self.device if self.device.type == "cuda" else None)
        self.log(f"  batch finder: {search.reason} ({search.trials} trials, {search.ooms} OOM; "
                 f"probes use the {how})")
        info: dict[str, Any] = {"finder": search.reason, "trials": search.trials, "ooms": search.ooms,
                "probe_sample": how}
        if search.batch <= plan.micro_batch:
            plan.decisions.append({"step": what, "kept": False, **info,
                                   "reason": f"the largest micro-batch that fits is "
                                             f"{search.batch} (now {plan.micro_batch})"})
            return plan, search
        cand = dataclasses.replace(plan, micro_batch=search.batch, decisions=[])
        return self.decide(plan, cand, what, micro_batch=search.batch,
                           accumulation_steps=cand.accumulation_steps, **info), search

    def precision(self, plan: TunePlan) -> tuple[TunePlan, list[NumericsCheck]]:
        checks = []
        for prec, why in supported(self.device).items():
            if prec == "fp32":
                continue
            if why is not None:
                plan.decisions.append({"step": f"precision {prec}", "kept": False,
                                       "reason": why})
                continue
            s = fresh(self.factory)
            it = endless(rebuild_factory(s.loader, batch_size=self.effective)(
                _no_workers()))
            batches = [map_tensors(next(it), lambda t: t.to(self.device))
                       for _ in range(self.cfg.numerics_steps)]
            chk = check_numerics(s.model, s.optimizer, batches, plan.micro_batch, s.loss_fn,
                                 prec, self.device, self.cfg.tolerance)
            checks.append(chk)
            self.log(f"  numerics {prec}: {chk.reason}")
            if not chk.passed:
                plan.decisions.append({"step": f"precision {prec}", "kept": False,
                                       "reason": chk.reason})
                continue
            cand = dataclasses.replace(plan, precision=prec, decisions=[])
            plan = self.decide(plan, cand, f"precision {prec}", numerics=chk.reason)
        return plan, checks

    def precision_again(self, plan: TunePlan) -> TunePlan:
        """A 16-bit precision that passed the numerics guard but was not faster in NCHW is
        tried once more with channels_last: the two knobs interact (cuDNN's fast bf16/fp16
        convolutions are NHWC; in NCHW it transposes around them). The H200 measured bf16 on
        ResNet-50 at +8.8 % (p=0.17, refused) before channels_last was kept."""
        if plan.precision not in ("fp32", "tf32"):
            return plan
        for d in list(plan.decisions):
            step = str(d.get("step", ""))
            if (step in ("precision bf16", "precision fp16") and not d.get("kept")
                    and "numerics" in d):
                prec = step.split()[1]
                cand = dataclasses.replace(plan, precision=prec, decisions=[])
                before = plan
                plan = self.decide(plan, cand, f"precision {prec} (again, channels_last)",
                                   numerics=d["numerics"])
                if plan is not before:
                    break
        return plan

    def kernels(self, plan: TunePlan) -> tuple[TunePlan, list[AttentionSite]]:
        s = fresh(self.factory)
        first = map_tensors(next(iter(s.loader)), lambda t: t.to(self.device))
        sites = find_unfused_attention(s.model, first, s.loss_fn)
        for site in sites:
            plan.decisions.append({
                "step": "sdpa", "kept": False, "location": site.location,
                "reason": f"hand-written attention at {site.location} (scores "
                          f"{list(site.score_shape)}, {site.calls_per_forward}× per forward): "
                          "replace matmul→softmax→matmul with torch.nn.functional."
                          "scaled_dot_product_attention(q, k, v, is_causal=...) — a code "
                          "change, so not applied or measured here"})
        if self.conv:
            plan = self.decide(plan, dataclasses.replace(plan, channels_last=True, decisions=[]),
                               "channels_last")
            if plan.channels_last:
                plan = self.precision_again(plan)
        if cudnn_benchmark_applies(self.conv, self.device):
            plan = self.decide(plan, dataclasses.replace(plan, cudnn_benchmark=True,
                                                         decisions=[]), "cudnn.benchmark")
        for impl in self.opt_impls:
            before = plan
            plan = self.decide(plan, dataclasses.replace(plan, optimizer_impl=impl, decisions=[]),
                               f"optimizer {impl}")
            if plan is not before:
                break
        if self.cfg.try_compile:
            plan = self.compile(plan)
        return plan, sites

    def compile(self, plan: TunePlan) -> TunePlan:
        cand = dataclasses.replace(plan, compile=True, decisions=[])
        t0 = time.perf_counter()
        try:
            # The first steps carry the compile; the trial's warm-up absorbs them.
            m = measure(self.factory, cand, "compile", steps=self.cfg.steps_per_trial,
                        warmup=max(2, self.cfg.warmup_steps), step_only=True)
        except Exception as e:
            plan.decisions.append({"step": "torch.compile", "kept": False,
                                   "reason": f"failed: {type(e).__name__}: {e}"[:400]})
            self.log(f"  torch.compile: failed ({type(e).__name__}), not kept")
            return plan
        wall = time.perf_counter() - t0
        if not self.current_step_only or not self.current_tp:
            # The compiled trial times the step alone: so must the eager side it is held to.
            self.current_tp = self.trial(plan, "eager", step_only=True).throughput_samples_per_s
            self.current_step_only = True
        cur = self.current_tp or 0.0
        new = m.throughput_samples_per_s or 0.0
        if not (cur and new and m.step_time_s):
            return plan
        eager_step = self.effective / cur
        steady = wall - m.steps * m.step_time_s
        compile_s = max(0.0, steady - (max(2, self.cfg.warmup_steps) + 1) * m.step_time_s)
        n = self.run_steps
        kept, t_eager, t_comp = compile_pays(compile_s, eager_step, self.effective / new, n,
                                             self.cfg.min_gain)
        entry = {"step": "torch.compile", "kept": kept, "compile_s": round(compile_s, 2),
                 "samples_per_s_before": cur, "samples_per_s_after": new,
                 "reason": f"over {n:,} steps: {t_comp:,.0f} s compiled (incl. {compile_s:.1f} s "
                           f"compiling) vs {t_eager:,.0f} s eager"}
        self.log(f"  torch.compile: {entry['reason']} — {'kept' if kept else 'not kept'}")
        if kept:
            cand.decisions = plan.decisions
            cand.decisions.append(entry)
            self.current_tp = new
            return cand
        plan.decisions.append(entry)
        return plan


def compile_pays(compile_s: float, eager_step_s: float, compiled_step_s: float, run_steps: int,
                 min_gain: float) -> tuple[bool, float, float]:
    """(keep, eager job seconds, compiled job seconds incl. compiling): compile is kept only if
    the whole planned run is ≥ ``min_gain`` shorter with it."""
    t_eager = run_steps * eager_step_s
    t_comp = compile_s + run_steps * compiled_step_s
    return t_comp <= t_eager * (1 - min_gain), t_eager, t_comp


def _no_workers() -> Any:
    from redline.data.autotune import LoaderSettings
    return LoaderSettings()


def tune(factory: Factory, config: TuneConfig | None = None,
         log: Callable[[str], None] = lambda s: None) -> TuneResult:
    """Run the path on ``factory``'s setup; return the plan and the before/after numbers.

    Raises:
        SetupError: the factory raised or returned something unusable.
        BatchDoesNotFitError: the model does not fit at micro-batch 1.
        NonFiniteLossError: the loss is NaN/inf in fp32 already.
    """
    cfg = config or TuneConfig()
    t0 = time.perf_counter()
    p = _Path(factory, cfg, log)
    store = PlanStore(cfg.store_dir)
    base = baseline_plan(p.key, p.micro, p.effective, p.user_loader)
    log(f"redline tune: baseline is micro-batch {p.micro} × {p.effective // p.micro} = "
        f"effective batch {p.effective}, fp32, the loader as given ({base.num_workers} "
        f"workers, prefetch {base.prefetch_factor}, pin_memory {base.pin_memory}, persistent "
        f"{base.persistent_workers})")
    reused = store.get(p.key) if cfg.reuse else None
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
        if cfg.tune_batch:
            log("2/4 batch size (effective batch kept)")
            plan, search = p.batch(plan)
        if cfg.tune_precision:
            log("3/4 precision")
            plan, checks = p.precision(plan)
            if (cfg.tune_batch and plan.precision in ("bf16", "fp16")
                    and plan.micro_batch < plan.effective_batch):
                # 16-bit activations take about half the memory: a larger micro-batch may fit.
                log("batch size, again (16-bit activations are smaller)")
                plan, again = p.batch(plan, "batch size (again)")
                search = again or search
        if cfg.tune_kernels:
            log("4/4 kernels")
            plan, sites = p.kernels(plan)
            if (cfg.tune_batch and plan.precision in ("bf16", "fp16")
                    and plan.micro_batch < plan.effective_batch
                    and not any(d["step"] == "batch size (again)" for d in plan.decisions)):
                # 16-bit kept only with channels_last (precision_again): the same reason to
                # look at the batch again as after the precision step.
                log("batch size, again (16-bit activations are smaller)")
                plan, again = p.batch(plan, "batch size (again)")
                search = again or search
        if cfg.tune_loader and any(
                d["kept"] for d in plan.decisions if not d["step"].startswith("data")):
            # A faster step moves the bottleneck to the input pipeline: provision it for the
            # final step (the loader autotune stops at once if the input keeps up).
            log("data pipeline, again (the step got faster)")
            plan = p.loader(plan, "data pipeline (again)")
    log("measuring before and after, side by side...")
    before, after = compare(factory, base, plan, cfg)
    path_str = None
    if reused is None:
        path_str = str(store.put(plan))
    return TuneResult(plan, before, after, project(before, p.run_steps, cfg.price_per_device_hour),
                      project(after, p.run_steps, cfg.price_per_device_hour),
                      p.run_steps_source, cfg.price_per_device_hour, search, checks, sites,
                      str(store.path(p.key)) if reused is not None else None, path_str,
                      time.perf_counter() - t0, remaining_limits(after))
