"""Batch-size finder by prediction, not by crashing.

Lightning's BatchSizeFinder and Accelerate's ``find_executable_batch_size`` learn only from
out-of-memory errors (a doubling then bisecting search: every probe that does not fit is an
OOM; ``benchmarks/batch_finder.py`` counts them side by side).
DeepSpeed predicts from one probe and an Adam-only formula. Here:

1. **Probe at batch 1** (also answers "does it fit at all"), recording live device bytes after
   every allocation of one steady-state step (optimizer state already built).
2. **Probe at a batch that is safe by construction**: if each allocation point *j* holds
   ``c_j + s_j·b`` bytes with ``c_j ≥`` the persistent bytes *E* (weights, optimizer state), then
   ``live_j(b) − E ≤ b·(live_j(1) − E)``, so ``b₂ = ⌊(usable − E) / (peak(1) − E)⌋`` cannot OOM.
3. **Fit every allocation point** against the batch from the two timelines (a step runs the same
   ops in the same order at any batch, so point *j* of one timeline is point *j* of the other)
   and predict ``peak(b) = max_j (c_j + s_j·b)``. Fitting only the two peaks is what overshoots:
   at small batches the peak is set by gradients and the optimizer step, at large ones by the
   first backward layers (a max of affine functions is convex, so the secant through small
   probes under-estimates the slope). When the timelines differ in length (data-dependent ops)
   the finder falls back to the peaks' secant and says so.
4. **Verify** at the predicted maximum; if it overshoots, re-fit through the two largest
   probes and verify once more; never more than 4 trials.

Headroom: on CUDA, the caching allocator's measured overhead (reserved ÷ counted bytes at
the largest probe: fragmentation and block rounding) shrinks the usable memory; probes use the
largest sample of the dataset, so variable-length data cannot exceed them. On the simulated
budget there is no allocator, so the overhead is 0 (said in the result).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from redline.core.errors import RedlineError
from redline.measure.agree import Agreement
from redline.tune.memory_budget import MemoryBudget

MAX_TRIALS = 4
"""Issue 5's budget of trials (probes + verifications)."""
LONG_REACH = 4
"""A prediction beyond 4× the largest verified batch is approached in two steps."""
APPROACH = 0.9
"""The first of those steps goes 90 % of the way (from the largest verified batch)."""
SECANT_SHARE = 0.5
"""A last trial predicted by a secant of peaks goes half the way (secants overshoot, and an
out-of-memory error on the last trial gains nothing)."""


class BatchDoesNotFitError(RedlineError, RuntimeError):
    """Even one sample per micro-batch exceeds the device memory."""

    params: int | None = None
    """The model's trainable parameters, when the caller knows them (for ``redline plan``)."""
    global_batch: int | None = None
    """Samples per optimizer step over the whole job."""


@dataclass(slots=True, kw_only=True)
class Probe:
    batch: int
    peak_bytes: int | None
    """Peak live bytes counted during the recorded step (None after an OOM)."""
    oom: bool
    seconds: float
    role: str
    """'probe' | 'verify'."""


@dataclass(slots=True, kw_only=True)
class BatchSearch:
    """What the finder chose and how."""

    batch: int
    """The largest micro-batch verified to fit (≤ ``max_batch``)."""
    max_batch: int
    """Upper bound searched (the effective batch: a larger micro-batch would change it)."""
    limit_bytes: int | None
    """Device memory the search had (None: no limit)."""
    usable_bytes: int | None
    """``limit_bytes`` less the headroom."""
    allocator_overhead: float | None
    """Reserved ÷ counted bytes − 1 at the largest probe (CUDA); 0.0 on the simulated budget;
    None without a limit."""
    overhead_source: str
    persistent_bytes: int
    """Weights, buffers and optimizer state before the step."""
    predicted_batch: int | None
    fit: str
    """'per-allocation' | 'peak-secant' | 'none' (no limit, or the cap fitted at once)."""
    probes: list[Probe] = field(default_factory=list)
    reason: str = ""
    seconds: float = 0.0

    @property
    def trials(self) -> int:
        return len(self.probes)

    @property
    def ooms(self) -> int:
        return sum(probe.oom for probe in self.probes)


@dataclass(slots=True, kw_only=True)
class _Timeline:
    batch: int
    points: list[int]
    peak: int
    ops: list[str] = field(default_factory=list)
    """The operator behind each point (aligns timelines whose op sequences differ)."""


