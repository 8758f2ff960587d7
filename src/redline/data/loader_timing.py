"""One loader setting timed in the real loop, in steady state: the trial behind every decision
of the loader autotune (:mod:`redline.data.autotune`) and of its benchmark's grid.

A trial skips the loader's start-up (timed apart, as :attr:`Trial.startup_s`) and what its
workers queue meanwhile, then times ``WINDOWS`` consecutive windows, each holding more batches
than are in flight (workers × prefetch): a window no longer than the queue measures the queue,
not the pipeline. The rate is the windows' median, their spread the setting's noise.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader

from redline.core.loader import LoaderSettings
from redline.measure.loader import batch_samples

MIN_TIMED_BATCHES = 8
"""A window inside one epoch times at least 8 batches; an epoch too short for the skip plus the
window is timed whole (see ``measure``)."""
WINDOWS = 3
"""Consecutive windows timed per setting: the rate is their median and their spread is the
noise a gain must exceed (see ``measure``)."""
IN_FLIGHT_MARGIN = 8
"""Batches each window times beyond what is in flight (workers × prefetch): a window no longer
than the queue could be served from batches made before it began."""


@dataclass(slots=True, kw_only=True)
class Trial:
    settings: LoaderSettings
    torch_threads: int
    """Intra-op threads of the training process during the trial."""
    samples_per_s: float
    data_wait_fraction: float
    cpu_cores_busy: float
    """Process + worker CPU seconds per wall second during the trial."""
    seconds: float
    """Wall time of the whole trial: start-up, skipped batches and windows."""
    timed_batches: int = 0
    """Batches inside the timed windows."""
    worker_bytes: int | None = None
    """Memory of one worker process (unique set size, else resident), measured after the
    trial; None without workers."""
    whole_epochs: int = 0
    """Epochs the window covers start to end (0: a window inside one epoch, see ``measure``)."""
    spread_fraction: float = 0.0
    """(max − min) / median of the samples/s of the windows after the first (of both where a
    trial over whole epochs has 2), each without the batch that began an epoch (see
    ``measure``): the noise of this setting's rate; 0 when fewer than two such windows."""
    startup_s: float = 0.0
    """From building the loader to its first batch (worker start-up), paid by the search and
    left out of the rate."""
    ready_fetch_s: float | None = None
    """Median time of ``next()`` on the batches the workers had queued during start-up: what
    the training process spends receiving a batch that is ready (unpickling, shared-memory
    handles); None without workers or skipped batches."""
    round_s: float | None = None
    """From a new epoch's requests (``measure(time_refill=True)``, after the windows) to the
    arrival of its n-th batch, n the workers, received without consuming: every worker's first
    fetch, all made at once, so the slowest of n concurrent fetches (the W of Little's law for
    a round of the workers, uneven fetch times included, which in-order delivery waits for);
    None unless timed, or an epoch shorter than the workers."""
    refill_s: float | None = None
    """Time of an epoch's first batch, with workers one batch's fetch with every worker
    fetching at once (Little's law's W under that load): the median of the epoch starts inside
    the windows, from ``iter()`` (the sampler's own start and the workers' resume included,
    as training pays them), else the one ``measure(time_refill=True)`` starts after them, from
    the new epoch's requests (after what was in flight drained); None when no epoch start was
    timed."""


def _proc_cpu(p: psutil.Process) -> float:
    total = 0.0
    try:
        t = p.cpu_times()
        total += t.user + t.system
        for c in p.children(recursive=True):
            try:
                ct = c.cpu_times()
                total += ct.user + ct.system
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return total


def in_flight(settings: LoaderSettings) -> int:
    """Batches a loader with these settings holds in flight: num_workers × prefetch_factor."""
    if not settings.num_workers:
        return 0
    return settings.num_workers * (settings.prefetch_factor or 2)  # 2: PyTorch's default


def window_batches(settings: LoaderSettings, batches: int) -> int:
    """Batches timed for one setting: ``batches``, and with workers at least ``WINDOWS``
    windows of what is in flight plus ``IN_FLIGHT_MARGIN`` each."""
    queued = in_flight(settings)
    return batches if queued == 0 else max(batches, WINDOWS * (queued + IN_FLIGHT_MARGIN))


