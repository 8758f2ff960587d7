"""Host-side sampler: CPU time and memory of the process and its DataLoader workers.

A background thread reads /proc through psutil every ``interval_s``. CPU time and bytes read
are cumulative counters, so the per-window value is the last reading minus the baseline; a
worker that exits between two samples loses at most one interval of its CPU time (stated in
the report's sources).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from redline.measure.processes import ProcessCpu, Table, competitors, cpu_table
from redline.measure.sched import process_run_delay, thread_run_delay, thread_schedstat, usable_cpus_busy_s


@dataclass(slots=True, kw_only=True)
class _ProcReading:
    cpu_s: float
    read_bytes: int
    read_chars: int
    rss: int
    run_delay_s: float | None = None
    """Scheduler run delay of the process's main thread so far (children only)."""


@dataclass(slots=True, kw_only=True)
class CpuWindow:
    """CPU and I/O of one measurement window."""

    wall_s: float
    main_cpu_s: float
    """CPU seconds of the training process (all its threads)."""
    children_cpu_s: float
    """CPU seconds of its child processes (DataLoader workers) during the window."""
    children_pids: frozenset[int] = frozenset()
    """Process ids of the distinct child processes seen during the window (told apart as
    DataLoader workers or not by the caller)."""
    read_bytes: int
    """Bytes read from storage (Linux /proc/<pid>/io read_bytes), process + children."""
    read_chars: int
    """Bytes returned by read() syscalls (page-cache hits included), process + children."""
    main_rss_peak_bytes: int
    children_rss_peak_bytes: int
    """Peak over samples of the summed RSS of all children."""
    io_available: bool
    children_read_bytes: int = 0
    """Of ``read_bytes``, the children's (the workers': what the fetch itself read)."""
    children_read_chars: int = 0
    children_run_delay_s: float | None = None
    """Seconds the children's main threads (DataLoader workers) were runnable but waiting for
    a CPU during the window (/proc/<pid>/schedstat); None where unreadable."""
    main_thread_run_delay_s: float | None = None
    """Seconds the thread that opened the window (the training loop's) was runnable but
    waiting for a CPU during it (/proc/self/task/<tid>/schedstat); None where unreadable."""
    main_thread_cpu_s: float | None = None
    """CPU seconds of that thread alone during the window (the same file), without the
    process's other threads (communication, intra-op pools, samplers); None where
    unreadable."""
    usable_cpus_busy_s: float | None = None
    """CPU seconds spent by anything (this job and every other process) on the CPUs this
    process may run on, during the window (/proc/stat per CPU); None where unreadable."""
    processes: list[ProcessCpu] | None = None
    """The other processes that used CPU on those CPUs during the window, children included,
    most CPU first (:func:`redline.measure.processes.competitors`); None where unreadable."""


def _read(p: psutil.Process, run_delay: bool = False) -> _ProcReading | None:
    try:
        with p.oneshot():
            cpu_times = p.cpu_times()
            rss = p.memory_info().rss
            try:
                io_counters = p.io_counters()
                read_bytes = int(io_counters.read_bytes)
                read_chars = int(getattr(io_counters, "read_chars", 0))
            except (psutil.AccessDenied, AttributeError, NotImplementedError):
                read_bytes, read_chars = -1, -1
        return _ProcReading(cpu_s=cpu_times.user + cpu_times.system, read_bytes=read_bytes,
                            read_chars=read_chars, rss=int(rss),
                            run_delay_s=process_run_delay(p.pid) if run_delay else None)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def _own_read_chars() -> int | None:
    """This process's read() bytes so far (/proc/self/io rchar), None where unreadable."""
    try:
        with open("/proc/self/io", "rb") as proc_io:
            for line in proc_io:
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


SERIES_MAX = 100_000
"""Samples kept for the timeline (the most recent ones): 5.5 h at the default 0.2 s period."""


