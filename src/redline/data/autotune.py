"""DataLoader autotune: settings found by measuring the real loop, not by folklore.

"4–8 workers per GPU" is a common starting point; this measures instead. It times the
consumer with data ready (the device's consumption rate, the ceiling no loader can pass) and
the main process fetching alone, then goes straight to the workers that Little's law says keep
the consumer fed (the fetch's time per batch over the consumer's), and adds workers while each
step gains beyond the noise of its timing windows and repays its extra start-up. It stops once
the loop waits for data ≤ 2 % of the step, the usable CPUs are saturated, the consumer's
rate (over whole epochs: with each epoch's refill) is within the noise, the workers can make
more than the loop can take (a fetch that waits: Little's law), a gain is within the
windows' spread, more workers would not repay their start-up, the search's time budget would
be passed, or /dev/shm / RAM / open files would not hold more. Each trial is
:func:`redline.data.loader_timing.measure`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
import warnings
from collections.abc import Callable, Sized
from dataclasses import dataclass, field
from typing import Any, cast

import psutil
import torch
from torch.utils.data import DataLoader, IterableDataset

from redline.core.loader import LoaderSettings
from redline.data.loader_timing import (
    IN_FLIGHT_MARGIN,
    MIN_TIMED_BATCHES,
    WINDOWS,
    Trial,
    default_skip,
    epoch_batches,
    in_flight,
    measure,
    merge_rank_trials,
    samples_in,
    window_batches,
)
from redline.measure.agree import Agreement
from redline.measure.loader import batch_nbytes
from redline.measure.system import cpu_budget, shm_info

__all__ = ["IN_FLIGHT_MARGIN", "MIN_TIMED_BATCHES", "WINDOWS", "LoaderPlan", "Trial",
           "autotune_loader", "consume_time", "epoch_batches", "in_flight", "measure",
           "merge_rank_trials", "rebuild_factory", "stand_in_consumer", "window_batches"]

WAIT_TARGET = 0.02
"""Stop once data wait is ≤ 2 % of the step: what is left is below the noise of one trial."""
MIN_GAIN = 0.05
"""A setting is kept only if it raises throughput by ≥ 5 % (below that it is noise here)."""
SATURATED = 0.9
"""CPUs count as saturated at ≥ 90 % of the usable cores busy (process + workers)."""
IO_BOUND = 0.75
"""Below 75 % of the usable cores busy, the fetch mostly waits: workers beyond the core count
(and a deeper prefetch) may still help."""
TRIAL_WINDOW_S = 0.3
"""A trial's window may end once it lasted 0.3 s and holds more batches than are in flight
(``measure``'s ``window_s``): a fetch of a second per batch is timed in a few of its batches,
not in 8 per window."""
LITTLE_HEADROOM = 1.25
"""The first workers tried for a fetch that waits: 1.25 × Little's law's count (the fetch's
time per batch over the consumer's; Little 1961, L = λW), because a worker also collates and
ships each batch, which the main process's fetch alone did not time."""
IO_STEP = 1.5
"""Past the first count, a fetch that waits is tried at 1.5 × the workers of the last trial."""
SHM_SHARE = 0.5
"""Batches in flight may use at most half of the free /dev/shm."""
MAX_IO_WORKERS = 64
"""Workers for a fetch that waits (storage, network) are not bounded by the cores, whose work
they barely use, but by memory, /dev/shm and open files; this bounds the search itself."""
WORKER_RAM_SHARE = 0.5
"""Worker processes may use at most half of the free RAM (their own memory, measured)."""
FDS_PER_WORKER = 4
"""File descriptors the training process holds per worker (its index queue's pipe, the shared
result queue, the worker's process handle), besides one per tensor in flight (PyTorch's
file_descriptor sharing strategy)."""
FD_SHARE = 0.5
"""Workers and batches in flight may use at most half of the free file descriptors."""


@dataclass(slots=True, kw_only=True)
class LoaderPlan:
    """The chosen settings, every trial behind them, and why."""

    settings: LoaderSettings
    torch_threads: int
    """Intra-op threads of the training process chosen with ``settings``."""
    consume_s_per_batch: float
    """Time the consumer needs per batch with data ready (the device's consumption rate)."""
    trials: list[Trial] = field(default_factory=list)
    reason: str = ""
    tuning_s: float = 0.0
    """Wall time of the whole search: the consumer's timing and every trial, worker start-up
    included."""
    startup_s: float = 0.0
    """The part of ``tuning_s`` spent starting loaders (each trial's build to first batch):
    what the search paid for its workers' start-up."""
    consumer_samples_per_s: float | None = None
    """The consumer's rate with data ready (samples per batch / ``consume_s_per_batch``, every
    rank's): the ceiling of any setting; None when a batch's samples cannot be counted."""
    payback_samples: int | None = None
    """Samples within which more workers must repay their extra start-up (default one epoch);
    None: start-up not weighed (a loader of unknown length)."""

    @property
    def best(self) -> Trial:
        return max(self.trials, key=lambda t: t.samples_per_s)


def _count_tensors(batch: Any) -> int:
    from redline.data.prefetcher import map_tensors

    seen: list[int] = []
    map_tensors(batch, lambda t: seen.append(1))
    return len(seen)


def _waits(t: Trial, budget: float) -> bool:
    """Whether a trial's fetch mostly waited rather than computed: the process and its workers
    kept under IO_BOUND of the cores they could use (at most one per worker) busy."""
    return t.cpu_cores_busy < IO_BOUND * min(budget, max(1, t.settings.num_workers))


def free_file_descriptors() -> int | None:
    """Descriptors this process may still open (soft limit − open now), None where unknown."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        used = psutil.Process().num_fds()
    except (ImportError, AttributeError, OSError, psutil.Error):
        return None
    return None if soft == resource.RLIM_INFINITY else max(0, soft - used)


def consume_time(make_loader: Callable[[LoaderSettings], DataLoader[Any]],
                 consume: Callable[[Any], None], repeats: int = 5) -> tuple[float, Any]:
    """(median time the consumer takes per batch with data ready, that batch). Raises
    ValueError where the loader yields no batch (nothing to tune)."""
    loader = make_loader(LoaderSettings())
    batch = next(iter(loader), _NO_BATCH)
    if batch is _NO_BATCH:
        n = _length(getattr(loader, "dataset", None))
        raise ValueError(
            f"the loader yields no batch (its dataset has {n if n is not None else 'unknown'} "
            f"samples, batch_size={getattr(loader, 'batch_size', None)}, "
            f"drop_last={getattr(loader, 'drop_last', None)}): there is nothing to time. "
            "Give autotune_loader a loader over data, with drop_last=False or a batch_size "
            "no larger than the dataset")
    consume(batch)  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        consume(batch)
        times.append(time.perf_counter() - t)
    return statistics.median(times), batch


_NO_BATCH: Any = object()


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except TypeError:  # none (an IterableDataset), or no dataset
        return None


def _repays(best: Trial, trial: Trial, horizon: int | None) -> bool:
    """Whether ``trial``'s extra start-up over ``best``'s is repaid by its faster rate within
    ``horizon`` samples (always, when start-up is not weighed or costs nothing more)."""
    extra = trial.startup_s - best.startup_s
    if horizon is None or extra <= 0:
        return True
    saved = horizon * (1 / max(1e-12, best.samples_per_s) - 1 / max(1e-12, trial.samples_per_s))
    return saved >= extra


def _process_bound(t: Trial, consume_s: float, per_batch: int | None,
                   ranks: int) -> float | None:
    """Samples/s the training process can take with ``t``'s workers: a batch per
    ``consume_s`` plus the time it spends receiving a batch already made
    (:attr:`Trial.ready_fetch_s`), every rank's; None where either is unknown."""
    if t.ready_fetch_s is None or not per_batch:
        return None
    return ranks * per_batch / max(1e-12, consume_s + t.ready_fetch_s)


def _refilled_ceiling(t: Trial, ceiling: float | None, epoch: int | None, consume_s: float,
                      fetch_s: float) -> float | None:
    """The consumer's rate over whole epochs, for a trial timed over them: each epoch's batches
    at the consumer's rate plus one batch's fetch before the first of them. PyTorch's DataLoader
    starts an epoch's fetches when its iterator is made, every worker at once, so the first
    batch takes a whole fetch however many workers there are (the trial's own epoch start,
    :attr:`Trial.refill_s`, where it timed one; else ``fetch_s``, as the main process timed
    it: a worker's is no shorter). None for a trial timed inside an epoch."""
    if not t.whole_epochs or ceiling is None or not epoch:
        return None
    epoch_s = epoch * consume_s
    refill_s = t.refill_s if t.refill_s is not None else fetch_s
    return ceiling * epoch_s / (epoch_s + refill_s)


def _taken_over_epochs(t: Trial, consume_s: float, per_batch: int | None, ranks: int,
                       epoch: int | None, fetch_s: float) -> float | None:
    """Samples/s the training process can take over whole epochs, for a trial timed over them:
    each batch consumed and received (:attr:`Trial.ready_fetch_s`), and each epoch's first
    batch waited for (:attr:`Trial.refill_s`, else ``fetch_s``). Every rank's; None for a trial
    timed inside an epoch or where receiving is unknown."""
    if not t.whole_epochs or not epoch or not per_batch or t.ready_fetch_s is None:
        return None
    refill_s = t.refill_s if t.refill_s is not None else fetch_s
    return ranks * per_batch * epoch / max(1e-12, epoch * (consume_s + t.ready_fetch_s)
                                           + refill_s)


def _made_bound(t: Trial, epoch: int | None, per_batch: int | None, ranks: int,
                fetch_s: float) -> float | None:
    """Samples/s ``t``'s workers can make. By Little's law (L = λW) n workers, each always
    holding a request (prefetch ≥ 1), make n batches per W; over whole epochs, the epoch's E
    batches, requested in turn, take W × ⌈E / n⌉. W is the larger of the round the workers
    showed at an epoch start (:attr:`Trial.round_s`: every worker fetching at once, as all of
    them are when they are what limits, up to the slowest, which in-order delivery waits for;
    storage that slows under that load shows it) and the main process's own fetch
    (``fetch_s``: the first read of its samples, where a new epoch may re-read samples the
    page cache still holds). Every rank's; None without workers or a timed round."""
    n = t.settings.num_workers
    if not n or t.round_s is None or not per_batch:
        return None
    w = max(t.round_s, fetch_s)
    if t.whole_epochs and epoch:
        return ranks * per_batch * epoch / max(1e-12, w * math.ceil(epoch / n))
    return ranks * per_batch * n / max(1e-12, w)


def _predicted_trial_s(s: LoaderSettings, rate_batches: float, per_worker_startup_s: float,
                       batches: int, window_s: float | None, fetch_s: float) -> float:
    """What a trial of ``s`` will cost: its workers' start-up at the measured cost per worker,
    then its skip and windows at ``rate_batches`` (the best rate so far: a setting tried
    because it may be faster is not slower than that), then with workers the epoch start
    timed after them (``time_refill``): what is in flight drains, ~prefetch fetches of
    ``fetch_s``, then one more."""
    timed = default_skip(s, window_s) + window_batches(s, batches)
    refill = ((s.prefetch_factor or 2) + 1) * fetch_s if s.num_workers else 0.0
    return per_worker_startup_s * s.num_workers + timed / max(1e-9, rate_batches) + refill


def autotune_loader(make_loader: Callable[[LoaderSettings], DataLoader[Any]],
                    consume: Callable[[Any], None], *, device: str | torch.device = "cpu",
                    batches_per_trial: int = 24, max_workers: int | None = None,
                    cpus: float | None = None, agree: Agreement | None = None,
                    window_s: float | None = TRIAL_WINDOW_S,
                    payback_samples: int | None = None,
                    budget_s: float | None = None) -> LoaderPlan:
    """Find DataLoader settings for this loop by measuring it.

    Args:
        make_loader: builds the user's DataLoader with the given settings (pass
            ``**settings.loader_kwargs()`` to ``DataLoader``).
        consume: one training step on a batch (or a stand-in with the device's speed).
        device: where batches go; ``pin_memory`` is chosen only for CUDA.
        batches_per_trial: batches timed per setting (at least; with workers 3 windows of what
            is in flight + 8; a window may end early once it lasted ``window_s``).
        max_workers: upper bound (default: 2 × usable CPUs, up to 64 for a fetch that waits).
        cpus: usable CPUs (default: affinity ∩ cgroup quota).
        agree: the job's ranks, each tuning its own loader in step with the others (each
            trial runs the training step, whose collectives need every rank): every input of
            a decision is agreed (the least CPUs, /dev/shm and RAM of any rank; each trial
            merged by :func:`merge_rank_trials`), so every rank stops at the same trial.
        window_s: a trial's window may end once it lasted this long and holds more batches
            than are in flight (None: windows of ``batches_per_trial`` / 3 batches at least).
        payback_samples: more workers are kept only if their extra start-up (measured) is
            repaid by their faster rate within this many samples; default one epoch (the
            least a run reads; persistent workers start once per run); None with a loader of
            unknown length: start-up is not weighed.
        budget_s: the search's own time limit, worker start-up included: a trial whose
            predicted cost would pass it is not run, nor more workers after it, though fewer
            that fit are (None: no limit). The main process's trial, the baseline every
            decision needs, always runs.

    Returns:
        A :class:`LoaderPlan` with the settings, every trial and the reason in numbers.
    """
    t_begin = time.perf_counter()
    job = agree or Agreement()
    budget = job.min(cpus if cpus is not None else cpu_budget().cpus, "loader CPUs")
    cap = max_workers if max_workers is not None else max(1, int(2 * budget))
    io_cap = max_workers if max_workers is not None else max(cap, MAX_IO_WORKERS)
    pin = torch.device(device).type == "cuda" and torch.cuda.is_available()
    consume_s, sample_batch = consume_time(make_loader, consume)
    consume_s = job.max(consume_s, "loader consume time")
    plan = LoaderPlan(settings=LoaderSettings(), torch_threads=max(1, int(budget)),
                      consume_s_per_batch=consume_s)
    default_loader = make_loader(LoaderSettings())
    per_batch = samples_in(sample_batch, default_loader)
    # The consumer's rate with data ready: no loader setting can pass it (every rank's sum,
    # as merged trials are; the job steps at the slowest rank's consumer).
    ceiling = (job.world_size * per_batch / max(1e-12, consume_s)) if per_batch else None
    plan.consumer_samples_per_s = ceiling
    # One window rule for every trial (see measure): whole epochs when the deepest queue this
    # search may try (cap workers × prefetch 4: its skip and its windows) would leave no room
    # inside an epoch.
    epoch = epoch_batches(default_loader)
    iterable = isinstance(getattr(default_loader, "dataset", None), IterableDataset)
    deepest = LoaderSettings(num_workers=cap, prefetch_factor=4)
    whole = epoch is not None and \
        epoch < in_flight(deepest) + 1 + window_batches(deepest, batches_per_trial)
    horizon = payback_samples if payback_samples is not None else \
        (epoch * per_batch if epoch is not None and per_batch else None)
    plan.payback_samples = horizon

    def measure_(s: LoaderSettings, threads: int) -> Trial:
        trial = merge_rank_trials(job.run(
            lambda: measure(make_loader, consume, s, threads, batches_per_trial,
                            whole_epochs=whole, window_s=window_s, time_refill=True),
            f"loader trial {s.num_workers} workers"))
        plan.trials.append(trial)
        plan.startup_s += trial.startup_s
        return trial

    def over_budget(s: LoaderSettings) -> str:
        """Why a trial of ``s`` is not run for the time budget, else ''."""
        if budget_s is None:
            return ""
        spent = time.perf_counter() - t_begin
        rate = best.samples_per_s / max(1, per_batch or 1)
        cost = _predicted_trial_s(s, rate, per_worker_startup, batches_per_trial, window_s,
                                  fetch_s)
        if spent + cost <= budget_s:
            return ""
        return (f"a trial of {s.num_workers} workers × prefetch {s.prefetch_factor} would take "
                f"about {cost:.1f} s, past the search's budget ({spent:.1f} of "
                f"{budget_s:g} s spent)")

    first = measure_(plan.settings, plan.torch_threads)
    best = first
    per_worker_startup = 0.0
    batch_bytes = int(job.max(batch_nbytes(sample_batch), "loader batch bytes"))
    shm = shm_info()
    frees = [f for f in job.gather(shm.free_bytes if shm is not None else None, "loader shm")
             if f is not None]
    shm_free = min(frees) if frees else None
    ram = job.min(psutil.virtual_memory().available, "loader RAM")
    fds = [f for f in job.gather(free_file_descriptors(), "loader fds") if f is not None]
    fd_free = min(fds) if fds else None
    tensors = max(1, int(job.max(_count_tensors(sample_batch), "loader tensors per batch")))
    reason = ""
    if first.data_wait_fraction <= WAIT_TARGET:
        reason = (f"data wait is already {first.data_wait_fraction:.1%} of the step in the "
                  f"main process (≤ {WAIT_TARGET:.0%}): no workers needed")
    # Little's law (L = λW): batches being made at once = the rate wanted × the time one
    # takes. To hand the consumer a batch every consume_s, fetches of fetch_s per batch need
    # fetch_s / consume_s workers in parallel; the main process's trial timed fetch_s as its
    # data wait per batch.
    fetch_s = first.data_wait_fraction * (per_batch or 1) / max(1e-12, first.samples_per_s)
    little = fetch_s / max(1e-12, consume_s)
    first_waits = _waits(first, budget)
    if first_waits:  # a fetch that waits: straight to Little's count, with headroom
        workers = max(1, min(io_cap, math.ceil(little * LITTLE_HEADROOM)))
    else:  # a fetch that computes: no more than the cores at first
        workers = max(1, min(cap, max(1, int(budget)), math.ceil(little)))
    prefetch = 2  # PyTorch's default; deepened once at the end if the fetch is I/O-bound
    stalls = 0
    more_did_not_pay = False
    makers_ahead = False
    last: Trial | None = None
    while not reason:
        # A fetch that waits (its workers leave the cores idle) may use more workers than
        # cores: they wait in parallel. Then memory, /dev/shm and open files bound them.
        waits = _waits(last, budget) if last is not None else first_waits
        if workers > (io_cap if waits else cap):
            limit = io_cap if waits else cap
            reason = (f"reached {limit} workers (max_workers)" if max_workers is not None
                      else f"reached {io_cap} workers (the most tried for a fetch that waits)"
                      if waits else f"reached {cap} workers (2 × {budget:g} usable CPUs)")
            if last is not None and last is not best:
                reason += (f"; {last.settings.num_workers} workers, the most tried, did not "
                           f"gain beyond the noise over {best.settings.num_workers}")
            break
        per_worker = last.worker_bytes if last is not None else None
        if per_worker and workers * per_worker > WORKER_RAM_SHARE * ram:
            reason = (f"{workers} workers of {per_worker / 2**20:,.0f} MiB each (measured) "
                      f"would use over half of the free RAM ({ram / 2**20:,.0f} MiB)")
            break
        if fd_free is not None and \
                workers * (FDS_PER_WORKER + prefetch * tensors) > FD_SHARE * fd_free:
            reason = (f"{workers} workers with {prefetch * tensors} tensors in flight each "
                      f"would use over half of the {fd_free:,} free file descriptors "
                      "(raise `ulimit -n`)")
            break
        in_flight_bytes = workers * prefetch * batch_bytes
        if shm_free is not None and in_flight_bytes > SHM_SHARE * shm_free:
            reason = (f"{workers} workers × prefetch {prefetch} × {batch_bytes / 2**20:.1f} MiB "
                      f"batches would use over half of /dev/shm ({shm_free / 2**20:.0f} "
                      "MiB free)")

            break
        if in_flight_bytes > 0.25 * ram:
            reason = "batches in flight would use over a quarter of the free RAM"
            break
        s = LoaderSettings(num_workers=workers, prefetch_factor=prefetch, pin_memory=pin,
                           persistent_workers=True)
        if best.settings.num_workers:
            noise = max(MIN_GAIN, best.spread_fraction)
            if ceiling is not None and best.samples_per_s * (1 + noise) >= ceiling:
                # the consumer's own rate is within the noise of the best: nothing can gain
                reason = (f"{best.settings.num_workers} workers reach "
                          f"{best.samples_per_s:,.0f} samples/s of the consumer's "
                          f"{ceiling:,.0f} with data ready: no more workers can gain "
                          f"≥ {noise:.0%} (the larger of {MIN_GAIN:.0%} and the windows' "
                          "spread)")
                break
            refilled = _refilled_ceiling(best, ceiling, epoch, consume_s, fetch_s)
            if refilled is not None and best.samples_per_s * (1 + noise) >= refilled:
                # timed over whole epochs, each paying a refill no worker count shortens
                reason = (f"{best.settings.num_workers} workers reach "
                          f"{best.samples_per_s:,.0f} samples/s of the {refilled:,.0f} the "
                          f"consumer can take over whole epochs of {epoch} batches, each "
                          "starting with one batch's fetch "
                          f"({best.refill_s if best.refill_s is not None else fetch_s:.2f} s) "
                          "that more "
                          f"workers do not shorten: no more workers can gain ≥ {noise:.0%} "
                          f"(the larger of {MIN_GAIN:.0%} and the windows' spread)")
                break
            taken = _process_bound(best, consume_s, per_batch, job.world_size)
            if taken is not None and best.samples_per_s * (1 + noise) >= taken:
                # the training process itself (consuming + receiving each batch) is what
                # limits: more workers would make batches it cannot take any faster
                reason = (f"{best.settings.num_workers} workers reach "
                          f"{best.samples_per_s:,.0f} samples/s of the {taken:,.0f} the "
                          f"training process can take ({consume_s * 1e3:.1f} ms consuming + "
                          f"{(best.ready_fetch_s or 0.0) * 1e3:.1f} ms receiving a ready "
                          "batch): no "
                          f"more workers can gain ≥ {noise:.0%} (the larger of "
                          f"{MIN_GAIN:.0%} and the windows' spread)")
                break
            made = _made_bound(best, epoch, per_batch, job.world_size, fetch_s)
            # the most the loop can take as this trial was timed: the consumer with data
            # ready, over whole epochs with each epoch's refill, and the training process
            # receiving each batch besides (over whole epochs, with the refill too)
            takes_by = [(v, what) for v, what in (
                (ceiling, "the consumer can take with data ready"),
                (refilled, "the consumer can take over whole epochs, each with its refill"),
                (taken, "the training process can take (consuming + receiving a batch)"),
                (_taken_over_epochs(best, consume_s, per_batch, job.world_size, epoch,
                                    fetch_s),
                 "the training process can take over whole epochs (consuming + receiving "
                 "each batch, each epoch's refill)")) if v is not None]
            takes, takes_what = min(takes_by, key=lambda b: b[0]) if takes_by else (None, "")
            if made is not None and takes is not None and _waits(best, budget) and \
                    made > takes:
                # The workers can make more than the loop can take: more of them add batches
                # nothing takes. (Not against what the loop took: a loop short of what its
                # workers make by Little's law may still gain from more batches in flight,
                # where fetch times are uneven.) No noise margin on top: W is already the
                # slowest of a whole round of concurrent fetches, a bound the workers beat in
                # steady state, and a search that added half again as many workers past it
                # gained nothing (benchmarks/loader_autotune.py, lat10ms-b16). Only for a
                # fetch that waits: a computing fetch's round ran beside an idle consumer,
                # faster than in the loop.
                makers_ahead = True
                w_s = max(best.round_s or 0.0, fetch_s)
                reason = (f"{best.settings.num_workers} workers can make {made:,.0f} "
                          f"samples/s (Little's law: {best.settings.num_workers} batches per "
                          f"{w_s:.2f} s, the slowest fetch of a round of them all fetching at "
                          f"once), more than the {takes:,.0f} {takes_what}: "
                          "more workers cannot gain; a deeper queue, which hides uneven fetch "
                          "times, is not tried")
                break
            extra_s = per_worker_startup * (workers - best.settings.num_workers)
            if horizon is not None and ceiling is not None and ceiling > best.samples_per_s:
                most_saved_s = horizon * (1 / best.samples_per_s - 1 / ceiling)
                if extra_s > most_saved_s:
                    reason = (f"{workers} workers would start about {extra_s:.2f} s later "
                              f"than {best.settings.num_workers}, more than even the "
                              f"consumer's rate would save over {horizon:,} samples "
                              f"({most_saved_s:.2f} s)")
                    break
        why = over_budget(s)
        while why and s.num_workers > best.settings.num_workers + 1:
            # Fewer workers may fit: a shorter start-up, fewer batches to time (a trial's
            # windows grow with what is in flight). A search that stopped here kept the
            # main process's settings although a few workers would have gained.
            s = dataclasses.replace(s, num_workers=max(best.settings.num_workers + 1,
                                                       s.num_workers // 2))
            why = over_budget(s)
        if why:
            reason = why
            break
        workers = s.num_workers
        trial = measure_(s, max(1, int(budget) - workers))
        last = trial
        # start-up per worker: the trial's start-up less the first batch's own fetch
        per_worker_startup = max(per_worker_startup,
                                 max(0.0, trial.startup_s - fetch_s) / workers)
        # a gain counts only beyond the noise of both rates (their windows' spread) and where
        # its extra start-up is repaid within the payback horizon
        needed = max(MIN_GAIN, best.spread_fraction, trial.spread_fraction)
        gained = trial.samples_per_s >= best.samples_per_s * (1 + needed)
        if gained and not _repays(best, trial, horizon):
            reason = (f"{workers} workers gave {trial.samples_per_s:,.0f} samples/s vs "
                      f"{best.samples_per_s:,.0f} with {best.settings.num_workers}, but start "
                      f"{trial.startup_s - best.startup_s:.2f} s later, more than that gain "
                      f"saves over {horizon:,} samples")
            break
        if gained:
            best, stalls = trial, 0
        else:
            stalls += 1
        if best.data_wait_fraction <= WAIT_TARGET:
            reason = (f"data wait fell to {best.data_wait_fraction:.1%} of the step "
                      f"(≤ {WAIT_TARGET:.0%})")
            break
        if trial.cpu_cores_busy >= SATURATED * budget:
            reason = (f"the {budget:g} usable CPUs are saturated "
                      f"({trial.cpu_cores_busy:.2f} busy with {workers} workers): more "
                      "workers would only compete with the training process")
            break
        # Once workers have gained, one gain within the spread ends the search; while none
        # has, two (one worker often only matches the main process: the same one core).
        if stalls >= (2 if best.settings.num_workers == 0 else 1):
            more_did_not_pay = True
            reason = (f"{workers} workers gave {trial.samples_per_s:,.0f} samples/s vs "
                      f"{best.samples_per_s:,.0f} with {best.settings.num_workers}: no gain "
                      f"≥ {needed:.0%} (the larger of {MIN_GAIN:.0%} and the windows' "
                      "spread)" + (" twice in a row" if stalls > 1 else ""))
            break
        if workers >= budget and trial.cpu_cores_busy >= IO_BOUND * budget:
            # More workers than cores only pay when they mostly wait (I/O-bound fetches).
            reason = (f"{workers} workers already keep {trial.cpu_cores_busy:.2f} of "
                      f"{budget:g} CPUs busy: more workers than cores would only queue")
            break
        if _waits(trial, budget) and workers >= budget:
            workers = max(workers + 1, math.ceil(workers * IO_STEP))
        else:
            workers = workers + 1 if workers < budget else workers * 2
    fewer = best.settings.num_workers - 1
    # The main process's trial kept a core busy for most of its fetch time: the fetch computes
    # (its consumer may sleep on a device meanwhile, so the busy cores alone do not say it).
    fetch_computes = first.cpu_cores_busy >= IO_BOUND * first.data_wait_fraction
    if (fewer >= 1 and fetch_computes
            and all(t.settings.num_workers != fewer for t in plan.trials)):
        # Workers whose fetch computes share the cores with the training process (receiving
        # each batch, launching the step), so one worker fewer can be as fast or faster. The
        # search starts at Little's count rounded up and only adds workers, so it never saw
        # it. Kept at an equal rate or better: it frees a worker's memory and CPU at no cost
        # measured.
        down = dataclasses.replace(best.settings, num_workers=fewer)
        if not over_budget(down):
            trial = measure_(down, max(1, int(budget) - fewer))
            if trial.samples_per_s >= best.samples_per_s:
                reason += (f"; {fewer} worker{'s' if fewer > 1 else ''} gave "
                           f"{trial.samples_per_s:,.0f} samples/s vs "
                           f"{best.samples_per_s:,.0f} with {best.settings.num_workers}: as "
                           "fast with fewer")
                best = trial
    bounds = [b for b in (ceiling, _process_bound(best, consume_s, per_batch, job.world_size),
                          _refilled_ceiling(best, ceiling, epoch, consume_s, fetch_s))
              if b is not None]
    room = not bounds or \
        best.samples_per_s * (1 + max(MIN_GAIN, best.spread_fraction)) < min(bounds)
    if (best.settings.num_workers and best.data_wait_fraction > WAIT_TARGET and room
            and _waits(best, budget) and not more_did_not_pay and not makers_ahead):
        # The fetch waits rather than computes: a deeper queue per worker may hide latency.
        # Not after more workers measurably did not gain: they added as many batches in
        # flight as a deeper queue would, and producers to fill them (then the producers
        # already keep ahead; what limits is the consumer side).
        deeper = dataclasses.replace(best.settings, prefetch_factor=4)
        why = over_budget(deeper)
        if why:
            reason += f"; prefetch 4 not tried: {why}"
        else:
            trial = measure_(deeper, best.torch_threads)
            needed = max(MIN_GAIN, best.spread_fraction, trial.spread_fraction)
            if trial.samples_per_s >= best.samples_per_s * (1 + needed):
                best = trial
                reason += "; prefetch_factor 4 helped"
    plan.settings, plan.torch_threads = best.settings, best.torch_threads
    plan.tuning_s = time.perf_counter() - t_begin
    plan.reason = (f"{reason}. Chosen: {best.settings.num_workers} workers, prefetch "
                   f"{best.settings.prefetch_factor}, pin_memory {best.settings.pin_memory}, "
                   f"{best.torch_threads} torch threads → "
                   f"{best.samples_per_s:,.0f} samples/s, data wait "
                   f"{best.data_wait_fraction:.1%} (consumer needs {consume_s * 1e3:.1f} ms/batch"
                   + (f"; timed over whole epochs of {best.timed_batches // best.whole_epochs} "
                      "batches, refills included" if best.whole_epochs else "")
                   + f"). Search: {len(plan.trials)} trials in {plan.tuning_s:.1f} s, "
                   f"{plan.startup_s:.1f} s of it starting loaders")
    if iterable and best.settings.num_workers > 0:
        note = (f"the loader reads an IterableDataset: each of the {best.settings.num_workers} "
                "workers iterates its own copy, and unless the dataset splits its stream by "
                "torch.utils.data.get_worker_info() every sample comes once a worker (these "
                "rates count such repeats). Shard it by worker before using these settings")
        plan.reason += f". Note: {note}"
        warnings.warn(f"redline autotune_loader: {note}", RuntimeWarning, stacklevel=2)
    return plan


def rebuild_factory(loader: DataLoader[Any], batch_size: int | None = None,
                    dataset: Any = None, collate_fn: Callable[[Any], Any] | None = None
                    ) -> Callable[[LoaderSettings], DataLoader[Any]]:
    """A ``make_loader`` that rebuilds this DataLoader (same dataset, sampling and collation;
    same batch size unless ``batch_size`` is given; ``dataset`` instead of its own, of the
    same length, where given: a cached view of it, or its encoded images, with
    ``collate_fn`` for them) with other settings. Raises ValueError for
    loaders it cannot rebuild faithfully (a custom batch sampler, an unknown sampler).

    A ``DistributedSampler`` is kept as the same object: the rebuilt loader reads this rank's
    shard in the same order, and the loop's ``set_epoch`` calls on it still apply."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
    from torch.utils.data.distributed import DistributedSampler

    bs = loader.batch_sampler
    if loader.batch_size is None:
        raise ValueError("the DataLoader has batch_size=None (it yields samples one by one, "
                         "its dataset or sampler batching them): pass your own make_loader to "
                         "autotune_loader")
    if not isinstance(bs, BatchSampler):
        raise ValueError("the DataLoader uses a custom batch sampler: pass your own "
                         "make_loader to autotune_loader")
    sampler = loader.sampler
    shared = sampler if isinstance(sampler, DistributedSampler) else None
    if not isinstance(sampler, RandomSampler | SequentialSampler) and shared is None:
        raise ValueError(f"the DataLoader uses a {type(sampler).__name__}: pass your own "
                         "make_loader to autotune_loader")

    generator = getattr(sampler, "generator", None)
    data = loader.dataset if dataset is None else dataset
    # Arguments of the user's loader that no setting here changes, kept as they were (the
    # ones newer PyTorch versions added, only where the loader has them).
    kept: dict[str, Any] = {"timeout": loader.timeout}
    if getattr(loader, "in_order", True) is False:
        kept["in_order"] = False

    def make(s: LoaderSettings) -> DataLoader[Any]:
        kw = s.loader_kwargs()
        if s.num_workers > 0 and loader.multiprocessing_context is not None:
            kw["multiprocessing_context"] = loader.multiprocessing_context
        if s.num_workers == 0:
            kw["timeout"] = 0  # (only workers wait for batches)
        used: Any = shared
        if isinstance(sampler, RandomSampler):  # with its replacement and sample count
            used = RandomSampler(cast(Sized, data), replacement=sampler.replacement,
                                 num_samples=sampler.num_samples, generator=generator)
        return DataLoader(data, batch_size=batch_size or loader.batch_size,
                          sampler=used, drop_last=loader.drop_last,
                          collate_fn=collate_fn or loader.collate_fn,
                          worker_init_fn=loader.worker_init_fn,
                          generator=generator, **{**kept, **kw})

    return make


def stand_in_consumer(seconds: float, on_cpu: bool) -> Callable[[Any], None]:
    """A consumer that takes ``seconds`` per batch, like the measured training step.

    On a GPU the step leaves the host free, so the stand-in sleeps (releasing the GIL). On the
    CPU the step itself competes with the loader's workers for cores, so the stand-in runs
    matrix products sized to take ``seconds`` with the trial's torch threads.
    """
    if not on_cpu:
        def sleep(batch: Any) -> None:
            time.sleep(seconds)

        return sleep
    a = torch.randn(256, 256)
    t = time.perf_counter()
    for _ in range(8):
        a @ a
    per = max(1e-6, (time.perf_counter() - t) / 8)
    reps = max(1, round(seconds / per))

    def burn(batch: Any) -> None:
        for _ in range(reps):
            a @ a

    return burn