def default_skip(settings: LoaderSettings, window_s: float | None = None) -> int:
    """Batches consumed before the first window: what is in flight plus one (the start-up's
    batch); at least 3 unless windows are cut by time (then the first batch alone, with no
    queue to drain: a slow fetch's trial is not three of its batches longer)."""
    queued = in_flight(settings)
    return queued + 1 if window_s is not None else max(3, queued + 1)


def samples_in(batch: Any, loader: Any) -> int | None:
    """Samples in a batch of ``loader``: 1 where the loader yields samples one by one
    (``batch_size=None``: no batch sampler), else the batch's leading dimension, else the
    loader's batch size (a batch of strings or other objects); None where none says."""
    if getattr(loader, "batch_sampler", True) is None:  # automatic batching off
        return 1
    n = batch_samples(batch)
    return n if n is not None else getattr(loader, "batch_size", None)


def measure(make_loader: Callable[[LoaderSettings], DataLoader[Any]],
            consume: Callable[[Any], None], settings: LoaderSettings, torch_threads: int = 1,
            batches: int = 24, skip: int | None = None,
            whole_epochs: bool | None = None, window_s: float | None = None,
            time_refill: bool = False) -> Trial:
    """Throughput and data wait of one setting, in the real loop, in steady state.

    The first batches are skipped: worker start-up is a one-off with persistent workers, and
    the workers fill their queues (num_workers × prefetch_factor batches) while it runs; timing
    from a full queue would credit deep queues with batches made before the clock started.
    Skipping alone does not empty that queue (the workers keep refilling it while the skipped
    batches are consumed), so the timed batches are at least ``WINDOWS`` windows each longer
    than what is in flight (:func:`window_batches`): a window no longer than the queue measures
    the queue, not the pipeline. The rate is the median of the windows' rates (the first may
    still drain what start-up queued, which one window cannot move), the data wait that of
    the median window, and the spread of the later windows is kept as the setting's noise.

    ``window_s`` cuts slow windows short: a window inside an epoch ends at its planned length
    or, once it has lasted ``window_s`` and holds more batches than are in flight, earlier (a
    fetch of a second per batch needs no 8 batches per window to be timed to a few percent).
    It never lengthens a window. With ``window_s``, an epoch too short for the skip plus 3
    windows of more than is in flight is timed whole, over as few whole epochs as hold 2 such
    windows (and ``batches``): the rate is over all of them, refills included, and the spread
    that of their 3 equal parts (2 where 3 would not each hold more than is in flight), each
    without the batch that began an epoch in it (its refill is a cost every epoch pays, not
    noise). The refill itself, an epoch's first batch from
    request to arrival, is kept as :attr:`Trial.refill_s`.

    The window must not cross an epoch boundary for one setting and not for another: each new
    epoch drains the queues and refills them, and deeper queues skip more batches: a trial
    whose window alone crosses a short epoch reads far slower than one that does not, whatever
    its workers. ``whole_epochs=False`` times inside one epoch (steady state;
    the window is shortened to end at the boundary); ``True`` times whole periods of an epoch
    from the first batch after the skip (batch *s* of one epoch to batch *s* of the next),
    each holding one epoch start with its refill, as training pays it, without first skipping
    to a boundary; ``None`` chooses inside
    unless the epoch cannot hold the skip plus ``MIN_TIMED_BATCHES`` (then whole epochs
    whatever was asked). ``autotune_loader`` chooses once for all its trials.

    ``time_refill``: with persistent workers, start a new epoch after the windows and time its
    first batch (:attr:`Trial.refill_s`, where no epoch started inside the windows) and its
    workers' first round (:attr:`Trial.round_s`), which costs the in-flight batches' drain
    plus one round of fetches.
    """
    if skip is None:
        skip = default_skip(settings, window_s)
    asked, batches = batches, window_batches(settings, batches)
    threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    proc = psutil.Process()
    t_start = time.perf_counter()
    with warnings.catch_warnings():
        # Trials may deliberately use more workers than cores (I/O-bound fetches); torch's
        # advice against that is what the measurement itself settles.
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        return _measure(make_loader=make_loader, consume=consume, settings=settings,
                        torch_threads=torch_threads, batches=batches, skip=skip,
                        whole_epochs=whole_epochs, proc=proc, threads=threads,
                        time_refill=time_refill,
                        t_start=t_start, window_s=window_s, asked=asked)


