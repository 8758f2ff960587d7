"""DataLoader autotune: settings found by measuring the real loop, not by folklore.

"4–8 workers per GPU" is a common starting point; this measures instead:
it times the consumer with data ready (the device's consumption rate), then raises
``num_workers`` (and ``prefetch_factor`` when the fetch waits rather than computes) while each
step measurably helps, and stops as soon as the loop waits for data ≤ 2 % of the step, the
usable CPUs are saturated, or /dev/shm / RAM would not hold more batches in flight.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader

from redline.core.loader import LoaderSettings
from redline.measure.agree import Agreement
from redline.measure.loader import batch_nbytes, batch_samples
from redline.measure.system import cpu_budget, shm_info

WAIT_TARGET = 0.02
"""Stop once data wait is ≤ 2 % of the step: what is left is below the noise of one trial."""
MIN_GAIN = 0.05
"""A setting is kept only if it raises throughput by ≥ 5 % (below that it is noise here)."""
SATURATED = 0.9
"""CPUs count as saturated at ≥ 90 % of the usable cores busy (process + workers)."""
IO_BOUND = 0.75
"""Below 75 % of the usable cores busy, the fetch mostly waits: workers beyond the core count
(and a deeper prefetch) may still help."""
MIN_TIMED_BATCHES = 8
"""A window inside one epoch times at least 8 batches; an epoch too short for the skip plus the
window is timed whole (see ``measure``)."""
WINDOWS = 3
"""Consecutive windows timed per setting: the rate is their median and their spread is the
noise a gain must exceed (see ``measure``)."""
IN_FLIGHT_MARGIN = 8
"""Batches each window times beyond what is in flight (workers × prefetch): a window no longer
than the queue could be served from batches made before it began."""
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


@dataclass(slots=True)
class Trial:
    settings: LoaderSettings
    torch_threads: int
    """Intra-op threads of the training process during the trial."""
    samples_per_s: float
    data_wait_fraction: float
    cpu_cores_busy: float
    """Process + worker CPU seconds per wall second during the trial."""
    seconds: float
    timed_batches: int = 0
    """Batches inside the timed window."""
    worker_bytes: int | None = None
    """Memory of one worker process (unique set size, else resident), measured after the
    trial; None without workers."""
    whole_epochs: int = 0
    """Epochs the window covers start to end (0: a window inside one epoch, see ``measure``)."""
    spread_fraction: float = 0.0
    """(max − min) / median of the samples/s of the windows after the first (see
    ``measure``): the noise of this setting's rate; 0 when fewer than two such windows."""
    startup_s: float = 0.0
    """From building the loader to its first batch (worker start-up), paid by the search and
    left out of the rate."""


@dataclass(slots=True)
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

    @property
    def best(self) -> Trial:
        return max(self.trials, key=lambda t: t.samples_per_s)


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


