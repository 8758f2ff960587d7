"""Data-path findings: data_starvation, split by what the fetcher did — computing
(cpu_preprocessing), runnable but waiting for a CPU (cpu_contention), off-CPU while reading
storage (storage_fetch) or off-CPU without reads (fetch_wait) — and h2d_copy."""

from __future__ import annotations

import math
from dataclasses import dataclass

from redline.core.findings import Evidence, Finding, ceiling_speedup, severity_for
from redline.core.measurements import Measurements
from redline.diagnose.thresholds import (
    CPU_BOUND_MIN_FRACTION,
    CPUS_SATURATED,
    DATA_WAIT_MIN_FRACTION,
    H2D_MIN_FRACTION,
    OTHERS_MIN_CORES,
    READS_EVIDENCE_BYTES_PER_S,
    SECONDARY_MIN_SHARE,
)


def suggested_workers(cpus: float, local_world_size: int = 1) -> int:
    """Starting point for num_workers: one per usable CPU, minus one for the training process.
    Lightning's rule: max(1, cpus // local_world_size − 1) (``lightning.fabric.utilities.
    data.suggested_max_num_workers``)."""
    return max(1, int(cpus) // max(1, local_world_size) - 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Split:
    """The data wait split by what the fetcher did, each share measured (docs/report.md)."""

    cpu: float
    """Share spent computing (decode, augment)."""
    contention: float
    """Share spent runnable but waiting for a CPU (scheduler run delay)."""
    waiting: float
    """Share spent off-CPU and not runnable: blocked on I/O, a socket, a lock, a sleep."""
    basis: str
    contention_known: bool


def _split(m: Measurements) -> _Split | None:
    """How the fetcher spent the data wait, from measured CPU time and run delay (the rest,
    neither on a CPU nor runnable, is waiting), or None when the CPU time is unknown."""
    nw = _workers(m)
    h = m.host
    if nw == 0:
        f = h.data_fetch_cpu_fraction
        if f is None:
            return None
        cpu = min(1.0, f)
        delay = h.data_fetch_run_delay_fraction
        cont = min(1.0 - cpu, delay) if delay is not None else 0.0
        return _Split(cpu=cpu, contention=cont, waiting=max(0.0, 1.0 - cpu - cont),
                      basis="training-thread CPU time and run delay ÷ wall time inside the fetches "
                      "(num_workers=0)", contention_known=delay is not None)
    if h.workers_cpu_cores is None:
        return None
    capacity = min(float(nw), h.cpus_available)
    if capacity <= 0:
        return None
    cores, delay = h.workers_cpu_cores, h.workers_run_delay_cores
    if delay is None:
        cpu = min(1.0, cores / capacity)
        return _Split(cpu=cpu, contention=0.0, waiting=1.0 - cpu,
                      basis=f"worker CPU cores used ÷ min(num_workers={nw}, usable CPUs="
                      f"{h.cpus_available:g}); run delay unknown", contention_known=False)
    # In worker-seconds per second (nw of them): on a CPU, runnable without one, the rest
    # off-CPU. Run delay the job's own runnable workers explain (more of them than CPUs) is
    # CPU-bound work at capacity; only the delay beyond it is contention.
    own = min(delay, max(0.0, cores + delay - h.cpus_available))
    cont = min(1.0, (delay - own) / nw)
    cpu = min(1.0 - cont, (cores + own) / nw)
    return _Split(cpu=cpu, contention=cont, waiting=max(0.0, 1.0 - cpu - cont),
                  basis=f"worker CPU time and run delay per worker-second ({nw} workers, "
                  f"{h.cpus_available:g} usable CPUs; delay the workers' own number explains "
                  "counts as CPU-bound)", contention_known=True)


def _reads_evidence(m: Measurements) -> bool:
    """Whether the fetcher read at the evidence rate: the workers' reads when there are
    workers (the training process's own reads — imports, checkpoints, logs — are not the
    fetch's), else the process's."""
    h = m.host
    pair = ((h.workers_read_bytes_per_s, h.workers_read_chars_per_s) if _workers(m)
            else (h.read_bytes_per_s, h.read_chars_per_s))
    rates = [r for r in pair if r is not None]
    return bool(rates) and max(rates) >= READS_EVIDENCE_BYTES_PER_S


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


def _dataset_type(m: Measurements) -> str | None:
    """The dataset type of the loader the report describes (the config's), if known."""
    return next((loader.dataset_type for loader in m.loaders
                 if loader.settings == m.config.loader
                 and loader.batch_size == m.config.batch_size), None)


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
    sp = _split(m)
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
        "cpu_share_of_wait": None if sp is None else round(sp.cpu, 3),
        "contention_share_of_wait": (round(sp.contention, 3) if sp is not None
                                     and sp.contention_known else None),
        "waiting_share_of_wait": None if sp is None else round(sp.waiting, 3),
        "split_basis": sp.basis if sp is not None else "the fetch's CPU time is unknown",
        "read_mb_per_s": None if h.read_bytes_per_s is None else round(h.read_bytes_per_s / 1e6, 3),
        "other_processes_cpu_cores": (None if h.other_processes_cpu_cores is None
                                      else round(h.other_processes_cpu_cores, 3)),
        "cpus_saturated": saturated,
    }
    if nw == 0:
        rec = suggested_workers(cpus)
        fix = (f"Load batches in worker processes: DataLoader(..., num_workers={rec}, "
               "persistent_workers=True" + (", pin_memory=True" if m.device.type == "cuda" else "")
               + f"). {rec} = usable CPUs ({cpus:g}) − 1 for the training process, a starting "
               "point; redline.data.autotune_loader(make_loader, step) measures the best "
               "setting in your loop.")
        if saturated:  # the training process alone keeps the CPUs busy: workers need cores
            fix += (f" The training process alone keeps {h.main_cpu_cores or 0:.2f} of the "
                    f"{cpus:g} CPUs busy: leave the workers cores by lowering its intra-op "
                    f"threads (torch.set_num_threads({max(1, round(cpus) - rec)})).")
    elif saturated:
        fix = (f"The {cpus:g} usable CPUs are saturated (training process {h.main_cpu_cores or 0:.2f}"
               f" + workers {h.workers_cpu_cores or 0:.2f} cores): more workers will not help. "
               "Cache the deterministic part of preprocessing (decode/resize) so it runs once, "
               "make transforms cheaper, or give the job more CPUs per device.")
    else:
        fix = (f"Workers are not keeping up and CPUs are left ({busy:.2f} of {cpus:g} cores busy): "
               f"raise num_workers above {nw} (and prefetch_factor); "
               "redline.data.autotune_loader(make_loader, step) finds the setting by measuring.")
    return [Finding(id="data_starvation", severity=severity_for(f),
                    title=f"The training loop waits for data {f:.0%} of each step",
                    evidence=evidence, ceiling_speedup=ceiling_speedup(f), fix=fix)]


