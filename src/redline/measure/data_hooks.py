"""The data path's hooks: DataLoader iteration (data wait, batches, worker start-up) and
host→device copies. Installed by :class:`redline.measure.hooks.Instrumentation` on its
``ExitStack`` and removed with it."""

from __future__ import annotations

import math
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from redline.measure.loader import LoaderInfo, batch_nbytes, batch_samples, loader_info
from redline.measure.patching import compiling, patch
from redline.measure.sched import ThreadRunDelay
from redline.measure.step_record import DATA_WAIT, H2D_COPY
from redline.measure.timeline import StepTracker

T = TypeVar("T")

FETCHES_READ_IN_FULL = 64
"""The first 64 fetches of a watch have their CPU time and run delay read (a clock syscall and
a /proc read before and after each); after them, each fetch with probability one in
:data:`FETCH_READ_ONE_IN`, independently, weighted by that rate. The reads are four system
calls a fetch, which cost more than their own µs (kernel entry and exit disturb the loop's
caches; more so on virtual machines): on a step of a few hundred µs they were about a third of
the watch's cost (``benchmarks/overhead.py``). A random choice (not every n-th) cannot fall in
step with the workers' round-robin, and the weights keep the sums unbiased (Horvitz–Thompson);
the fractions they feed (the fetch's CPU and run-delay share) need hundreds of fetches, not
all."""

FETCH_READ_ONE_IN = 8


@dataclass(slots=True, kw_only=True)
class H2DStats:
    """Host→device copies made through ``Tensor.to`` / ``Tensor.cuda``."""

    copies: int = 0
    bytes: int = 0
    pageable_bytes: int = 0
    """Bytes copied from pageable (not pinned) host memory: such copies block the host."""
    host_s: float = 0.0


