"""The scheduler's view: how long a thread or process was runnable but waiting for a CPU, and
how busy the CPUs this job may use are, all from /proc (Linux).

``/proc/<pid>/task/<tid>/schedstat`` holds three numbers: nanoseconds on a CPU, nanoseconds
runnable on a run queue without a CPU (the run delay), and time slices (the kernel's
Documentation/scheduler/sched-stats.rst). A fetch that is slow because another process holds
the CPU shows as run delay, not as CPU time and not as waiting on storage.
"""

from __future__ import annotations

import contextlib
import os
import threading

import psutil


def _delay(raw: bytes) -> float:
    return int(raw.split()[1]) / 1e9


class ThreadRunDelay:
    """The calling thread's run delay, read with one ``pread`` on a descriptor kept open (a
    few µs: cheap enough around every data fetch)."""

    def __init__(self) -> None:
        self._fd: int | None = None
        try:
            self._fd = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat",
                               os.O_RDONLY)
            _delay(os.pread(self._fd, 96, 0))
        except (OSError, ValueError, IndexError):
            self.close()

    @property
    def available(self) -> bool:
        return self._fd is not None

    def read(self) -> float:
        """Seconds of run delay so far (0.0 where unavailable: see :attr:`available`)."""
        if self._fd is None:
            return 0.0
        try:
            return _delay(os.pread(self._fd, 96, 0))
        except (OSError, ValueError, IndexError):
            return 0.0

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def thread_schedstat(tid: int) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds of run delay) so far of one of this process's threads
    (``/proc/self/task/<tid>/schedstat``), None where unknown (not Linux, the thread has
    exited)."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            fields = f.read().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def thread_run_delay(tid: int) -> float | None:
    """Run delay of one of this process's threads (``/proc/self/task/<tid>/schedstat``), None
    where unknown (not Linux, the thread has exited)."""
    read = thread_schedstat(tid)
    return None if read is None else read[1]


def process_run_delay(pid: int) -> float | None:
    """Run delay of a process's main thread (``/proc/<pid>/schedstat``), None where unknown."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return _delay(f.read())
    except (OSError, ValueError, IndexError):
        return None


def usable_cpus_busy_s() -> float | None:
    """CPU seconds spent so far, by anything, on the CPUs this process may run on (its
    affinity): user + nice + system + irq + softirq + steal, not idle or iowait."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
        per = psutil.cpu_times(percpu=True)
    except (AttributeError, OSError):
        return None
    total = 0.0
    for i in cpus:
        if i >= len(per):
            return None
        t = per[i]
        total += (t.user + t.nice + t.system + getattr(t, "irq", 0.0)
                  + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0))
    return total
