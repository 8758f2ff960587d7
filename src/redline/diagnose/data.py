"""Data-path findings: data_starvation (split into cpu_preprocessing / storage_fetch), h2d_copy."""

from __future__ import annotations

import math

from redline.diagnose.finding import ceiling_speedup, severity_for
from redline.diagnose.thresholds import (
    CPU_BOUND_MIN_FRACTION,
    DATA_WAIT_MIN_FRACTION,
    H2D_MIN_FRACTION,
    SECONDARY_MIN_SHARE,
)
from redline.report.model import Finding, Measurements


def suggested_workers(cpus: float, local_world_size: int = 1) -> int:
    """Starting point for num_workers: one per usable CPU, minus one for the training process.
    Lightning's rule: max(1, cpus // local_world_size − 1) (gpu_metrics_anchors.md)."""
    return max(1, int(cpus) // max(1, local_world_size) - 1)


def _cpu_share(m: Measurements) -> tuple[float | None, str]:
    """Share of the data wait that is CPU work (vs waiting on storage), and how it was measured."""
    nw = m.config.num_workers or 0
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


def data_findings(m: Measurements) -> list[Finding]:
    f = m.fraction("data_wait")
    if f < DATA_WAIT_MIN_FRACTION or m.timing.step_time_mean_s is None:
        return []
    dw = m.share("data_wait")
    robust = dw.fraction_without_slowest if dw is not None else None
    if robust is not None and robust < DATA_WAIT_MIN_FRACTION:
        # One fetch made the wait (a GC pause, a preempted or cold read): a stall, which the
        # report's notes name, not a loop that waits for data step after step.
        return []
    step = m.timing.step_time_mean_s
    h = m.host
    nw = m.config.num_workers or 0
    cpus = h.cpus_available
    cpu_share, basis = _cpu_share(m)
    busy = (h.main_cpu_cores or 0.0) + (h.workers_cpu_cores or 0.0)
    saturated = busy >= 0.9 * cpus
    evidence: dict[str, float | int | str | bool | None] = {
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
    out = [Finding("data_starvation", severity_for(f),
                   f"The training loop waits for data {f:.0%} of each step",
                   evidence, ceiling_speedup(f), fix)]
    if cpu_share is None:
        return out
    parts = (("cpu_preprocessing", cpu_share), ("storage_fetch", 1.0 - cpu_share))
    dominant = "cpu_preprocessing" if cpu_share >= CPU_BOUND_MIN_FRACTION else "storage_fetch"
    for fid, share in parts:
        removable = f * share
        if fid != dominant and (share < SECONDARY_MIN_SHARE or removable < DATA_WAIT_MIN_FRACTION):
            continue
        ev = {k: evidence[k] for k in ("cpu_share_of_wait", "cpu_share_basis", "main_cpu_cores",
                                       "workers_cpu_cores", "read_mb_per_s")}
        ev["attributed_fraction_of_step"] = round(removable, 4)
        if fid == "cpu_preprocessing":
            title = (f"CPU preprocessing (decode/augment) makes {share:.0%} of the data wait "
                     f"({removable:.0%} of the step)")
            fix_sub = ("Spread the work over more CPU cores (workers); cache the output of the "
                       "deterministic transforms so epoch ≥ 2 skips them: "
                       "redline.data.CachedDataset(dataset, deterministic=decode_resize, "
                       "random=crop_flip); use cheaper transforms (smaller stored images, uint8 "
                       "until on device), or decode on the GPU.")
            if nw > 0 and saturated:
                fix_sub = "CPUs are saturated: " + fix_sub.split("; ", 1)[1]
        else:
            title = (f"Fetching data (storage/network wait) makes {share:.0%} of the data wait "
                     f"({removable:.0%} of the step)")
            fix_sub = ("The fetcher waits rather than computes: hide the latency with more "
                       f"workers (I/O-bound workers may exceed the {cpus:g} CPUs, e.g. "
                       f"{max(2, math.ceil(2 * cpus))}) and a larger prefetch_factor, copy the "
                       "dataset to local disk or RAM, or read it in larger sequential chunks.")
        out.append(Finding(fid, severity_for(removable), title, ev, ceiling_speedup(removable),
                           fix_sub))
    return out


def h2d_findings(m: Measurements) -> list[Finding]:
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
