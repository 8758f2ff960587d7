"""Host findings: cpu_contention over the whole step (the training thread waiting for a CPU
while other processes use the job's CPUs), and the pre-flight checks of the host and the
loaders: thread_oversubscription, shm_too_small, copy_on_access_dataset, worker_respawn."""

from __future__ import annotations

import dataclasses

from redline.core.findings import Evidence, Finding, ceiling_speedup, severity_for
from redline.core.measurements import CompetingProcess, Measurements
from redline.diagnose import data
from redline.diagnose.thresholds import (
    MAIN_THREAD_RUN_DELAY_MIN_FRACTION,
    OTHERS_MIN_CORES,
    WORKER_RESPAWN_MIN_FRACTION,
)


def _named(procs: list[CompetingProcess], n: int = 12) -> str:
    return "; ".join(f"pid {p.pid} `{p.command}` {p.cpu_cores:.2f} cores"
                     + (" (a child process of the job)" if p.child else "") for p in procs[:n])


def _competition(m: Measurements) -> tuple[float | None, list[CompetingProcess]]:
    """CPU cores other processes used on the job's CPUs over the window — the listed ones
    (the job's non-worker children included), else /proc/stat's remainder — and the list."""
    h = m.host
    procs = h.competing_processes
    if procs is None:
        return h.other_processes_cpu_cores, []
    procs = [p for p in procs if not p.same_job]  # the job's other ranks: the straggler rule's
    return sum(p.cpu_cores for p in procs), procs


def cpu_contention(m: Measurements) -> list[Finding]:
    """The training thread was runnable but waited for a CPU ≥ MAIN_THREAD_RUN_DELAY_MIN_FRACTION
    of the measured window while other processes (the job's own non-worker children included)
    used ≥ OTHERS_MIN_CORES of its CPUs: one finding over the whole step, naming them. Else the
    data fetch's part of the wait (:func:`redline.diagnose.data.cpu_contention`), with the
    competing processes named. Delay without competing processes is the job's own threads
    (thread_oversubscription's), not reported here."""
    h = m.host
    delay = h.main_thread_run_delay_fraction
    cores, procs = _competition(m)
    step = m.timing.step_time_mean_s
    if (delay is None or delay < MAIN_THREAD_RUN_DELAY_MIN_FRACTION or cores is None
            or cores < OTHERS_MIN_CORES or step is None):
        fetch = data.cpu_contention(m)
        if not procs or not fetch:
            return fetch
        f = fetch[0]
        named: Evidence = {**f.evidence, "competing_processes": _named(procs),
                           "top_competing_pid": procs[0].pid}
        return [dataclasses.replace(f, evidence=named)]
    ev: Evidence = {
        "main_thread_run_delay_fraction": round(delay, 4),
        "run_delay_ms_per_step": round(delay * step * 1e3, 3),
        "competing_cpu_cores": round(cores, 3),
        "cpus_available": h.cpus_available,
        "competing_processes": _named(procs) if procs else None,
        "top_competing_pid": procs[0].pid if procs else None,
        "top_competing_is_child": procs[0].child if procs else None,
        "basis": ("the training thread's run delay over the measured window "
                  "(/proc/self/task/<tid>/schedstat) ÷ its wall time; the processes' CPU "
                  "seconds from /proc/<pid>/stat at the window's start and end, those allowed "
                  "on the job's CPUs, DataLoader workers left out"),
    }
    if procs:
        top = procs[0]
        who = (f"pid {top.pid} (`{top.command[:60]}`) used {top.cpu_cores:.2f} cores of the "
               f"job's CPUs" + (", a process the job started" if top.child else "")
               + (f", {len(procs) - 1} more listed" if len(procs) > 1 else ""))
    else:
        who = f"other processes used {cores:.2f} of the {h.cpus_available:g} usable CPUs"
    if procs and procs[0].child:
        fix = (f"The job's own child process pid {procs[0].pid} competes with the training "
               "loop for its CPUs: run it on other cores (os.sched_setaffinity / taskset), at "
               "a lower priority (os.nice(10) in it), less often, or after training; if it is "
               "data preparation, move it into DataLoader workers sized to the spare CPUs.")
    else:
        fix = ("Give the job CPUs of its own: stop or move the competing processes listed in "
               "the evidence, pin them and this job to separate cores (taskset, cpusets, the "
               "scheduler's CPU requests), or ask for dedicated cores.")
    return [Finding(
        id="cpu_contention", severity=severity_for(delay),
        title=f"The training thread waits for a CPU {delay:.0%} of the step: {who}",
        evidence=ev, ceiling_speedup=ceiling_speedup(delay), fix=fix)]


