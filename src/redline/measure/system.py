"""Host facts that bound what a data pipeline can do: usable CPUs, /dev/shm, CPU features."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuBudget:
    """CPUs this process may really use."""

    cpus: float
    """min(affinity mask, cgroup CPU quota) in cores."""
    source: str
    """Where the number came from, e.g. 'sched_getaffinity=2' or 'cgroup cpu.max=1.5'."""


def _cgroup_quota(root: Path) -> float | None:
    v2 = root / "cpu.max"
    try:
        quota, period = v2.read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        q = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        p = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return q / p if q > 0 and p > 0 else None
    except (OSError, ValueError):
        return None


def cpu_budget(cgroup_root: Path = Path("/sys/fs/cgroup")) -> CpuBudget:
    """Usable CPUs: the affinity mask, lowered by a cgroup CPU quota (containers, Slurm).

    ``os.cpu_count()`` counts the host's CPUs and over-states what a container may use; the
    DataLoader itself only checks the affinity mask (``_check_worker_number_rationality``).
    """
    try:
        aff = len(os.sched_getaffinity(0))
        src = f"sched_getaffinity={aff}"
    except AttributeError:  # not on Linux
        aff = os.cpu_count() or 1
        src = f"os.cpu_count={aff}"
    quota = _cgroup_quota(cgroup_root)
    if quota is not None and quota < aff:
        return CpuBudget(cpus=quota, source=f"cgroup quota={quota:g} (affinity {aff})")
    return CpuBudget(cpus=float(aff), source=src)


@dataclass(frozen=True, slots=True, kw_only=True)
class ShmInfo:
    """Size of the shared-memory filesystem DataLoader workers pass batches through."""

    total_bytes: int
    free_bytes: int


def shm_info(path: str = "/dev/shm") -> ShmInfo | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return ShmInfo(total_bytes=st.f_blocks * st.f_frsize, free_bytes=st.f_bavail * st.f_frsize)


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """CPU feature flags (Linux); empty when unreadable."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()