_SIDES = ("cpu_preprocessing", "cpu_contention", "waiting")


def _part(m: Measurements, side: str) -> tuple[float, float, Evidence] | None:
    """(share of the wait, share of the step, evidence) of one side of the data-wait split
    ('cpu_preprocessing', 'cpu_contention' or 'waiting'), or None when the split is unknown or
    this side is too small to report (the largest side is reported; another when it makes
    ≥ SECONDARY_MIN_SHARE of the wait)."""
    if not _starving(m):
        return None
    sp = _split(m)
    if sp is None:
        return None
    shares = {"cpu_preprocessing": sp.cpu, "cpu_contention": sp.contention,
              "waiting": sp.waiting}
    # CPU work wins the tie it has always won: ≥ CPU_BOUND_MIN_FRACTION of the wait.
    dominant = ("cpu_preprocessing" if sp.cpu >= CPU_BOUND_MIN_FRACTION
                else max(_SIDES, key=lambda k: shares[k]))
    f = m.fraction("data_wait")
    share = shares[side]
    removable = f * share
    if side != dominant and (share < SECONDARY_MIN_SHARE or removable < DATA_WAIT_MIN_FRACTION):
        return None
    if share <= 0:
        return None
    h = m.host
    ev: Evidence = {
        "cpu_share_of_wait": round(sp.cpu, 3),
        "contention_share_of_wait": round(sp.contention, 3) if sp.contention_known else None,
        "waiting_share_of_wait": round(sp.waiting, 3), "split_basis": sp.basis,
        "main_cpu_cores": None if h.main_cpu_cores is None else round(h.main_cpu_cores, 3),
        "workers_cpu_cores": None if h.workers_cpu_cores is None else round(h.workers_cpu_cores, 3),
        "read_mb_per_s": None if h.read_bytes_per_s is None else round(h.read_bytes_per_s / 1e6, 3),
        "read_calls_mb_per_s": (None if h.read_chars_per_s is None
                                else round(h.read_chars_per_s / 1e6, 3)),
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
    if _dataset_type(m) == "TensorDataset":
        # Nothing to decode: the CPU time is the loader indexing tensors one sample at a time
        # and stacking them again (default_collate).
        fix = ("The dataset is a TensorDataset: the fetch's CPU time is the DataLoader indexing "
               "it sample by sample and stacking the samples again. Index it a batch at a "
               "time: DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), batch_size=B, "
               "drop_last=False), batch_size=None) hands TensorDataset one list of indices per "
               "batch; or slice the tensors in the loop.")
    return [Finding(
        id="cpu_preprocessing", severity=severity_for(removable),
        title=f"CPU preprocessing (decode/augment) makes {share:.0%} of the data wait "
        f"({removable:.0%} of the step)", evidence=ev, ceiling_speedup=ceiling_speedup(removable), fix=fix)]


def cpu_contention(m: Measurements) -> list[Finding]:
    """The part of the data wait in which the fetcher was runnable but waited for a CPU: other
    processes on the job's CPUs, or more threads than CPUs."""
    part = _part(m, "cpu_contention")
    if part is None:
        return []
    share, removable, ev = part
    h = m.host
    others = h.other_processes_cpu_cores
    nw = _workers(m)
    ev["other_processes_cpu_cores"] = None if others is None else round(others, 3)
    ev["cpus_available"] = h.cpus_available
    ev["torch_threads"] = h.torch_threads
    if others is not None and others >= OTHERS_MIN_CORES:
        who = (f"other processes keep {others:.2f} of the {h.cpus_available:g} usable CPUs "
               "busy")
        fix = ("Give the job CPUs of its own: stop or move the competing processes (see them "
               "with `top`; another job, a data sync, a second training run), pin them and "
               "this job to separate cores (taskset, cpusets, the scheduler's CPU requests), "
               "or ask for dedicated cores. Workers added now would only queue for the same "
               "cores.")
    else:
        who = (f"the job's own threads outnumber the {h.cpus_available:g} usable CPUs "
               f"({nw} workers, {h.torch_threads} torch threads)")
        fix = (f"Fit the job's threads to its {h.cpus_available:g} CPUs: "
               "torch.set_num_threads(1) in worker processes (worker_init_fn), fewer "
               "intra-op threads in the training process while workers run, or fewer workers.")
    return [Finding(
        id="cpu_contention", severity=severity_for(removable),
        title=f"The fetcher waits for a CPU {share:.0%} of the data wait ({removable:.0%} of the "
        f"step): {who}", evidence=ev, ceiling_speedup=ceiling_speedup(removable), fix=fix)]


def storage_fetch(m: Measurements) -> list[Finding]:
    """The part of the data wait in which the fetcher waits off-CPU while the job reads from
    storage: claimed only with reads measured (READS_EVIDENCE_BYTES_PER_S)."""
    part = _part(m, "waiting")
    if part is None or not _reads_evidence(m):
        return []
    share, removable, ev = part
    cpus = m.host.cpus_available
    return [Finding(
        id="storage_fetch", severity=severity_for(removable),
        title=f"Fetching data waits on storage {share:.0%} of the data wait ({removable:.0%} of the "
        "step)", evidence=ev, ceiling_speedup=ceiling_speedup(removable),
        fix="The fetcher waits rather than computes: hide the latency with more "
        f"workers (I/O-bound workers may exceed the {cpus:g} CPUs, e.g. "
        f"{max(2, math.ceil(2 * cpus))}) and a larger prefetch_factor, copy the "
        "dataset to local disk or RAM, or read it in larger sequential chunks.")]


def fetch_wait(m: Measurements) -> list[Finding]:
    """The part of the data wait in which the fetcher waits off-CPU without reading from
    storage: a network request, a lock, a sleep."""
    part = _part(m, "waiting")
    if part is None or _reads_evidence(m):
        return []
    share, removable, ev = part
    cpus = m.host.cpus_available
    return [Finding(
        id="fetch_wait", severity=severity_for(removable),
        title=f"The fetcher waits off-CPU {share:.0%} of the data wait ({removable:.0%} of the "
        f"step) with no storage reads measured: a network request, a lock or a sleep",
        evidence=ev, ceiling_speedup=ceiling_speedup(removable),
        fix="Whatever the fetch waits on, waits overlap: more workers (they may exceed the "
        f"{cpus:g} CPUs, e.g. {max(2, math.ceil(2 * cpus))}) and a larger prefetch_factor; "
        "for a remote store, larger requests or a local cache "
        "(redline.data.CachedDataset); a lock shared by the workers serializes them.")]


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
        id="h2d_copy", severity=severity_for(f),
        title=f"Host→device copies block the training loop {f:.0%} of each step",
        evidence={"h2d_fraction": round(f, 4), "h2d_ms_per_step": round(h2d.host_s_per_step * 1e3, 3),
         "mb_per_step": round(h2d.bytes_per_step / 1e6, 3),
         "pageable_fraction": None if pageable is None else round(pageable, 3)},
        ceiling_speedup=ceiling_speedup(f), fix=fix)]