def _cuda_cleanup() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class _Prober:
    def __init__(self, step: Callable[[int], None], state: Callable[[], Iterable[torch.Tensor]],
                 limit: int | None, cuda: torch.device | None, agree: Agreement) -> None:
        self.step, self.state, self.limit, self.cuda = step, state, limit, cuda
        self.agree = agree
        self.warm = False
        self.probes: list[Probe] = []
        self.cuda_reserved_peak = 0

    def run(self, batch: int, role: str) -> _Timeline | None:
        """One probe on every rank of the job: it fits only if it fit on all of them, and the
        job's timeline is the one of the rank with the highest peak (so every rank predicts
        the same batch from the same numbers)."""
        start_s = time.perf_counter()
        here = self._here(batch)
        got = self.agree.gather((here, self.cuda_reserved_peak), f"batch probe {batch}")
        self.cuda_reserved_peak = max(reserved for _, reserved in got)
        oom = [rank for rank, (timeline, _) in enumerate(got) if timeline is None]
        seconds = self.agree.max(time.perf_counter() - start_s, f"batch probe {batch} time")
        if oom:
            where = f" (rank {', '.join(map(str, oom))})" if self.agree.world_size > 1 else ""
            self.probes.append(Probe(batch=batch, peak_bytes=None, oom=True, seconds=seconds,
                                     role=role + where))
            return None
        timeline = max((rank_timeline for rank_timeline, _ in got if rank_timeline is not None),
                       key=lambda rank_timeline: rank_timeline.peak)
        self.probes.append(Probe(batch=batch, peak_bytes=timeline.peak, oom=False,
                                 seconds=seconds, role=role))
        return timeline

    def _here(self, batch: int) -> _Timeline | None:
        """This process's probe: its timeline, or None after an out-of-memory error."""
        # On CUDA the real allocator enforces the limit; the mode only counts (no limit).
        budget_limit = None if self.cuda is not None else self.limit
        try:
            with MemoryBudget(budget_limit, existing=self.state()) as budget:
                if not self.warm:
                    # The first step builds lazy optimizer state (Adam moments): constant in
                    # the batch, and present in every later step, so it is not recorded.
                    self.step(batch)
                    self.warm = True
                    budget.reset_peak()
                if self.cuda is not None:
                    torch.cuda.reset_peak_memory_stats(self.cuda)
                budget.record()
                self.step(batch)
                assert budget.timeline is not None
                timeline = _Timeline(batch=batch, points=list(budget.timeline), peak=budget.peak,
                                     ops=list(budget.timeline_ops))
            if self.cuda is not None:
                self.cuda_reserved_peak = torch.cuda.max_memory_reserved(self.cuda)
        except torch.OutOfMemoryError:
            _cuda_cleanup()
            return None
        return timeline


def _fit(lo: _Timeline, hi: _Timeline) -> tuple[str, list[tuple[float, float]]]:
    """(method, [(c_j, s_j)]) with live_j(b) = c_j + s_j·b, one line per point of ``hi``.

    Same op sequence: point j of one timeline is point j of the other. Otherwise the two are
    aligned by their operators (a longest-matching-blocks diff: batch 1 often takes other
    kernels, e.g. an addmm where larger batches run mm + add); a point of ``hi`` with no
    partner takes its nearest aligned neighbour's line and, on the safe side, scales its own
    extra bytes with the batch (an allocation that is in fact constant is over-predicted,
    never under-)."""
    db = hi.batch - lo.batch
    if len(lo.points) == len(hi.points) and lo.points and (
            not lo.ops or not hi.ops or lo.ops == hi.ops):
        return "per-allocation", [(a - (b - a) / db * lo.batch, (b - a) / db)
                                  for a, b in zip(lo.points, hi.points, strict=True)]
    if lo.ops and hi.ops and len(lo.ops) == len(lo.points) and len(hi.ops) == len(hi.points):
        import difflib

        sm = difflib.SequenceMatcher(a=lo.ops, b=hi.ops, autojunk=False)
        pair: dict[int, int] = {}
        for blk in sm.get_matching_blocks():
            for k in range(blk.size):
                pair[blk.b + k] = blk.a + k
        if len(pair) >= 0.5 * len(hi.points):
            lines: list[tuple[float, float] | None] = [None] * len(hi.points)
            for k, j in pair.items():
                a, b = lo.points[j], hi.points[k]
                lines[k] = (a - (b - a) / db * lo.batch, (b - a) / db)
            matched = sorted(pair)
            out: list[tuple[float, float]] = []
            for k, ln in enumerate(lines):
                if ln is None:
                    nb = min(matched, key=lambda m: abs(m - k))
                    c, sl = lines[nb]  # type: ignore[misc]
                    extra = hi.points[k] - (c + sl * hi.batch)
                    ln = (c, sl + max(0.0, extra) / hi.batch) if extra > 0 else (c, sl)
                out.append(ln)
            return "per-allocation (aligned by operator)", out
    s = (hi.peak - lo.peak) / db
    return "peak-secant", [(lo.peak - s * lo.batch, s)]


