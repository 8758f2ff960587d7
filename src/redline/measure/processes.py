"""Which processes used CPU on this job's CPUs during a window: every process's CPU time read
from /proc at the window's start and end (not per step), for naming what competes with the
training loop for its CPUs (``cpu_contention``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

COMMAND_CHARS = 160
"""A command line is cut to this many characters (an argument list can run to kilobytes)."""

LISTED_MAX = 10
"""Processes other than the job's own children listed at most, most CPU first (the job's
children are all listed: they are the job's own to move)."""

LISTED_MIN_CORES = 0.02
"""A process is listed from 2 % of a core over the window: below that, its CPU is the
background of any host (daemons, shells, the sampler of a monitoring agent)."""

Table = dict[int, tuple[int, float]]
"""{pid: (start time in clock ticks since boot, CPU seconds so far: user + system)}."""


@dataclass(slots=True, kw_only=True)
class ProcessCpu:
    """A process that used CPU on the job's CPUs during the window."""

    pid: int
    command: str
    """Its command line, cut to :data:`COMMAND_CHARS` characters (its name where unreadable)."""
    cpu_s: float
    """CPU seconds it used during the window (all its threads), on the job's CPUs: a process
    allowed on n CPUs of which k are the job's counts k/n of its CPU time (the scheduler
    spreads a process over the CPUs it may use; /proc has no per-CPU time of a process)."""
    child: bool
    """A descendant of the training process."""
    same_job: bool = False
    """Another rank of this multi-process job, or one of its workers or its launcher: the same
    ``TORCHELASTIC_RUN_ID``, or ``MASTER_ADDR``:``MASTER_PORT``, in its environment. Ranks that
    share CPUs are the straggler rule's to explain, not competition from outside the job."""


def cpu_table() -> Table | None:
    """Every process's start time and CPU seconds (``/proc/<pid>/stat``, fields 14, 15 and 22
    of proc(5)); None where /proc is not Linux's. A few µs per process."""
    try:
        tick = float(os.sysconf("SC_CLK_TCK"))
        names = os.listdir("/proc")
    except (OSError, ValueError, AttributeError):
        return None
    out: Table = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
            rest = raw[raw.rindex(b")") + 2:].split()  # the name may hold spaces and ')'
            out[int(name)] = (int(rest[19]), (int(rest[11]) + int(rest[12])) / tick)
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile, or not readable
    return out


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        if not cmd:
            with open(f"/proc/{pid}/comm", "rb") as f:
                cmd = "[" + f.read().decode(errors="replace").strip() + "]"
    except OSError:
        return "?"
    return cmd if len(cmd) <= COMMAND_CHARS else cmd[:COMMAND_CHARS - 1] + "…"


_JOB_VARS = (b"TORCHELASTIC_RUN_ID", b"MASTER_ADDR", b"MASTER_PORT")


def _job_key(environ: dict[bytes, bytes]) -> tuple[bytes | None, ...] | None:
    key = tuple(environ.get(v) for v in _JOB_VARS)
    return key if key[0] is not None or key[2] is not None else None


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out: dict[bytes, bytes] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name in _JOB_VARS:
            out[name] = value
    return out


def own_job_key() -> tuple[bytes | None, ...] | None:
    """This process's job: its rendezvous variables as it started (None outside a
    multi-process job)."""
    return _job_key(_environ(os.getpid()))


def competitors(base: Table, end: Table, wall_s: float, children: set[int]) -> list[ProcessCpu]:
    """Processes other than this one that used ≥ LISTED_MIN_CORES on the CPUs this process may
    run on between the two tables, most CPU first (the job's children all, at most LISTED_MAX
    others). A process started during the window counts all its CPU time; one that exited
    before its end is missed."""
    me = os.getpid()
    try:
        ours = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        ours = set()
    found: list[tuple[float, int]] = []
    for pid, (start, cpu) in end.items():
        if pid == me:
            continue
        was = base.get(pid)
        used = cpu - was[1] if was is not None and was[0] == start else cpu
        if used >= LISTED_MIN_CORES * wall_s:
            found.append((used, pid))
    weighted: list[tuple[float, int]] = []
    for used, pid in found:
        try:
            allowed = os.sched_getaffinity(pid)
        except OSError:
            continue  # exited
        share = len(allowed & ours) / len(allowed) if ours and allowed else 1.0
        if share > 0 and used * share >= LISTED_MIN_CORES * wall_s:
            weighted.append((used * share, pid))
    out: list[ProcessCpu] = []
    others = 0
    job = own_job_key()
    for used, pid in sorted(weighted, reverse=True):
        child = pid in children
        if not child:
            if others == LISTED_MAX:
                continue
            others += 1
        same = job is not None and _job_key(_environ(pid)) == job
        out.append(ProcessCpu(pid=pid, command=_command(pid), cpu_s=used, child=child,
                              same_job=same))
    return out