def _measure(*, make_loader: Callable[[LoaderSettings], DataLoader[Any]],
             consume: Callable[[Any], None], settings: LoaderSettings, torch_threads: int,
             batches: int, skip: int,
             whole_epochs: bool | None, proc: psutil.Process, threads: int, t_start: float,
             window_s: float | None, asked: int, time_refill: bool = False) -> Trial:
    try:
        loader = make_loader(settings)
        it: Iterator[Any] = iter(loader)

        refills: list[float] = []  # next() on an epoch's first batch, from iter() on

        def nxt() -> Any:
            # Short epochs (small datasets) wrap around, as a training loop's epochs do.
            nonlocal it
            try:
                return next(it)
            except StopIteration:
                t = time.perf_counter()
                it = iter(loader)
                b = next(it)
                refills.append(time.perf_counter() - t)
                return b

        epoch = epoch_batches(loader)
        whole = 0
        if epoch is not None:
            # the shortest window that still drains the queue (with workers), else 8 batches;
            # windows cut by time need only hold more batches than are in flight
            drained = WINDOWS * (in_flight(settings) + 1)
            least = (batches if window_s is None else drained) if in_flight(settings) \
                else MIN_TIMED_BATCHES
            if whole_epochs is None:
                whole_epochs = epoch < skip + least
            if whole_epochs or epoch < skip + least:
                # whole periods of an epoch, from the first batch after the skip: each holds
                # one epoch start (with its refill) and one epoch's batches, as training pays
                # them, without first skipping to a boundary. Split in windows that each hold
                # more than is in flight: 3, or 2 (the fewest with a spread) where a period
                # holds 2 and not 3, rather than a second period.
                fewest = 2 * (in_flight(settings) + 1) if in_flight(settings) else drained
                whole = math.ceil((batches if window_s is None else max(asked, fewest))
                                  / epoch)
                batches = whole * epoch
            else:
                batches = min(batches, epoch - skip)
        startup = 0.0
        if skip:
            consume(nxt())
            startup = time.perf_counter() - t_start
        ready: list[float] = []  # next() on batches queued during start-up: receiving only
        queued = in_flight(settings)
        for k in range(skip - 1):
            t0 = time.perf_counter()
            b = nxt()
            if k < queued // 2:  # the first half of the queue: made before it was asked for
                ready.append(time.perf_counter() - t0)
            consume(b)
        split = bool(whole) and window_s is not None
        if split:  # whole epochs in 3 windows (or 2): the rate over all, their spread the noise
            n_windows = WINDOWS if batches >= WINDOWS * (queued + 1) else 2
            ends = [round(batches * (k + 1) / n_windows) for k in range(n_windows)]
        elif whole:  # windows of whole epochs, each with its refill, as training pays it
            n_windows = min(WINDOWS, whole)
            ends = [epoch * round(whole * (k + 1) / n_windows)  # type: ignore[operator]
                    for k in range(n_windows)]
        else:
            n_windows = min(WINDOWS, batches)
            ends = [round(batches * (k + 1) / n_windows) for k in range(n_windows)]
        # a window cut by time still holds more batches than are in flight
        cut_at = None if whole or window_s is None else in_flight(settings) + 1
        # (wait s, step s, samples, and of these the step s and samples of the batches that
        # began an epoch) per window
        windows: list[tuple[float, float, int, float, int]] = []
        wait = step = start_step = 0.0
        start_samples = 0
        refills.clear()  # the skip's are not the windows'
        samples = in_window = timed = 0
        c0, w0 = _proc_cpu(proc), time.perf_counter()
        w_start = w0
        while len(windows) < n_windows:
            began = len(refills)
            t0 = time.perf_counter()
            b = nxt()
            t1 = time.perf_counter()
            consume(b)
            t2 = time.perf_counter()
            n = samples_in(b, loader) or 1
            if len(refills) > began:
                start_step += t2 - t0
                start_samples += n
            wait += t1 - t0
            step += t2 - t0
            samples += n
            in_window += 1
            timed += 1
            planned = in_window >= ends[len(windows)] - (ends[len(windows) - 1]
                                                         if windows else 0)
            cut = cut_at is not None and in_window >= cut_at \
                and t2 - w_start >= window_s  # type: ignore[operator]
            if planned or cut:
                windows.append((wait, step, samples, start_step, start_samples))
                wait = step = start_step = 0.0
                samples = in_window = start_samples = 0
                w_start = t2
        busy = (_proc_cpu(proc) - c0) / max(1e-9, time.perf_counter() - w0)
        round_s = None
        if time_refill and settings.num_workers and settings.persistent_workers and \
                epoch is not None:
            # PyTorch's iterator reset waits for what is in flight, then asks every worker
            # for new batches at once, batch j of worker j: the first is one batch's fetch
            # with all of them busy, the n-th the slowest of the n. (Not for a stream:
            # restarting it may reopen shards or end a single pass.)
            it = iter(loader)
            t0 = time.perf_counter()
            with contextlib.suppress(StopIteration):
                for got in range(settings.num_workers):
                    next(it)
                    if got == 0 and not refills:
                        refills.append(time.perf_counter() - t0)
                round_s = time.perf_counter() - t0
        per_worker = _worker_bytes(proc) if settings.num_workers else None
    finally:
        torch.set_num_threads(threads)
    rates = [n / max(1e-12, s) for _, s, n, _, _ in windows]
    median = sorted(range(len(rates)), key=rates.__getitem__)[len(rates) // 2]
    # the noise is the steady state's: the batch that began an epoch (its refill), which
    # lands in one window and not the others, is a cost paid every epoch (in the rate), not
    # noise. Each later window's rate without it; a window of that batch alone is left out.
    # (of 2 windows, both: each holds more than is in flight)
    spread_of = windows if len(windows) == 2 and split else windows[1:]
    later = [(n - ns) / (s - ss) for _, s, n, ss, ns in spread_of if n > ns and s > ss]
    spread = (max(later) - min(later)) / statistics.median(later) if len(later) >= 2 else 0.0
    w_s, s_s = windows[median][:2]
    rate = rates[median]
    if split:  # every batch of the whole epochs, refills included, as training pays them
        w_s, s_s = sum(w[0] for w in windows), sum(w[1] for w in windows)
        rate = sum(w[2] for w in windows) / max(1e-12, s_s)
    return Trial(settings=settings, torch_threads=torch_threads, samples_per_s=rate,
                 data_wait_fraction=w_s / max(1e-12, s_s), cpu_cores_busy=busy,
                 seconds=time.perf_counter() - t_start,
                 timed_batches=timed, whole_epochs=whole, worker_bytes=per_worker,
                 spread_fraction=spread, startup_s=startup,
                 ready_fetch_s=statistics.median(ready) if ready else None,
                 refill_s=statistics.median(refills) if refills else None, round_s=round_s)


def _worker_bytes(proc: psutil.Process) -> int | None:
    """Mean memory of this process's worker children: unique set size (what each adds, not
    the pages shared with the parent after fork), else resident size."""
    sizes = []
    for k in proc.children():
        try:
            try:
                sizes.append(int(k.memory_full_info().uss))
            except (psutil.AccessDenied, AttributeError):
                sizes.append(int(k.memory_info().rss))
        except psutil.Error:
            continue
    return int(statistics.fmean(sizes)) if sizes else None


def epoch_batches(loader: Any) -> int | None:
    """Batches per epoch, None when the loader cannot say (an IterableDataset)."""
    try:
        n = len(loader)
    except TypeError:
        return None
    return n if n > 0 else None


def merge_rank_trials(trials: list[Trial]) -> Trial:
    """The job's view of one setting from every rank's trial: samples/s add up (each rank
    loads its own shard), data wait and CPU busy are the worst rank's (the job steps at the
    pace of the rank whose loader lags), the window the shortest."""
    if len(trials) == 1:
        return trials[0]
    t0 = trials[0]
    return Trial(settings=t0.settings, torch_threads=t0.torch_threads,
                 samples_per_s=sum(t.samples_per_s for t in trials),
                 data_wait_fraction=max(t.data_wait_fraction for t in trials),
                 cpu_cores_busy=max(t.cpu_cores_busy for t in trials), seconds=max(t.seconds for t in trials),
                 timed_batches=min(t.timed_batches for t in trials),
                 whole_epochs=min(t.whole_epochs for t in trials),
                 spread_fraction=max(t.spread_fraction for t in trials),
                 startup_s=max(t.startup_s for t in trials),
                 ready_fetch_s=max((t.ready_fetch_s for t in trials
                                    if t.ready_fetch_s is not None), default=None),
                 refill_s=max((t.refill_s for t in trials if t.refill_s is not None),
                              default=None),
                 round_s=max((t.round_s for t in trials if t.round_s is not None),
                             default=None))