def _predict(lines: list[tuple[float, float]], usable: float, cap: int) -> int:
    """Largest b ≤ cap with max_j(c_j + s_j·b) ≤ usable (0 if none)."""
    best = float(cap)
    for c, s in lines:
        if s > 0:
            best = min(best, (usable - c) / s)
        elif c > usable:
            return 0
    return max(0, min(cap, math.floor(best + 1e-9)))


def _does_not_fit(limit: int | None, persistent: int) -> BatchDoesNotFitError:
    lim = f"{limit / 2**20:,.1f} MiB" if limit else "the device memory"
    return BatchDoesNotFitError(
        f"the model does not fit at micro-batch 1: one training step needs more than {lim} "
        f"(weights, gradients and optimizer state alone take {persistent / 2**20:,.1f} MiB). "
        "Options: (1) lower precision — bf16 autocast halves activations, bf16 weights halve "
        "the rest; (2) activation checkpointing (torch.utils.checkpoint) trades recompute for "
        "activation memory; (3) shard weights, gradients and optimizer state over devices "
        "(FSDP / ZeRO) or offload optimizer state to the host; (4) a smaller model or shorter "
        "sequences.")


def find_batch_size(step: Callable[[int], None], *,
                    state: Callable[[], Iterable[torch.Tensor]],
                    max_batch: int, limit_bytes: int | None,
                    cuda_device: torch.device | None = None,
                    agree: Agreement | None = None) -> BatchSearch:
    """The largest micro-batch that fits, predicted from probes and verified.

    Args:
        step: runs one full training step (forward, backward, optimizer step, gradients set to
            None) at the given micro-batch, built from the dataset's largest sample. The caller
            restores weights and optimizer state afterwards.
        state: the tensors that persist between steps (parameters, buffers, optimizer state).
        max_batch: the largest micro-batch worth having (the effective batch).
        limit_bytes: device memory available to the job; None = no limit (CPU without a
            simulated budget): the cap is verified once.
        cuda_device: the CUDA device when training there (the real allocator enforces the
            limit; its overhead sets the headroom).
        agree: the job's ranks, each probing in step with the others (the step's collectives
            need all of them): the least memory of any rank is the limit, and a probe fits
            only where it fit on every rank. A rank that runs out of memory inside a step
            while its peers wait in that step's collective stops the job (as any such error
            does under DDP); with equal devices and shards, all ranks run out together.

    Returns:
        A :class:`BatchSearch`: the chosen micro-batch (1..``max_batch``), the limit and usable
        bytes, the allocator overhead, the predicted batch, every probe and the reason.

    Raises:
        BatchDoesNotFitError: batch 1 does not fit; the message lists the options.
        ValueError: ``max_batch`` is below 1.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    t_begin = time.perf_counter()
    persistent = sum(int(tensor.untyped_storage().nbytes()) for tensor in
                     {id(tensor.untyped_storage()): tensor for tensor in state()}.values())
    job = agree or Agreement()
    limits = [limit for limit in job.gather(limit_bytes, "batch limit") if limit is not None]
    limit_bytes = min(limits) if limits else None
    prober = _Prober(step, state, limit_bytes, cuda_device, job)

    res = BatchSearch(batch=0, max_batch=max_batch, limit_bytes=limit_bytes, usable_bytes=None,
                      allocator_overhead=None, overhead_source="", persistent_bytes=persistent,
                      predicted_batch=None, fit="none", probes=prober.probes)

    def done(batch: int, reason: str) -> BatchSearch:
        res.batch, res.reason = batch, reason
        res.seconds = time.perf_counter() - t_begin
        return res

    if limit_bytes is None:
        res.overhead_source = "no memory limit: nothing to leave headroom for"
        timeline = prober.run(max_batch, "verify")
        if timeline is None:
            raise RuntimeError("out of memory without a memory limit (host RAM?)")
        return done(max_batch, f"no device-memory limit: the micro-batch is the effective batch "
                               f"({max_batch}); its step peaked at {timeline.peak / 2**20:,.1f} MiB")

    one = prober.run(1, "probe")
    if one is None:
        raise _does_not_fit(limit_bytes, persistent)
    overhead = 0.0
    res.overhead_source = ("simulated budget: no caching allocator, so no fragmentation "
                           "headroom")
    usable = float(limit_bytes)
    if max_batch == 1:
        res.usable_bytes = int(usable)
        res.allocator_overhead = overhead
        return done(1, "the effective batch is 1")
    per_sample = max(1, one.peak - persistent)
    predicted = min(max_batch, max(2, math.floor((usable - persistent) / per_sample)))
    two = prober.run(predicted, "probe")
    if two is None:
        # The safety bound assumes c_j ≥ E; a model that frees persistent tensors mid-step can
        # break it. Fall back to batch 1's result rather than guess.
        return done(1, f"probe at {predicted} ran out of memory although the bound said it was safe: "
                       "keeping batch 1")
    if prober.cuda is not None:
        overhead = max(0.0, prober.cuda_reserved_peak / max(1, two.peak) - 1.0)
        res.overhead_source = (f"CUDA allocator: reserved {prober.cuda_reserved_peak / 2**20:,.1f} "
                               f"MiB for {two.peak / 2**20:,.1f} MiB counted at batch {predicted}")
    usable = limit_bytes / (1.0 + overhead)
    res.allocator_overhead, res.usable_bytes = overhead, int(usable)
    if predicted == max_batch:
        return done(predicted, f"the effective batch ({max_batch}) fits: peak "
                        f"{two.peak / 2**20:,.1f} MiB of {usable / 2**20:,.1f} MiB usable")
    good, fit_from = two, (one, two)
    if _fit(one, two)[0] == "peak-secant" and predicted >= 4:
        # The step at batch 1 took another path than at b2 (whole sequences of operators
        # differ, e.g. a model that works in chunks above some batch): a secant from batch 1
        # would mix the two. A probe at b2/2 (safe: below b2, which fit) gives a second point
        # on b2's side to fit through.
        half = prober.run(predicted // 2, "probe")
        if half is not None:
            fit_from = (half, two)
    while len(prober.probes) < MAX_TRIALS:
        method, lines = _fit(*fit_from)
        res.fit = method
        pred = _predict(lines, usable, max_batch)
        res.predicted_batch = pred if res.predicted_batch is None else res.predicted_batch
        if pred <= good.batch:
            break
        left = MAX_TRIALS - len(prober.probes)
        if left >= 2 and pred > LONG_REACH * good.batch:
            # A long extrapolation (a model whose memory grows other than linearly far from
            # the probes, or takes another path there): first verify most of the way, then
            # fit again from there.
            pred = good.batch + max(1, math.floor(APPROACH * (pred - good.batch)))
        elif left == 1 and not method.startswith("per-allocation"):
            # The last trial on a secant of peaks (the least trusted fit: beyond its right
            # point a secant of a convex peak under-states the slope, so it overshoots): an
            # out-of-memory error there would gain nothing; stop short of the prediction.
            pred = good.batch + max(1, math.floor(SECANT_SHARE * (pred - good.batch)))
        timeline = prober.run(pred, "verify")
        if timeline is not None and timeline.peak <= usable:
            prev, good = good, timeline
            if pred == max_batch or len(prober.probes) >= MAX_TRIALS:
                break
            # Verified: one more step up only if the re-fit through the two largest verified
            # probes predicts more.
            fit_from = (prev, timeline)
            method, lines = _fit(*fit_from)
            if _predict(lines, usable, max_batch) <= pred:
                break
            continue
        # Overshot (or the real allocator said no): re-fit through the two largest probes.
        if timeline is None:
            # Out of memory: no timeline to fit. Halve the gap to the largest verified batch
            # with the trials left (each verified probe is kept; never less than it).
            failed = pred
            while len(prober.probes) < MAX_TRIALS and failed - good.batch > 1:
                mid = (good.batch + failed) // 2
                got = prober.run(mid, "verify")
                if got is not None and got.peak <= usable:
                    good = got
                else:
                    failed = mid
            break
        fit_from = (good, timeline)
    return done(good.batch, f"{res.fit} fit predicted {res.predicted_batch}; verified "
                            f"{good.batch} at {good.peak / 2**20:,.1f} MiB of "
                            f"{usable / 2**20:,.1f} MiB usable")