class CpuSampler:
    """Samples the current process and its children in a daemon thread.

    Its own reads of /proc are read() calls of the training process: they are counted
    (``/proc/self/io`` before and after each sampling) and left out of the process's read
    bytes, so a job that reads nothing reads nothing in the report."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self._interval = interval_s
        self._proc = psutil.Process()
        self._children: dict[int, psutil.Process] = {}
        self._last: dict[int, _ProcReading] = {}
        self._base: dict[int, _ProcReading] = {}
        self._main_base: _ProcReading | None = None
        self._busy_base: float | None = None
        self._table_base: Table | None = None
        self._loop_tid = threading.get_native_id()
        self._loop_base: tuple[float, float] | None = None
        """(CPU seconds, run delay seconds) of the training loop's thread when the window
        opened (its schedstat); None where unreadable."""
        self._own_reads = 0
        """read() bytes of this sampler's own /proc reads since the window began."""
        self._t0 = 0.0
        self._peak_main = 0
        self._peak_children = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ticker: Callable[[float], float] | None = None
        self._tick_s = interval_s
        self.on_sample: Callable[[float, int, dict[int, int]], None] | None = None
        """Called with (perf_counter s, RSS of this process, {child pid: RSS}) at each sample,
        on the thread that sampled (:class:`redline.measure.memory.MemorySampler`)."""
        self.loop_delay: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=SERIES_MAX)
        """(host perf_counter s, scheduler run delay of the training loop's thread so far) per
        sample (/proc/self/task/<tid>/schedstat): whether slow steps waited for a CPU. (The
        intra-op threads' delay is left out: spinning pool threads wait on each other, which
        is not the loop's wait.)"""
        self.series: collections.deque[tuple[float, float, float]] = collections.deque(
            maxlen=SERIES_MAX)
        """(host perf_counter s, CPU seconds of this process, of its children) per sample,
        cumulative since each process started, warm-up included (for the timeline export).
        Children that exited leave the sum: rates are clamped at zero by the reader."""

    @property
    def pid(self) -> int:
        """The sampled process (the training process)."""
        return self._proc.pid

    def loop_delay_between(self, t0: float, t1: float) -> float | None:
        """Run delay of the training loop's thread (:attr:`loop_delay`) between the last sample
        at or before ``t0`` and the first at or after ``t1`` (an upper bound of its delay
        within [t0, t1]); None where no samples bracket them."""
        before = after = None
        for sample_t, delay_s in list(self.loop_delay):  # a copy: the sampler's thread appends
            if sample_t <= t0:
                before = delay_s
            elif sample_t >= t1:
                after = delay_s
                break
        return None if before is None or after is None else max(0.0, after - before)

    def set_ticker(self, ticker: Callable[[float], float], period_s: float) -> None:
        """Call ``ticker(perf_counter())`` on this sampler's thread, between its own samples (the
        stack sampler rides on it: no thread of its own): first after ``period_s``, then after
        the seconds each call returns, or sooner where this sampler's own sample is due."""
        self._ticker = ticker
        self._tick_s = min(period_s, self._interval)

    def start(self) -> None:
        self.mark()
        self._thread = threading.Thread(target=self._run, name="redline-cpu", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample()

    def mark(self) -> None:
        """Start a new window now (called at the end of warm-up)."""
        self.sample()
        table = cpu_table()  # before the I/O baseline: its /proc reads are not the job's
        with self._lock:
            self._table_base = table
            self._base = dict(self._last)
            self._busy_base = usable_cpus_busy_s()
            self._main_base = _read(self._proc)
            # the window opens at a step boundary, on the training loop's thread
            self._loop_tid = threading.get_native_id()
            self._loop_base = thread_schedstat(self._loop_tid)
            self._own_reads = 0
            self._t0 = time.perf_counter()
            self._peak_main = 0
            self._peak_children = 0

    def _run(self) -> None:
        ticker, clock = self._ticker, time.perf_counter
        if ticker is None:
            while not self._stop.wait(self._interval):
                self.sample()
            return
        due = clock() + self._interval
        wait_s = self._tick_s
        while not self._stop.wait(wait_s):
            now = clock()
            period_s = ticker(now)
            if now >= due:
                self.sample()
                due = clock() + self._interval
            # the ticker's period, cut short where the sample falls due first (a period that
            # does not divide the interval would otherwise delay every sample)
            wait_s = max(1e-4, min(period_s, due - clock()))

    def _child_pids(self) -> list[int]:
        """Descendant pids. Linux lists each thread's children in /proc/<pid>/task/<tid>/children
        (a few small reads); psutil's fallback scans every process on the machine, which costs
        ~0.6 ms and thousands of allocations per sample."""
        pids: list[int] = []
        todo = [self._proc.pid]
        try:
            while todo:
                pid = todo.pop()
                for task in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{task}/children") as children_file:
                        kids = [int(child) for child in children_file.read().split()]
                    pids.extend(kids)
                    todo.extend(kids)
            return pids
        except (OSError, ValueError):
            try:
                return [k.pid for k in self._proc.children(recursive=True)]
            except psutil.Error:
                return []

    def sample(self) -> None:
        reads_before = _own_read_chars()
        self._sample()
        reads_after = _own_read_chars()
        if reads_before is not None and reads_after is not None:
            with self._lock:
                self._own_reads += reads_after - reads_before

    def _sample(self) -> None:
        readings: dict[int, _ProcReading] = {}
        for pid in self._child_pids():
            proc = self._children.get(pid)
            if proc is None:
                try:
                    proc = self._children[pid] = psutil.Process(pid)
                except psutil.Error:
                    continue
            reading = _read(proc, run_delay=True)
            if reading is not None:
                readings[pid] = reading
        main = _read(self._proc)
        if main is not None:
            now = time.perf_counter()
            self.series.append((now, main.cpu_s, sum(reading.cpu_s for reading in readings.values())))
            if self.on_sample is not None:
                self.on_sample(now, main.rss, {pid: reading.rss for pid, reading in readings.items()})
            delay = thread_run_delay(self._loop_tid)
            if delay is not None:
                self.loop_delay.append((now, delay))
        with self._lock:
            self._last.update(readings)
            self._peak_children = max(self._peak_children, sum(reading.rss for reading in readings.values()))
            if main is not None:
                self._peak_main = max(self._peak_main, main.rss)

    def window(self) -> CpuWindow:
        """Totals since the last :meth:`mark`."""
        self.sample()
        reads_before = _own_read_chars()
        busy = usable_cpus_busy_s()
        table = cpu_table()
        own = self._own_reads + max(0, (_own_read_chars() or 0) - (reads_before or 0))
        main = _read(self._proc)
        loop, loop_base = thread_schedstat(self._loop_tid), self._loop_base
        with self._lock:
            wall = time.perf_counter() - self._t0
            zero = _ProcReading(cpu_s=0.0, read_bytes=0, read_chars=0, rss=0)
            child_cpu = 0.0
            read_bytes = read_chars = 0
            io_ok = True
            seen: set[int] = set()
            delay: float | None = 0.0
            for pid, last in self._last.items():
                base = self._base.get(pid, zero)
                if pid in self._base and last is base:
                    continue  # unchanged since the window began (e.g. died before it)
                seen.add(pid)
                child_cpu += max(0.0, last.cpu_s - base.cpu_s)
                if last.run_delay_s is None or delay is None:
                    delay = None
                else:
                    delay += max(0.0, last.run_delay_s - (base.run_delay_s or 0.0))
                if last.read_bytes < 0:
                    io_ok = False
                else:
                    read_bytes += max(0, last.read_bytes - base.read_bytes)
                    read_chars += max(0, last.read_chars - base.read_chars)
            crb, crc = read_bytes, read_chars
            main_base = self._main_base
            main_cpu = main.cpu_s - main_base.cpu_s if main and main_base else 0.0
            if main and main_base and main.read_bytes >= 0 and main_base.read_bytes >= 0:
                read_bytes += main.read_bytes - main_base.read_bytes
                read_chars += max(0, main.read_chars - main_base.read_chars - own)
            else:
                io_ok = False
            return CpuWindow(
                wall_s=wall,
                main_cpu_s=main_cpu,
                children_cpu_s=child_cpu,
                children_pids=frozenset(seen),
                read_bytes=read_bytes,
                read_chars=read_chars,
                main_rss_peak_bytes=self._peak_main,
                children_rss_peak_bytes=self._peak_children,
                io_available=io_ok,
                children_read_bytes=crb,
                children_read_chars=crc,
                children_run_delay_s=delay,
                main_thread_run_delay_s=(None if loop is None or loop_base is None
                                         else max(0.0, loop[1] - loop_base[1])),
                main_thread_cpu_s=(None if loop is None or loop_base is None
                                   else max(0.0, loop[0] - loop_base[0])),
                usable_cpus_busy_s=(None if busy is None or self._busy_base is None
                                    else max(0.0, busy - self._busy_base)),
                processes=(None if table is None or self._table_base is None
                           else competitors(self._table_base, table, wall, set(self._last))),
            )