def thread_oversubscription(m: Measurements) -> list[Finding]:
    """Main-process intra-op threads + busy workers > usable CPUs.

    DataLoader workers run with 1 torch thread each (``torch.utils.data._utils.worker`` sets
    it), the training process keeps its default of one per core: intra-op threads that spin
    while workers hold the cores slow every op of the step (PyTorch docs, "CPU threading and
    TorchScript inference": oversubscription).
    """
    nw = m.config.loader.num_workers if m.config.loader is not None else 0
    h = m.host
    if nw == 0 or h.workers_cpu_cores is None:
        return []
    demand = h.torch_threads + nw
    if demand <= h.cpus_available or h.workers_cpu_cores < 0.5:
        return []
    rec = max(1, int(h.cpus_available) - nw)
    sev = "high" if m.fraction("data_wait") >= 0.1 else "medium"
    return [Finding(
        id="thread_oversubscription", severity=sev,
        title=f"{h.torch_threads} torch threads + {nw} busy workers compete for "
        f"{h.cpus_available:g} CPUs",
        evidence={"torch_threads": h.torch_threads, "num_workers": nw,
         "workers_cpu_cores": round(h.workers_cpu_cores, 3), "cpus_available": h.cpus_available},
        ceiling_speedup=None,
        fix=f"Call torch.set_num_threads({rec}) in the training process (workers already use 1 "
        "thread each). The gain is not measurable from this run (contention slows every phase); "
        "re-measure after the change.")]


def shm_too_small(m: Measurements) -> list[Finding]:
    """Batches in flight (workers × prefetch × batch bytes) exceed free /dev/shm: workers die
    with 'Bus error' or hang (pytorch#5040, #16979)."""
    out: list[Finding] = []
    free = m.host.shm_free_bytes
    for li in m.loaders:
        ls = li.settings
        if ls.num_workers == 0 or li.batch_bytes is None or free is None:
            continue
        need = ls.num_workers * (ls.prefetch_factor or 2) * li.batch_bytes
        if need <= free:
            continue
        out.append(Finding(
            id="shm_too_small", severity="high",
            title=f"/dev/shm has {free / 2**20:.0f} MiB free; batches in flight need {need / 2**20:.0f} MiB",
            evidence={"shm_free_mib": round(free / 2**20, 1), "needed_mib": round(need / 2**20, 1),
             "num_workers": ls.num_workers, "prefetch_factor": ls.prefetch_factor,
             "batch_mib": round(li.batch_bytes / 2**20, 3)},
            ceiling_speedup=None,
            fix="Enlarge /dev/shm (docker --shm-size=8g or --ipc=host; a Kubernetes emptyDir with "
            "medium: Memory), or lower num_workers × prefetch_factor. Not a speed issue: it "
            "crashes or hangs the job."))
    return out


def copy_on_access_dataset(m: Measurements) -> list[Finding]:
    """Python containers in a Dataset read by forked workers are copied page by page into each
    worker (refcount writes; pytorch#13246)."""
    out: list[Finding] = []
    for li in m.loaders:
        nw = li.settings.num_workers
        if nw == 0 or not li.python_containers:
            continue
        for c in li.python_containers:
            est = int(str(c["est_bytes"]))
            total = est * nw
            out.append(Finding(
                id="copy_on_access_dataset", severity="high" if total >= 2**30 else "medium",
                title=f"{c['path']} is a Python {c['type']} of {c['items']:,} items read by "
                f"{nw} workers",
                evidence={"attribute": str(c["path"]), "type": str(c["type"]), "items": int(str(c["items"])),
                 "est_mib": round(est / 2**20, 1), "num_workers": nw,
                 "projected_copies_mib": round(total / 2**20, 1)},
                ceiling_speedup=None,
                fix="Store it as a numpy array / torch tensor (strings: one uint8 buffer + offsets, "
                "or np.array(..., dtype='S')) or an Arrow table, so workers share its pages. "
                "Costs memory (up to one copy per worker), not step time."))
    return out


def worker_respawn(m: Measurements) -> list[Finding]:
    """Non-persistent workers are re-spawned (dataset pickled, processes forked) every epoch."""
    out: list[Finding] = []
    step = m.timing.step_time_mean_s
    if step is None:
        return out
    wall = step * m.timing.steps_total
    for li in m.loaders:
        if li.settings.persistent_workers or li.worker_starts < 2 or li.worker_startup_mean_s is None:
            continue
        removable_s = li.worker_startup_mean_s * (li.worker_starts - 1)
        share = removable_s / (wall + removable_s) if wall > 0 else 0.0
        if share < WORKER_RESPAWN_MIN_FRACTION:
            continue
        out.append(Finding(
            id="worker_respawn", severity=severity_for(share),
            title=f"DataLoader workers restarted {li.worker_starts} times, "
            f"{li.worker_startup_mean_s:.2f} s each",
            evidence={"worker_starts": li.worker_starts,
             "startup_mean_s": round(li.worker_startup_mean_s, 4),
             "startup_total_s": round(li.worker_startup_total_s, 4),
             "share_of_wall": round(share, 4), "num_workers": li.settings.num_workers},
            ceiling_speedup=ceiling_speedup(share),
            fix="DataLoader(..., persistent_workers=True) keeps workers (and their dataset copy) "
            "alive across epochs."))
    return out
