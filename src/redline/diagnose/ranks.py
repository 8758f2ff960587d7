"""The straggler of a multi-process job, from arrival skew at collectives; and whether a rank's
two step-time levels are its host's (:func:`bimodal_is_the_hosts`).

Under DDP every rank's step time is the same (the gradient all-reduce is a barrier inside
backward), so per-rank step times hide the slow rank; the order in which ranks arrive at each
collective does not. The rank that arrives last at most collectives (or causes most of the
waiting at them), and keeps the others waiting a measured share of the step, is the straggler;
what it does more of than the others (waiting for data, computing, or getting less CPU on its
host) is why.
"""

from __future__ import annotations

import statistics

from redline.core.findings import Finding, ceiling_speedup, severity_for
from redline.core.report import RankEntry, RanksReport
from redline.diagnose.thresholds import (
    BIMODAL_DELAY_SHARE,
    BIMODAL_RANK_DELAY_MIN_FRACTION,
    STRAGGLER_HELD_DELAY_SHARE,
    STRAGGLER_MIN_CAUSED_SHARE,
    STRAGGLER_MIN_LAST_SHARE,
    STRAGGLER_MIN_SKEW,
    STRAGGLER_MIN_WAIT_S,
    STRAGGLER_MORE_WORK_CPU_SHARE,
)


def _others(r: RanksReport, rank: int) -> list[RankEntry]:
    return [e for e in r.ranks if e.rank != rank and e.status != "missing"]