class DataHooks:
    """Times the loop's waits for data and its host→device copies.

    Args:
        tracker: receives the data-wait and copy phases and the batches.
        tid: the training thread (other threads' calls pass through untimed).
        on_work: called when device work of a step may begin (an H2D copy).
        on_data: called when the host starts waiting for a batch (device work pauses).
        keep_loaders: keep a reference to each DataLoader seen (to rebuild it later).
    """

    def __init__(self, tracker: StepTracker, tid: int, on_work: Callable[[], None] | None,
                 on_data: Callable[[], None] | None, keep_loaders: bool) -> None:
        self.tracker, self._tid = tracker, tid
        self._clock = time.perf_counter
        self._on_work, self._on_data, self._keep_loaders = on_work, on_data, keep_loaders
        self.loaders: list[LoaderInfo] = []
        self._loader_by_id: dict[int, LoaderInfo] = {}
        self._worker_iters: weakref.WeakSet[Any] = weakref.WeakSet()
        """Live iterators with worker processes (to stop them when the job is terminated)."""
        self.workers_started = False
        # New iterators waiting for their first batch: id → (iterator ref, loader, start-up s).
        # A plain dict checked for emptiness first: the steady-state next() pays one truth test.
        self._iter_info: dict[int, tuple[weakref.ref[Any], LoaderInfo, float | None]] = {}
        self.h2d = H2DStats()
        self.wrapped_iterables = 0
        self.before_fetch: Callable[[], None] | None = None
        """Called before each fetch once set (the recorder sets it when its step limit is
        reached: a loop whose step swallows the stop is stopped at its next fetch)."""
        self.run_delay: ThreadRunDelay | None = None
        """The training thread's scheduler run delay, read around each fetch (None before
        install)."""
        self.run_delay_known = False
        """Whether the run delay could be read (Linux schedstat), fixed at install."""

    def mark_training(self, loader: Any) -> bool:
        """Name ``loader`` the training loader; False when it was never iterated here."""
        info = self._loader_by_id.get(id(loader))
        if info is not None:
            info.training = True
        return info is not None

    def install(self, stack: ExitStack) -> None:
        orig_iter = DataLoader.__iter__
        orig_next = _BaseDataLoaderIter.__next__
        tracker, clock, tid = self.tracker, self._clock, self._tid
        inst = self
        # Installed on the training thread: its descriptor reads that thread's schedstat.
        self.run_delay = run_delay = ThreadRunDelay()
        self.run_delay_known = run_delay.available
        stack.callback(run_delay.close)
        delay = run_delay.read
        # its own generator: the user's random state is never advanced by the watch
        chance = random.Random(0).random
        log_skip = math.log(1.0 - 1.0 / FETCH_READ_ONE_IN)
        full_left = FETCHES_READ_IN_FULL
        weight = 1.0
        countdown = 1
        """Fetches until the next one read (1: this one)."""

        def next_read() -> int:
            # After the first fetches, each fetch is read with probability 1/FETCH_READ_ONE_IN,
            # independently: the gap to the next read is geometric (drawn once per read, so a
            # fetch not read costs one decrement, not a random draw).
            nonlocal full_left, weight
            if full_left > 1:
                full_left -= 1
                return 1
            weight = float(FETCH_READ_ONE_IN)
            return 1 + int(math.log(1.0 - chance()) / log_skip)

        def dl_iter(loader: DataLoader[Any]) -> Any:
            if threading.get_ident() != tid:
                return orig_iter(loader)
            info = inst._loader_by_id.get(id(loader))
            if info is None:
                info = loader_info(loader)
                if inst._keep_loaders:
                    info.loader = loader
                inst._loader_by_id[id(loader)] = info
                inst.loaders.append(info)
            spawns = info.settings.num_workers > 0 and (
                not info.settings.persistent_workers or getattr(loader, "_iterator", None) is None
            )
            start_s = clock()
            tracker.enter(DATA_WAIT, start_s)
            try:
                loader_iter = orig_iter(loader)
            finally:
                end_s = clock()
                tracker.exit(DATA_WAIT, end_s)
            info.iterators += 1
            if spawns:
                info.worker_starts += 1
            if info.settings.num_workers > 0:
                inst._worker_iters.add(loader_iter)
                inst.workers_started = True
                info.worker_pids.update(  # started in the iterator's __init__
                    worker.pid for worker in getattr(loader_iter, "_workers", ()) if worker.pid is not None)
            inst._iter_info[id(loader_iter)] = (weakref.ref(loader_iter), info,
                                                (end_s - start_s) if spawns else None)
            return loader_iter

        get_ident, thread_time = threading.get_ident, time.thread_time
        push, exit_, fetched, Tensor = tracker.push, tracker.exit, tracker.fetched, torch.Tensor
        add_reading = tracker.add_fetch_reading
        on_data = self._on_data

        def dl_next(it: Any) -> Any:
            nonlocal countdown
            if get_ident() != tid:
                return orig_next(it)
            if inst.before_fetch is not None:
                inst.before_fetch()
            if on_data is not None:
                on_data()
            countdown -= 1
            read = not countdown
            if read:  # the CPU clock read next to the wall clock: CPU ≤ wall for the fetch
                delay_start_s = delay()
                cpu_start_s = thread_time()
            start_s = clock()
            push([DATA_WAIT, start_s, 0.0])
            try:
                batch = orig_next(it)
            except BaseException:  # the end of the epoch (StopIteration), a dataset's error
                exit_(DATA_WAIT, clock())
                raise
            end_s = clock()
            cpu_end_s = thread_time() if read else 0.0
            # batch_samples' own fast path, inline for the usual batch (a tensor, or a tuple or
            # list that starts with one): this runs at every fetch
            kind = type(batch)
            lead = batch[0] if (kind is tuple or kind is list) and batch else batch
            fetched(end_s, lead.shape[0] if type(lead) is Tensor and lead.dim()
                    else batch_samples(batch))
            if read:
                fetch_weight = weight
                add_reading((cpu_end_s - cpu_start_s) * fetch_weight,
                            (delay() - delay_start_s) * fetch_weight, (end_s - start_s) * fetch_weight)
                countdown = next_read()
            first = inst._iter_info.pop(id(it), None) if inst._iter_info else None
            if first is not None and first[0]() is it:
                _, info, startup = first
                tracker.fetch_loader(info)  # an evaluation forward next counts its iterator
                if startup is not None:
                    info.startup_s.append(startup + (end_s - start_s))
                if info.batch_bytes is None:
                    info.batch_bytes = batch_nbytes(batch)
            return batch

        patch(stack, DataLoader, "__iter__", dl_iter)
        patch(stack, _BaseDataLoaderIter, "__next__", dl_next)

    def stop_workers(self) -> int | None:
        """Shut down the worker processes of every live iterator (the job is ending: they would
        go on fetching while the report is written). Returns how many are still alive after
        (0: all stopped), or None when no iterator with workers ever ran."""
        if not self.workers_started:
            return None
        for loader_iter in list(self._worker_iters):
            shutdown = getattr(loader_iter, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
        return sum(1 for loader_iter in list(self._worker_iters)
                   for worker in getattr(loader_iter, "_workers", []) if worker.is_alive())

    def wrap(self, iterable: Iterable[T]) -> Iterator[T]:
        """Time ``next()`` on any iterable as data wait (for loops without a DataLoader)."""
        self.wrapped_iterables += 1
        tracker, clock = self.tracker, self._clock
        iterator = iter(iterable)
        while True:
            if self.before_fetch is not None:
                self.before_fetch()
            if self._on_data is not None:
                self._on_data()
            delay = self.run_delay.read if self.run_delay is not None else _no_delay
            delay_start_s = delay()
            cpu_start_s = time.thread_time()
            start_s = clock()
            tracker.enter(DATA_WAIT, start_s)
            try:
                item = next(iterator)
            except StopIteration:
                tracker.exit(DATA_WAIT, clock())
                return
            end_s = clock()
            cpu_s = time.thread_time() - cpu_start_s
            tracker.fetched(end_s, batch_samples(item))
            tracker.add_fetch_reading(cpu_s, delay() - delay_start_s, end_s - start_s)
            yield item

    def install_h2d(self, stack: ExitStack) -> None:
        for name in ("to", "cuda"):
            patch(stack, torch.Tensor, name, self._timed_copy(getattr(torch.Tensor, name)))

    def _timed_copy(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        tracker, clock, tid, stats = self.tracker, self._clock, self._tid, self.h2d

        def wrapper(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if compiling() or t.device.type != "cpu" or threading.get_ident() != tid:
                return orig(t, *args, **kwargs)
            if self._on_work is not None:
                self._on_work()
            start_s = clock()
            out = orig(t, *args, **kwargs)
            end_s = clock()
            if isinstance(out, torch.Tensor) and out.device.type != "cpu":
                # Recorded after the fact (nothing nests inside a copy), so CPU→CPU casts
                # through .to() never count as copy time.
                tracker.enter(H2D_COPY, start_s)
                tracker.exit(H2D_COPY, end_s)
                nbytes = t.numel() * t.element_size()
                stats.copies += 1
                stats.bytes += nbytes
                stats.host_s += end_s - start_s
                try:
                    pinned = t.is_pinned()
                except RuntimeError:
                    pinned = False
                if not pinned:
                    stats.pageable_bytes += nbytes
            return out

        return wrapper


def _no_delay() -> float:
    return 0.0