def measure(make_loader: Callable[[LoaderSettings], DataLoader[Any]],
            consume: Callable[[Any], None], settings: LoaderSettings, torch_threads: int = 1,
            batches: int = 24, skip: int | None = None,
            whole_epochs: bool | None = None) -> Trial:
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

    The window must not cross an epoch boundary for one setting and not for another: each new
    epoch drains the queues and refills them, and deeper queues skip more batches: a trial
    whose window alone crosses a short epoch reads far slower than one that does not, whatever
    its workers. ``whole_epochs=False`` times inside one epoch (steady state;
    the window is shortened to end at the boundary); ``True`` skips to an epoch boundary and
    times whole epochs, each with its refill, as training pays it; ``None`` chooses inside
    unless the epoch cannot hold the skip plus ``MIN_TIMED_BATCHES`` (then whole epochs
    whatever was asked). ``autotune_loader`` chooses once for all its trials.
    """
    if skip is None:
        skip = max(3, in_flight(settings) + 1)
    batches = window_batches(settings, batches)
    threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    proc = psutil.Process()
    t_start = time.perf_counter()
    with warnings.catch_warnings():
        # Trials may deliberately use more workers than cores (I/O-bound fetches); torch's
        # advice against that is what the measurement itself settles.
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        return _measure(make_loader, consume, settings, torch_threads, batches, skip,
                        whole_epochs, proc, threads, t_start)


def _measure(make_loader: Callable[[LoaderSettings], DataLoader[Any]],
             consume: Callable[[Any], None], settings: LoaderSettings, torch_threads: int,
             batches: int, skip: int,
             whole_epochs: bool | None, proc: psutil.Process, threads: int, t_start: float,
             ) -> Trial:
    try:
        loader = make_loader(settings)
        it: Iterator[Any] = iter(loader)

        def nxt() -> Any:
            # Short epochs (small datasets) wrap around, as a training loop's epochs do.
            nonlocal it
            try:
                return next(it)
            except StopIteration:
                it = iter(loader)
                return next(it)

        epoch = epoch_batches(loader)
        whole = 0
        if epoch is not None:
            # the shortest window that still drains the queue (with workers), else 8 batches
            least = batches if in_flight(settings) else MIN_TIMED_BATCHES
            if whole_epochs is None:
                whole_epochs = epoch < skip + least
            if whole_epochs or epoch < skip + least:
                skip = math.ceil(skip / epoch) * epoch
                whole = math.ceil(batches / epoch)
                batches = whole * epoch
            else:
                batches = min(batches, epoch - skip)
        startup = 0.0
        if skip:
            consume(nxt())
            startup = time.perf_counter() - t_start
        for _ in range(skip - 1):
            consume(nxt())
        if whole:  # windows of whole epochs, each with its refill, as training pays it
            n_windows = min(WINDOWS, whole)
            ends = [epoch * round(whole * (k + 1) / n_windows)  # type: ignore[operator]
                    for k in range(n_windows)]
        else:
            n_windows = min(WINDOWS, batches)
            ends = [round(batches * (k + 1) / n_windows) for k in range(n_windows)]
        windows: list[tuple[float, float, int]] = []  # (wait s, step s, samples) per window
        wait = step = 0.0
        samples = 0
        c0, w0 = _proc_cpu(proc), time.perf_counter()
        for i in range(batches):
            t0 = time.perf_counter()
            b = nxt()
            t1 = time.perf_counter()
            consume(b)
            t2 = time.perf_counter()
            wait += t1 - t0
            step += t2 - t0
            samples += batch_samples(b) or 1
            if i + 1 == ends[len(windows)]:
                windows.append((wait, step, samples))
                wait = step = 0.0
                samples = 0
        busy = (_proc_cpu(proc) - c0) / max(1e-9, time.perf_counter() - w0)
        per_worker = _worker_bytes(proc) if settings.num_workers else None
    finally:
        torch.set_num_threads(threads)
    rates = [n / max(1e-12, s) for _, s, n in windows]
    median = sorted(range(len(rates)), key=rates.__getitem__)[len(rates) // 2]
    later = rates[1:]
    spread = (max(later) - min(later)) / rates[median] if len(later) >= 2 else 0.0
    w_s, s_s, _ = windows[median]
    return Trial(settings, torch_threads, rates[median], w_s / max(1e-12, s_s), busy,
                 time.perf_counter() - t_start,
                 timed_batches=batches, whole_epochs=whole, worker_bytes=per_worker,
                 spread_fraction=spread, startup_s=startup)


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


def epoch_batches(loader: Any) -> int | None:
    """Batches per epoch, None when the loader cannot say (an IterableDataset)."""
    try:
        n = len(loader)
    except TypeError:
        return None
    return n if n > 0 else None


def consume_time(make_loader: Callable[[LoaderSettings], DataLoader[Any]],
                 consume: Callable[[Any], None], repeats: int = 5) -> tuple[float, Any]:
    """(median time the consumer takes per batch with data ready, that batch)."""
    batch = next(iter(make_loader(LoaderSettings())))
    consume(batch)  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        consume(batch)
        times.append(time.perf_counter() - t)
    return statistics.median(times), batch


def merge_rank_trials(trials: list[Trial]) -> Trial:
    """The job's view of one setting from every rank's trial: samples/s add up (each rank
    loads its own shard), data wait and CPU busy are the worst rank's (the job steps at the
    pace of the rank whose loader lags), the window the shortest."""
    if len(trials) == 1:
        return trials[0]
    t0 = trials[0]
    return Trial(t0.settings, t0.torch_threads, sum(t.samples_per_s for t in trials),
                 max(t.data_wait_fraction for t in trials),
                 max(t.cpu_cores_busy for t in trials), max(t.seconds for t in trials),
                 timed_batches=min(t.timed_batches for t in trials),
                 whole_epochs=min(t.whole_epochs for t in trials),
                 spread_fraction=max(t.spread_fraction for t in trials),
                 startup_s=max(t.startup_s for t in trials))


def autotune_loader(make_loader: Callable[[LoaderSettings], DataLoader[Any]],
                    consume: Callable[[Any], None], *, device: str = "cpu",
                    batches_per_trial: int = 24, max_workers: int | None = None,
                    cpus: float | None = None, agree: Agreement | None = None) -> LoaderPlan:
    """Find DataLoader settings for this loop by measuring it.

    Args:
        make_loader: builds the user's DataLoader with the given settings (pass
            ``**settings.loader_kwargs()`` to ``DataLoader``).
        consume: one training step on a batch (or a stand-in with the device's speed).
        device: where batches go; ``pin_memory`` is chosen only for CUDA.
        batches_per_trial: batches timed per setting.
        max_workers: upper bound (default: 2 × usable CPUs, enough for I/O-bound fetches).
        cpus: usable CPUs (default: affinity ∩ cgroup quota).
        agree: the job's ranks, each tuning its own loader in step with the others (each
            trial runs the training step, whose collectives need every rank): every input of
            a decision is agreed (the least CPUs, /dev/shm and RAM of any rank; each trial
            merged by :func:`merge_rank_trials`), so every rank stops at the same trial.

    Returns:
        A :class:`LoaderPlan` with the settings, every trial and the reason in numbers.
    """
    t_begin = time.perf_counter()
    job = agree or Agreement()
    budget = job.min(cpus if cpus is not None else cpu_budget().cpus, "loader CPUs")
    cap = max_workers if max_workers is not None else max(1, int(2 * budget))
    io_cap = max_workers if max_workers is not None else max(cap, MAX_IO_WORKERS)
    pin = device.startswith("cuda") and torch.cuda.is_available()
    consume_s, sample_batch = consume_time(make_loader, consume)
    consume_s = job.max(consume_s, "loader consume time")
    plan = LoaderPlan(LoaderSettings(), max(1, int(budget)), consume_s)
    # One window rule for every trial (see measure): whole epochs when the deepest queue this
    # search may try (cap workers × prefetch 4: its skip and its windows) would leave no room
    # inside an epoch.
    epoch = epoch_batches(make_loader(LoaderSettings()))
    deepest = LoaderSettings(num_workers=cap, prefetch_factor=4)
    whole = epoch is not None and \
        epoch < in_flight(deepest) + 1 + window_batches(deepest, batches_per_trial)

    def measure_(s: LoaderSettings, threads: int) -> Trial:
        return merge_rank_trials(job.run(
            lambda: measure(make_loader, consume, s, threads, batches_per_trial,
                            whole_epochs=whole), f"loader trial {s.num_workers} workers"))

    first = measure_(plan.settings, plan.torch_threads)
    plan.trials.append(first)
    best = first
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
    workers = 1
    prefetch = 2  # PyTorch's default; deepened once at the end if the fetch is I/O-bound
    stalls = 0
    last: Trial | None = None
    while not reason:
        # A fetch that waits (its workers leave the cores idle) may use more workers than
        # cores: they wait in parallel. Then memory, /dev/shm and open files bound them.
        waits = last is not None and _waits(last, budget)
        if workers > (io_cap if waits else cap):
            reason = (f"reached {io_cap} workers (the most tried for a fetch that waits)"
                      if waits else f"reached {cap} workers (2 × {budget:g} usable CPUs)")
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
        trial = measure_(s, max(1, int(budget) - workers))
        plan.trials.append(trial)
        last = trial
        # a gain counts only beyond the noise of both rates (their windows' spread)
        needed = max(MIN_GAIN, best.spread_fraction, trial.spread_fraction)
        gained = trial.samples_per_s >= best.samples_per_s * (1 + needed)
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
        if stalls >= 2:
            # One worker often only matches the main process (same one core); two misses in a
            # row, with CPUs to spare, mean the fetch is not what limits.
            reason = (f"{workers} workers gave {trial.samples_per_s:,.0f} samples/s vs "
                      f"{best.samples_per_s:,.0f} with {best.settings.num_workers}: no gain "
                      f"≥ {needed:.0%} (the larger of {MIN_GAIN:.0%} and the windows' "
                      "spread) twice in a row")
            break
        if workers >= budget and trial.cpu_cores_busy >= IO_BOUND * budget:
            # More workers than cores only pay when they mostly wait (I/O-bound fetches).
            reason = (f"{workers} workers already keep {trial.cpu_cores_busy:.2f} of "
                      f"{budget:g} CPUs busy: more workers than cores would only queue")
            break
        workers = workers + 1 if workers < budget else workers * 2
    if (best.settings.num_workers and best.data_wait_fraction > WAIT_TARGET
            and _waits(best, budget)):
        # The fetch waits rather than computes: a deeper queue per worker may hide latency.
        deeper = dataclasses.replace(best.settings, prefetch_factor=4)
        trial = measure_(deeper, best.torch_threads)
        plan.trials.append(trial)
        needed = max(MIN_GAIN, best.spread_fraction, trial.spread_fraction)
        if trial.samples_per_s >= best.samples_per_s * (1 + needed):
            best = trial
            reason += "; prefetch_factor 4 helped"
    plan.settings, plan.torch_threads = best.settings, best.torch_threads
    plan.reason = (f"{reason}. Chosen: {best.settings.num_workers} workers, prefetch "
                   f"{best.settings.prefetch_factor}, pin_memory {best.settings.pin_memory}, "
                   f"{best.torch_threads} torch threads → "
                   f"{best.samples_per_s:,.0f} samples/s, data wait "
                   f"{best.data_wait_fraction:.1%} (consumer needs {consume_s * 1e3:.1f} ms/batch"
                   + (f"; timed over whole epochs of {best.timed_batches // best.whole_epochs} "
                      "batches, refills included" if best.whole_epochs else "") + ")")
    plan.tuning_s = time.perf_counter() - t_begin
    return plan


def rebuild_factory(loader: DataLoader[Any], batch_size: int | None = None,
                    dataset: Any = None) -> Callable[[LoaderSettings], DataLoader[Any]]:
    """A ``make_loader`` that rebuilds this DataLoader (same dataset, sampling and collation;
    same batch size unless ``batch_size`` is given; ``dataset`` instead of its own, of the
    same length, where given: a cached view of it) with other settings. Raises ValueError for
    loaders it cannot rebuild faithfully (a custom batch sampler, an unknown sampler).

    A ``DistributedSampler`` is kept as the same object: the rebuilt loader reads this rank's
    shard in the same order, and the loop's ``set_epoch`` calls on it still apply."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
    from torch.utils.data.distributed import DistributedSampler

    bs = loader.batch_sampler
    if loader.batch_size is None or not isinstance(bs, BatchSampler):
        raise ValueError("the DataLoader uses a custom batch sampler: pass your own "
                         "make_loader to autotune_loader")
    shared = loader.sampler if isinstance(loader.sampler, DistributedSampler) else None
    shuffle = isinstance(loader.sampler, RandomSampler)
    if not shuffle and shared is None and not isinstance(loader.sampler, SequentialSampler):
        raise ValueError(f"the DataLoader uses a {type(loader.sampler).__name__}: pass your own "
                         "make_loader to autotune_loader")

    generator = getattr(loader.sampler, "generator", None)
    data = loader.dataset if dataset is None else dataset

    def make(s: LoaderSettings) -> DataLoader[Any]:
        kw = s.loader_kwargs()
        if s.num_workers > 0 and loader.multiprocessing_context is not None:
            kw["multiprocessing_context"] = loader.multiprocessing_context
        return DataLoader(data, batch_size=batch_size or loader.batch_size,
                          shuffle=shuffle, sampler=shared, drop_last=loader.drop_last,
                          collate_fn=loader.collate_fn, worker_init_fn=loader.worker_init_fn,
                          generator=generator, **kw)

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