def _median(xs: list[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return statistics.median(v) if v else None


_SLOWDOWNS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
              "hw_power_brake_slowdown")
"""NVML clock-event reasons that lower a GPU's clocks under load (NVML API docs,
``nvmlClocksEventReasons``): the device's own evidence of throttling."""


def _host_share(slow: RankEntry, ranks: list[RankEntry]) -> tuple[int, float | None]:
    """(ranks on the straggler's host, the CPU cores their processes use together)."""
    local = [e for e in ranks if e.host == slow.host and e.status != "missing"]
    used = [e.main_cpu_cores for e in local]
    return len(local), (None if any(u is None for u in used) else sum(u or 0.0 for u in used))


_Numbers = dict[str, float | str | None]
"""The straggler's numbers compared, as its evidence carries them."""


def _why(slow: RankEntry, others: list[RankEntry], step_s: float
         ) -> tuple[str, str, _Numbers, bool]:
    """(cause, fix, the numbers compared, whether the user can act on it): the straggler's
    largest excess over the median of the other ranks — data wait, compute (forward +
    backward + optimizer − its wait at collectives), time outside the phases, or CPU (its
    process got fewer CPU-seconds per second than theirs, its training thread waited longer
    than theirs for a CPU, or, on a CPU device, that thread spent more CPU time on its step)."""
    def compute(e: RankEntry) -> float | None:
        if e.forward_s is None or e.backward_s is None:
            return None
        return e.forward_s + e.backward_s + (e.optimizer_s or 0.0) - (e.comm_wait_s or 0.0)

    def outside(e: RankEntry) -> float | None:
        # the step less its measured phases: the loop's own code between them (logging,
        # host work, a sleep); a rank's waits inside the loop's collectives stay in it, so the
        # ranks that wait more have more, never the late one
        parts = (e.data_wait_s, e.h2d_copy_s, e.forward_s, e.backward_s, e.optimizer_s)
        if e.step_time_mean_s is None or any(p is None for p in parts):
            return None
        return e.step_time_mean_s - sum(p or 0.0 for p in parts)

    data_excess = ((slow.data_wait_s or 0.0) - (_median([e.data_wait_s for e in others]) or 0.0))
    c_slow, c_med = compute(slow), _median([compute(e) for e in others])
    compute_excess = (c_slow - c_med) if c_slow is not None and c_med is not None else 0.0
    o_slow, o_med = outside(slow), _median([outside(e) for e in others])
    outside_excess = (o_slow - o_med) if o_slow is not None and o_med is not None else 0.0
    cpu_med = _median([e.main_cpu_cores for e in others])
    delay_med = _median([e.run_delay_s for e in others])
    delay_excess = (None if slow.run_delay_s is None or delay_med is None
                    else slow.run_delay_s - delay_med)
    # CPU-seconds per step more than the others (all ranks' steps take the same wall time
    # under DDP, so CPU cores used compare CPU time per step): on a CPU device, more work
    # costs CPU time; a rank held off its CPUs computes longer on the same CPU time. The
    # training thread's own CPU time where every rank has it: the process's also counts its
    # communication threads, which work longer on the rank the others wait for (gloo's loop
    # thread receives their data while it computes) with no more work of the step.
    thread_med = _median([e.main_thread_cpu_cores for e in others])
    slow_cores, others_cores = slow.main_thread_cpu_cores, thread_med
    by_thread = (slow_cores is not None and others_cores is not None
                 and all(e.main_thread_cpu_cores is not None for e in others))
    if not by_thread:
        slow_cores, others_cores = slow.main_cpu_cores, cpu_med
    cpu_excess = (None if slow_cores is None or others_cores is None
                  else (slow_cores - others_cores) * step_s)
    numbers: _Numbers = {
        "data_wait_excess_ms": round(data_excess * 1e3, 3),
        "compute_excess_ms": round(compute_excess * 1e3, 3),
        "outside_phases_excess_ms": round(outside_excess * 1e3, 3),
        "main_cpu_cores": None if slow.main_cpu_cores is None else round(slow.main_cpu_cores, 3),
        "others_main_cpu_cores": None if cpu_med is None else round(cpu_med, 3),
        "run_delay_excess_ms": None if delay_excess is None else round(delay_excess * 1e3, 3),
        "run_delay_ms": None if slow.run_delay_s is None else round(slow.run_delay_s * 1e3, 3),
        "training_thread_cpu_cores": (None if slow.main_thread_cpu_cores is None
                                      else round(slow.main_thread_cpu_cores, 3)),
        "others_training_thread_cpu_cores": None if thread_med is None else round(thread_med, 3),
        "cpu_time_excess_ms": None if cpu_excess is None else round(cpu_excess * 1e3, 3),
        "cpu_time_excess_of": None if cpu_excess is None else (
            "training thread" if by_thread else "process")}
    if outside_excess > max(data_excess, compute_excess, 0.0):
        return (f"it spends {outside_excess * 1e3:,.1f} ms more per step outside data loading, "
                "forward, backward and the optimizer than the median rank (the loop's own code "
                "between them)",
                f"Find what rank {slow.rank}'s loop does between its steps that the others do "
                "not (logging, metrics, checkpointing or evaluation on one rank, a host-side "
                "transform, a sleep), and move it off the step or spread it over the ranks.",
                numbers, True)
    if data_excess >= compute_excess and data_excess > 0:
        return (f"it waits {data_excess * 1e3:,.1f} ms more per step for data than the median "
                "rank: its data pipeline",
                f"Feed rank {slow.rank} faster: more DataLoader workers or a cache on its host "
                f"({slow.host}), balanced shards (its samples may be larger or slower to read); "
                f"`redline doctor --tune-loader` on that rank measures the settings.", numbers,
                True)
    computes = (f"it computes {compute_excess * 1e3:,.1f} ms more per step (forward + backward "
                "+ optimizer, less its wait) than the median rank")
    if slow.device == "cpu" and compute_excess > 0:
        return _on_shared_cpus(slow, others, computes=computes, compute_excess=compute_excess,
                               cpu_excess=cpu_excess, delay_excess=delay_excess,
                               numbers=numbers)
    starved = (slow.main_cpu_cores is not None and cpu_med is not None
               and slow.main_cpu_cores < 0.8 * cpu_med)
    # runnable without a CPU for at least half of its extra compute: the scheduler, not its
    # work, made it late (another job, or more workers and threads than cores)
    queued = delay_excess is not None and delay_excess >= 0.5 * compute_excess
    if compute_excess > 0 and (starved or queued):
        got = (f"its process gets {slow.main_cpu_cores:.2f} CPU cores against {cpu_med:.2f} "
               "on the others" if starved else
               f"its training thread waits {(delay_excess or 0.0) * 1e3:,.1f} ms more per step"
               " than the others' for a CPU (the scheduler's run delay)")
        return (f"{computes} while {got}: CPU contention on its host",
                f"Find what else runs on {slow.host} (other jobs, too many DataLoader workers or "
                f"threads for its cores) and give rank {slow.rank} its share.", numbers, True)
    slowed = [c for c in (slow.device_clock_events or []) if c in _SLOWDOWNS]
    if slowed:
        return (f"{computes}, and its GPU lowered its clocks ({', '.join(slowed)}, NVML)",
                f"Rank {slow.rank}'s GPU on {slow.host} throttles ({', '.join(slowed)}): check "
                "its cooling, power limit and clocks (`nvidia-smi -q -d PERFORMANCE`), or move "
                "the rank to another GPU.", numbers, True)
    return (computes,
            f"Find why rank {slow.rank}'s compute is slower: larger inputs (sequence lengths, "
            "image sizes) on its shard, extra work only it does (logging, evaluation, "
            f"checkpointing), or a slower device on {slow.host} (its GPU reported no clock "
            "slowdown" + ("" if slow.device_clock_events is not None else
                          ": NVML readings absent") + ").", numbers, True)


def _on_shared_cpus(slow: RankEntry, others: list[RankEntry], *, computes: str,
                    compute_excess: float, cpu_excess: float | None, delay_excess: float | None,
                    numbers: _Numbers) -> tuple[str, str, _Numbers, bool]:
    """A rank that trains on CPU and computes longer than the others: there is no device to
    blame. With the CPU time to show for it, it has more work; without, it got less of the
    CPUs its host's ranks share (the scheduler's choice, which moves between runs)."""
    n_local, used = _host_share(slow, [slow, *others])
    numbers["ranks_on_host"] = n_local
    numbers["host_ranks_cpu_cores"] = None if used is None else round(used, 3)
    numbers["cpus_available"] = slow.cpus_available
    # the scheduler's run delay is (nearly) all of its extra compute: it was held off the
    # CPUs, whatever else its process's threads spent; else CPU time to show for a part of it
    # is work the others do not have
    held = (delay_excess is not None
            and delay_excess >= STRAGGLER_HELD_DELAY_SHARE * compute_excess)
    if not held and cpu_excess is not None \
            and cpu_excess >= STRAGGLER_MORE_WORK_CPU_SHARE * compute_excess:
        who = "its training thread" if numbers["cpu_time_excess_of"] == "training thread" \
            else "its process"
        return (f"{computes} and {who} uses {cpu_excess * 1e3:,.1f} ms more CPU time per step: "
                "more work than the others",
                f"Find what rank {slow.rank} computes that the others do not: larger inputs "
                "(sequence lengths, image sizes) on its shard, or extra work only it does "
                "(logging, evaluation, checkpointing).", numbers, True)
    if n_local < 2:  # alone on its host: nothing of the job's shares its CPUs
        got = ("while its training thread waits "
               f"{(delay_excess or 0.0) * 1e3:,.1f} ms more per step than the others' for a CPU"
               if held else "on no more CPU time than the others")
        return (f"{computes} {got}: other processes or slower CPUs on {slow.host}",
                f"Find what else runs on {slow.host} (other jobs, too many DataLoader workers or "
                f"threads for its cores) and whether its CPUs are slower (model, frequency) "
                f"than the other hosts'.", numbers, True)
    cpu = ("" if cpu_excess is None or held else
           f" on {'no more' if cpu_excess <= 0 else f'only {cpu_excess * 1e3:,.1f} ms more'} "
           "CPU time")
    delay = ("" if slow.run_delay_s is None else
             f"; its training thread waits {slow.run_delay_s * 1e3:,.1f} ms per step for a CPU"
             + ("" if delay_excess is None else
                f" ({delay_excess * 1e3:+,.1f} ms against the others)"))
    host = (f"the {n_local} ranks on {slow.host} share its "
            + (f"{slow.cpus_available:g} CPUs" if slow.cpus_available is not None else "CPUs")
            + ("" if used is None else f" (their processes use {used:.2f} cores together)"))
    return (f"{computes}{cpu}: {host}{delay}",
            "No rank has more to compute: the scheduler gave this rank less of the shared CPUs "
            "in this window (it moves between runs). Give each rank its own cores — fewer "
            "ranks per host, `torch.set_num_threads` / OMP_NUM_THREADS at the host's CPUs ÷ "
            "its ranks, `taskset` per rank — and measure again; act first on the findings "
            "with a ceiling.", numbers, False)


def straggler(r: RanksReport) -> list[Finding]:
    """The rank that arrives last at collectives and what that costs the others."""
    present = [e for e in r.ranks if e.status != "missing" and e.collectives]
    if len(present) < 2:
        return []
    slow = max(present, key=lambda e: (e.caused_wait_s or 0.0, e.last_arrivals))
    others = _others(r, slow.rank)
    share_last = slow.last_arrivals / slow.collectives
    caused_all = sum(e.caused_wait_s or 0.0 for e in present)
    share_caused = (slow.caused_wait_s or 0.0) / caused_all if caused_all else 0.0
    step = _median([e.step_time_mean_s for e in present])
    wait = _median([e.comm_wait_s for e in others])
    if not step or wait is None:
        return []
    cost = wait / step
    if ((share_last < STRAGGLER_MIN_LAST_SHARE and share_caused < STRAGGLER_MIN_CAUSED_SHARE)
            or cost < STRAGGLER_MIN_SKEW
            or wait < max(STRAGGLER_MIN_WAIT_S, 2 * r.clock_error_s)):
        return []
    why, fix, numbers, actionable = _why(slow, others, step)
    # A rank the scheduler held back on CPUs the ranks share has no cause in the job to fix:
    # low, and no ceiling, so the causes a user can act on rank above it.
    return [Finding(
        id="straggler", severity=severity_for(cost) if actionable else "low",
        title=f"Rank {slow.rank} arrives last at {slow.last_arrivals} of {slow.collectives} "
        f"collectives and causes {share_caused:.0%} of the waiting at them; the other ranks "
        f"wait {wait * 1e3:,.1f} ms per step for it: {why}",
        evidence={"rank": slow.rank, "host": slow.host, "last_arrivals": slow.last_arrivals,
         "collectives": slow.collectives, "share_of_wait_caused": round(share_caused, 4),
         "skew_ms_per_step": None if slow.lateness_s is None else round(slow.lateness_s * 1e3, 3),
         "others_wait_ms_per_step": round(wait * 1e3, 3),
         "share_of_step": round(cost, 4), "clock_error_ms": round(r.clock_error_s * 1e3, 3),
         **numbers},
        ceiling_speedup=ceiling_speedup(cost) if actionable else None, fix=fix, rank=slow.rank)]


COLLECTIVE_PHASES = frozenset({"forward", "backward", "comm"})
"""Phases in which a rank of a data-parallel job waits at collectives: DDP's buffer broadcast
before forward and gradient all-reduce inside backward, FSDP's all-gathers and reductions in
both, and the loop's own collectives."""


def bimodal_is_the_hosts(r: RanksReport, rank: int, f: Finding) -> bool:
    """Whether ``rank``'s ``step_time_bimodal`` is its host's CPUs rather than the job's code:
    its two levels differ in a phase that waits at collectives, and the training threads of
    the ranks on its host waited for a CPU, per step, for at least :data:`BIMODAL_DELAY_SHARE`
    of what its slow level cost (each rank's wait counted where it is material:
    :data:`BIMODAL_RANK_DELAY_MIN_FRACTION`). A rank's own rule weighs only its own wait, but at a
    collective every rank waits for the last to arrive, so a CPU another rank of the host
    lacked slows this one's step as much as its own would (two ranks sharing two cores, each
    waiting 13-14 % of its steps, gave steps of 4.4 and 8.5 ms)."""
    me = next((e for e in r.ranks if e.rank == rank), None)
    extra, phase = f.evidence.get("extra_fraction"), f.evidence.get("phase")
    if (me is None or me.step_time_mean_s is None or not isinstance(extra, int | float)
            or phase not in COLLECTIVE_PHASES):
        return False
    local = [e for e in r.ranks if e.host == me.host and e.status != "missing"]
    if any(e.run_delay_s is None or not e.step_time_mean_s for e in local):
        return False
    # only the ranks that were held off their CPUs materially: small waits of many ranks
    # summed would explain any level away
    waited_s = sum(e.run_delay_s or 0.0 for e in local
                   if (e.run_delay_s or 0.0)
                   >= BIMODAL_RANK_DELAY_MIN_FRACTION * (e.step_time_mean_s or 0.0))
    return waited_s >= BIMODAL_DELAY_SHARE * extra * me.step_time_mean_s
