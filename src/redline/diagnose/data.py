"""Data-path findings: data_starvation (split into cpu_preprocessing / storage_fetch), h2d_copy."""

from __future__ import annotations

import math

from redline.core.findings import Evidence, Finding, ceiling_speedup, severity_for
from redline.core.measurements import Measurements
from redline.diagnose.thresholds import (
    CPU_BOUND_MIN_FRACTION,
    CPUS_SATURATED,
    DATA_WAIT_MIN_FRACTION,
    H2D_MIN_FRACTION,
    SECONDARY_MIN_SHARE,
)


def suggested_workers(cpus: float, local_world_size: int = 1) -> int:
    """Starting point for num_workers: one per usable CPU, minus one for the training process.
    Lightning's rule: max(1, cpus // local_world_size − 1) (``lightning.fabric.utilities.
    data.suggested_max_num_workers``)."""
    return max(1, int(cpus) // max(1, local_world_size) - 1)


def _cpu_share(m: Measurements) -> tuple[float | None, str]:
    """Share of the data wait that is CPU work (vs waiting on storage), and how it was measured."""
    nw = _workers(m)
    h = m.host
    if nw == 0:
        f = h.data_fetch_cpu_fraction
        return (None if f is None else min(1.0, f),
                "main-thread CPU time ÷ wall time inside the fetches (num_workers=0)")
    if h.workers_cpu_cores is None:
        return None, "worker CPU time unavailable"
    capacity = min(float(nw), h.cpus_available)
    return (min(1.0, h.workers_cpu_cores / capacity) if capacity > 0 else None,
            f"worker CPU cores used ÷ min(num_workers={nw}, usable CPUs={h.cpus_available:g})")


def _starving(m: Measurements) -> bool:
    """The loop waits for data step after step (data wait ≥ the threshold), not in
    one stalled fetch (a GC pause, a preempted or cold read: the report's notes name those)."""
    if m.fraction("data_wait") < DATA_WAIT_MIN_FRACTION or m.timing.step_time_mean_s is None:
        return False
    dw = m.share("data_wait")
    robust = dw.fraction_without_slowest if dw is not None else None
    return robust is None or robust >= DATA_WAIT_MIN_FRACTION


def _workers(m: Measurements) -> int:
    return m.config.loader.num_workers if m.config.loader is not None else 0


def _saturated(m: Measurements) -> bool:
    h = m.host
    return (h.main_cpu_cores or 0.0) + (h.workers_cpu_cores or 0.0) >= CPUS_SATURATED * h.cpus_available


def data_starvation(m: Measurements) -> list[Finding]:
    """The training loop waits for its next batch a measured share of every step."""
    if not _starving(m):
        return []
    f = m.fraction("data_wait")
    step = m.timing.step_time_mean_s or 0.0
    dw = m.share("data_wait")
    robust = dw.fraction_without_slowest if dw is not None else None
    h = m.host
    nw = _workers(m)
    cpus = h.cpus_available
    cpu_share, basis = _cpu_share(m)
    busy = (h.main_cpu_cores or 0.0) + (h.workers_cpu_cores or 0.0)
    saturated = _saturated(m)
    evidence: Evidence = {
        "data_wait_fraction": round(f, 4),
        "data_wait_ms_per_step": round(f * step * 1e3, 3),
        "data_wait_fraction_without_slowest_step": None if robust is None else round(robust, 4),
        "step_ms": round(step * 1e3, 3),
        "num_workers": nw,
        "cpus_available": cpus,
        "main_cpu_cores": None if h.main_cpu_cores is None else round(h.main_cpu_cores, 3),
        "workers_cpu_cores": None if h.workers_cpu_cores is None else round(h.workers_cpu_cores, 3),
        "cpu_share_of_wait": None if cpu_share is None else round(cpu_share, 3),
        "cpu_share_basis": basis,
        "read_mb_per_s": None if h.read_bytes_per_s is None else round(h.read_bytes_per_s / 1e6, 3),
        "cpus_saturated": saturated,
    }
    if nw == 0:
        rec = suggested_workers(cpus)
        fix = (f"Load batches in worker processes: DataLoader(..., num_workers={rec}, "
               "persistent_workers=True" + (", pin_memory=True" if m.device.type == "cuda" else "")
               + f"). {rec} = usable CPUs ({cpus:g}) − 1 for the training process, a starting "
               "point; redline.data.autotune_loader(make_loader, step) measures the best "
               "setting in your loop.")
    elif saturated:
        fix = (f"The {cpus:g} usable CPUs are saturated (training process {h.main_cpu_cores or 0:.2f}"
               f" + workers {h.workers_cpu_cores or 0:.2f} cores): more workers will not help. "
               "Cache the deterministic part of preprocessing (decode/resize) so it runs once, "
               "make transforms cheaper, or give the job more CPUs per device.")
    else:
        fix = (f"Workers are not keeping up and CPUs are left ({busy:.2f} of {cpus:g} cores busy): "
               f"raise num_workers above {nw} (and prefetch_factor); "
               "redline.data.autotune_loader(make_loader, step) finds the setting by measuring.")
    return [Finding("data_starvation", severity_for(f),
                    f"The training loop waits for data {f:.0%} of each step",
                    evidence, ceiling_speedup(f), fix)]


def _part(m: Measurements, fid: str) -> tuple[float, float, Evidence] | None:
    """(share of the wait, share of the step, evidence) of one side of the data-wait split,
    or None when the split is unknown or this side is too small to report."""
    if not _starving(m):
        return None
    cpu_share, basis = _cpu_share(m)
    if cpu_share is None:
        return None
    f = m.fraction("data_wait")
    share = cpu_share if fid == "cpu_preprocessing" else 1.0 - cpu_share
    dominant = "cpu_preprocessing" if cpu_share >= CPU_BOUND_MIN_FRACTION else "storage_fetch"
    removable = f * share
    if fid != dominant and (share < SECONDARY_MIN_SHARE or removable < DATA_WAIT_MIN_FRACTION):
        return None
    h = m.host
    ev: Evidence = {
        "cpu_share_of_wait": round(cpu_share, 3), "cpu_share_basis": basis,
        "main_cpu_cores": None if h.main_cpu_cores is None else round(h.main_cpu_cores, 3),
        "workers_cpu_cores": None if h.workers_cpu_cores is None else round(h.workers_cpu_cores, 3),
        "read_mb_per_s": None if h.read_bytes_per_s is None else round(h.read_bytes_per_s / 1e6, 3),
        "attributed_fraction_of_step": round(removable, 4),
    }
    return share, removable, ev


def cpu_preprocessing(m: Measurements) -> list[Finding]:
    """The part of the data wait spent computing (decode, augment) in the fetcher."""
    part = _part(m, "cpu_preprocessing")
    if part is None:
        return []
    share, removable, ev = part
    fix = ("Spread the work over more CPU cores (workers); cache the output of the "
           "deterministic transforms so epoch ≥ 2 skips them: "
           "redline.data.CachedDataset(dataset, deterministic=decode_resize, "
           "random=crop_flip); use cheaper transforms (smaller stored images, uint8 "
           "until on device), or decode on the GPU.")
    if _workers(m) > 0 and _saturated(m):
        fix = "CPUs are saturated: " + fix.split("; ", 1)[1]
    return [Finding(
        "cpu_preprocessing", severity_for(removable),
        f"CPU preprocessing (decode/augment) makes {share:.0%} of the data wait "
        f"({removable:.0%} of the step)", ev, ceiling_speedup(removable), fix)]


def storage_fetch(m: Measurements) -> list[Finding]:
    """The part of the data wait in which the fetcher waits rather than computes (storage,
    network, a sleep)."""
    part = _part(m, "storage_fetch")
    if part is None:
        return []
    share, removable, ev = part
    cpus = m.host.cpus_available
    return [Finding(
        "storage_fetch", severity_for(removable),
        f"Fetching data (storage/network wait) makes {share:.0%} of the data wait "
        f"({removable:.0%} of the step)", ev, ceiling_speedup(removable),
        "The fetcher waits rather than computes: hide the latency with more "
        f"workers (I/O-bound workers may exceed the {cpus:g} CPUs, e.g. "
        f"{max(2, math.ceil(2 * cpus))}) and a larger prefetch_factor, copy the "
        "dataset to local disk or RAM, or read it in larger sequential chunks.")]


def h2d_copy(m: Measurements) -> list[Finding]:
    """Host→device copies block the training loop a share of each step."""
    h2d = m.device_metrics.h2d
    f = m.fraction("h2d_copy")
    if h2d is None or f < H2D_MIN_FRACTION:
        return []
    pageable = h2d.pageable_fraction
    fix = ("Copy from pinned memory without blocking the host: DataLoader(pin_memory=True) and "
           "batch.to(device, non_blocking=True); better, prefetch the next batch to the device on "
           "a side CUDA stream while this one computes.")
    return [Finding(
        "h2d_copy", severity_for(f),
        f"Host→device copies block the training loop {f:.0%} of each step",
        {"h2d_fraction": round(f, 4), "h2d_ms_per_step": round(h2d.host_s_per_step * 1e3, 3),
         "mb_per_step": round(h2d.bytes_per_step / 1e6, 3),
         "pageable_fraction": None if pageable is None else round(pageable, 3)},
        ceiling_speedup(f), fix)]
