"""One report for a multi-process job: every rank sends a summary through the job's store,
rank 0 merges them with its own (per-rank table, merged view, arrival skew, the straggler).

What a rank sends (zlib-compressed JSON): its status, steps, per-step phase means, CPU use, its
findings, and one ``[group, seq, created_ns]`` triple per collective of its measured window —
a few hundred bytes plus ~30 bytes per collective (docs/distributed.md).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import json
import statistics
import warnings
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

from redline.core.findings import Finding, rank
from redline.core.measurements import Measurements
from redline.core.report import MergedMetric, RankEntry, RanksReport, Report
from redline.diagnose.engine import diagnose_ranks, diagnose_trace
from redline.diagnose.ranks import bimodal_is_the_hosts
from redline.measure.ranks import GATHER_TIMEOUT_S, JobStore, RankInfo, process_ended
from redline.measure.recorder import Recorder
from redline.measure.step_record import BACKWARD, FORWARD, OPTIMIZER
from redline.report.perfetto import rank_timeline
from redline.trace import TraceError, analyze_paths

MERGED = ("step_time_mean_s", "data_wait_s", "forward_s", "backward_s", "optimizer_s",
          "comm_s", "comm_wait_s")


def summary(w: Recorder, report: Report) -> dict[str, Any]:
    """What this rank sends to rank 0."""
    measurements = report.measurements
    info = w.rank
    phases = {phase_time.phase: phase_time.mean_s for phase_time in measurements.breakdown}
    return {
        "rank": info.rank, "local_rank": info.local_rank, "host": info.host,
        "status": report.status, "steps_measured": measurements.timing.steps_measured,
        "status_detail": _first_sentence(report.status_detail),
        "last_step": w.tracker.closed - 1 if w.tracker.closed else None,
        "step_time_mean_s": measurements.timing.step_time_mean_s, "phases": phases,
        "throughput_samples_per_s": measurements.timing.throughput_samples_per_s,
        "main_cpu_cores": measurements.host.main_cpu_cores,
        "main_thread_cpu_cores": measurements.host.main_thread_cpu_cores,
        # what the straggler's cause is judged on: the device, the CPUs the ranks of a host
        # share, and the GPU's own word on slowed clocks
        "device": measurements.device.type, "cpus_available": measurements.host.cpus_available,
        "device_clock_events": (None if measurements.device_metrics.nvml is None
                                else list(measurements.device_metrics.nvml.clock_event_reasons)),
        "run_delay_s": (None if measurements.host.main_thread_run_delay_fraction is None
                        or measurements.timing.step_time_mean_s is None else
                        measurements.host.main_thread_run_delay_fraction
                        * measurements.timing.step_time_mean_s),
        "ddp_exposed_comm_s": _ddp_exposed(measurements),
        "arrivals": [[arrival.group, arrival.seq, arrival.created_ns] for arrival in w.arrivals],
        "arrivals_reason": w.arrivals_reason,
        "clock": None if w.beacon is None else w.beacon.clock,
        "findings": [dataclasses.asdict(finding) for finding in report.findings],
        "trace_path": (str(w.capture.path) if w.capture is not None and w.capture.written
                       else None),
        # per measured step: its end on the wall clock (ns) and its compute (forward +
        # backward + optimizer, host s), for the per-rank scores
        "step_ends_ns": [int(step.end_s * 1e9) + w.wall_offset_ns for step in w.measured_steps],
        "step_compute_s": [round(step.phases[FORWARD] + step.phases[BACKWARD] + step.phases[OPTIMIZER], 7)
                           for step in w.measured_steps],
        # every step with its phases and the sampled counters, for rank 0's --timeline file
        # (~60 bytes a step before compression)
        "timeline": rank_timeline(w) if w.config.timeline_path else None,
    }


def _first_sentence(text: str | None, limit: int = 200) -> str | None:
    """The head of a status detail, for the note that names a rank (a few hundred bytes)."""
    if not text:
        return None
    head = text.split(". ", 1)[0]
    return head if len(head) <= limit else head[:limit - 1] + "…"


def _ddp_exposed(m: Measurements) -> float | None:
    """DDP's gradient communication not overlapped with backward, per optimizer step."""
    ddp = m.ddp
    if ddp is None or ddp.backward_comm_s is None:
        return None
    exposed = max(0.0, ddp.backward_comm_s - (ddp.backward_overlap_s or 0.0)) * (
        ddp.backward_per_step or 1.0)
    # DDP's averages come from its sampled iterations, warm-up included; the exposed
    # all-reduce happens inside backward, so it cannot exceed the measured backward
    backward = next((phase_time.mean_s for phase_time in m.breakdown if phase_time.phase == "backward"), None)
    return exposed if backward is None else min(exposed, backward)


def merge(own: dict[str, Any], others: dict[int, dict[str, Any]], world_size: int,
          findings: list[Finding]) -> tuple[RanksReport, list[Finding]]:
    """Rank 0's view: its summary and the others' (by rank), the findings merged."""
    got = {own["rank"]: own, **others}
    missing = [rank_index for rank_index in range(world_size) if rank_index not in got]
    skew, source, clock_error_s = _skew(got)
    entries = []
    for rank_index in range(world_size):
        rank_summary = got.get(rank_index)
        if rank_summary is None:
            entries.append(RankEntry(
                rank=rank_index, local_rank=-1, host="unknown", status="missing", steps_measured=0,
                last_step=None, step_time_mean_s=None, data_wait_s=None, h2d_copy_s=None,
                forward_s=None, backward_s=None, optimizer_s=None, comm_s=None,
                comm_wait_s=None, transfer_s=None,
                throughput_samples_per_s=None, main_cpu_cores=None, collectives=0,
                last_arrivals=0, lateness_s=None))
            continue
        # a rank with no measured step has no phase times: unknown, not zero
        phases = rank_summary["phases"] if rank_summary["steps_measured"] else {}
        steps = max(1, int(rank_summary["steps_measured"]))
        rank_skew = skew.get(rank_index, {}) if rank_summary["steps_measured"] else {}
        wait = rank_skew["wait_ns"] / 1e9 / steps if rank_skew else None
        exposed = rank_summary.get("ddp_exposed_comm_s")
        comm = (None if exposed is None and not phases.get("comm") else
                (exposed or 0.0) + (phases.get("comm") or 0.0))
        entries.append(RankEntry(
            rank=rank_index, local_rank=rank_summary["local_rank"], host=rank_summary["host"],
            status=rank_summary["status"],
            steps_measured=rank_summary["steps_measured"], last_step=rank_summary["last_step"],
            step_time_mean_s=rank_summary["step_time_mean_s"], data_wait_s=phases.get("data_wait"),
            h2d_copy_s=phases.get("h2d_copy"), forward_s=phases.get("forward"),
            backward_s=phases.get("backward"), optimizer_s=phases.get("optimizer"),
            comm_s=comm, comm_wait_s=wait,
            transfer_s=None if comm is None or wait is None else max(0.0, comm - wait),
            throughput_samples_per_s=rank_summary["throughput_samples_per_s"],
            main_cpu_cores=rank_summary["main_cpu_cores"], collectives=rank_skew.get("collectives", 0),
            last_arrivals=rank_skew.get("last", 0),
            lateness_s=rank_skew["late_ns"] / 1e9 / steps if rank_skew else None,
            caused_wait_s=rank_skew["caused_ns"] / 1e9 / steps if rank_skew else None,
            run_delay_s=rank_summary.get("run_delay_s") if rank_summary["steps_measured"] else None,
            main_thread_cpu_cores=rank_summary.get("main_thread_cpu_cores"),
            device=rank_summary.get("device"), cpus_available=rank_summary.get("cpus_available"),
            device_clock_events=rank_summary.get("device_clock_events")))
    _score(entries, got, skew)
    merged = {name: _merged(entries, name) for name in MERGED}
    ranks = RanksReport(world_size=world_size, missing=missing, ranks=entries, merged=merged,
                        arrivals_source=source, clock_error_s=clock_error_s)
    return ranks, _merge_findings(findings, others, ranks)


def _skew(got: dict[int, dict[str, Any]]) -> tuple[dict[int, dict[str, Any]], str, float]:
    """Per rank: collectives met on every rank, how often it was last, its wait for later
    ranks and its lateness behind the first (ns, summed); where the arrivals came from; and
    the clock alignment's error bound (s)."""
    reasons = {rank_summary["arrivals_reason"] for rank_summary in got.values()
               if rank_summary["arrivals_reason"]}
    if reasons:
        return {}, "arrivals unknown: " + "; ".join(sorted(reasons)), 0.0
    hosts = {rank_summary["host"] for rank_summary in got.values()}
    clocks = {rank_index: rank_summary.get("clock") for rank_index, rank_summary in got.items()}
    if len(hosts) > 1 and any(clock is None for clock in clocks.values()):
        unaligned = sorted(rank_index for rank_index, clock in clocks.items() if clock is None)
        return {}, (f"arrivals not compared: the ranks run on {len(hosts)} hosts and the "
                    f"clocks of rank(s) {', '.join(map(str, unaligned))} could not be aligned "
                    "to rank 0's"), 0.0
    offset = {rank_index: (clock[0] if clock is not None and len(hosts) > 1 else 0)
              for rank_index, clock in clocks.items()}
    error_ns = max((clock[1] for clock in clocks.values() if clock is not None and len(hosts) > 1),
                   default=0)
    arrivals_at: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
    for rank_index, rank_summary in got.items():
        for group, seq, created_ns in rank_summary["arrivals"]:
            arrivals_at[(group, seq)][rank_index] = created_ns + offset[rank_index]
    out: dict[int, dict[str, Any]] = {rank_index: {"collectives": 0, "last": 0, "wait_ns": 0,
                                          "late_ns": 0, "caused_ns": 0} for rank_index in got}
    ends = {rank_index: rank_summary.get("step_ends_ns") or [] for rank_index, rank_summary in got.items()}
    # collectives outside some rank's window are not comparable
    met = [times for times in arrivals_at.values() if len(times) == len(got)]
    for times in met:
        last_rank = max(times, key=lambda rank_index: (times[rank_index], rank_index))
        out[last_rank]["last"] += 1
        for rank_index in times:
            out[rank_index]["collectives"] += 1
    for chain in _chains(met):
        # One stretch of overlapping waits: each rank waited (and was late) once, by its
        # longest, to the rank that came last where that wait was longest.
        for rank_index in got:
            at_c = max(chain, key=lambda collective: collective[1] - collective[0][rank_index])
            wait = at_c[1] - at_c[0][rank_index]
            culprit = max(at_c[0], key=lambda q: (at_c[0][q], q))
            rank_out = out[rank_index]
            rank_out["wait_ns"] += wait
            rank_out["late_ns"] += max(collective[0][rank_index] - collective[2]
                                     for collective in chain)
            out[culprit]["caused_ns"] += wait
            # the step it was in
            step = bisect.bisect_right(ends[rank_index], at_c[0][rank_index] - offset[rank_index])
            by_step = rank_out.setdefault("wait_by_step", {})
            by_step[step] = by_step.get(step, 0.0) + wait / 1e9
    collectives_met = out[min(out)]["collectives"]
    where = ("one host (one clock)" if len(hosts) == 1 else
             f"{len(hosts)} hosts, clocks aligned to rank 0's by round trips through the job's "
             f"store (error bound ≤ {error_ns / 1e3:,.0f} µs)")
    return out, (f"flight-recorder enqueue times of {collectives_met} collectives met on every "
                 f"rank, {where}"), \
        error_ns / 1e9


def _chains(met: list[dict[int, int]]) -> list[list[tuple[dict[int, int], int, int]]]:
    """The collectives met on every rank, as (arrivals by rank, last arrival, first arrival),
    grouped into stretches whose waits overlap.

    Waits at collectives do not add up where they overlap: DDP enqueues each gradient
    bucket's all-reduce without blocking and the host waits once, at the end of backward, for
    all of them, so a rank late by L is late by L at every bucket and its peers wait L, not L
    per bucket. A collective that one rank reaches only after every rank reached the ones
    before it (a blocking collective behind another, the next micro-batch's buckets after a
    synced backward) starts a new stretch: those waits are one after the other, and add."""
    out: list[list[tuple[dict[int, int], int, int]]] = []
    end = None
    for times in sorted(met, key=lambda arrivals: min(arrivals.values())):
        first, last = min(times.values()), max(times.values())
        if end is None or first >= end:
            out.append([])
            end = last
        out[-1].append((times, last, first))
        end = max(end, last)
    return out


SCORE_CHUNK = 10
"""Steps per chunk of a rank's own-best score: medians over 10 steps ride out a preempted
step, and still show a slow-down within a few dozen steps."""


def _score(entries: list[RankEntry], got: dict[int, dict[str, Any]],
           skew: dict[int, dict[str, Any]]) -> None:
    """Per-rank scores, as NVIDIA's resiliency extension reports them for sections users mark
    by hand, here from every step's compute less the rank's wait at that step's collectives:
    against the fastest rank (its median compute ÷ this rank's) and against the rank's own best
    (its best 10-step median ÷ its last one: below 1, it slowed down during the run)."""
    computes: dict[int, list[float]] = {}
    for entry in entries:
        rank_summary = got.get(entry.rank)
        if rank_summary is None or not rank_summary.get("step_compute_s"):
            continue
        waits = skew.get(entry.rank, {}).get("wait_by_step", {})
        computes[entry.rank] = [max(0.0, compute - waits.get(i, 0.0))
                            for i, compute in enumerate(rank_summary["step_compute_s"])]
    medians = {r: statistics.median(compute) for r, compute in computes.items()}
    fastest = min((median for median in medians.values() if median > 0), default=None)
    for entry in entries:
        rank_computes = computes.get(entry.rank)
        if rank_computes is None:
            continue
        if fastest is not None and medians[entry.rank] > 0:
            entry.score_vs_fastest = round(fastest / medians[entry.rank], 4)
        chunks = [statistics.median(rank_computes[i:i + SCORE_CHUNK])
                  for i in range(0, len(rank_computes) - SCORE_CHUNK + 1, SCORE_CHUNK)]
        if len(chunks) >= 2 and chunks[-1] > 0:
            entry.score_vs_own_best = round(min(chunks) / chunks[-1], 4)


def _merged(entries: list[RankEntry], name: str) -> MergedMetric:
    vals = {entry.rank: getattr(entry, name) for entry in entries if getattr(entry, name) is not None}
    if not vals:
        return MergedMetric(median=None, slowest_rank=None, spread=None)
    worst = max(vals, key=lambda rank_index: vals[rank_index])
    return MergedMetric(median=statistics.median(vals.values()), slowest_rank=worst,
                        spread=max(vals.values()) - min(vals.values()))


def _merge_findings(own: list[Finding], others: dict[int, dict[str, Any]],
                    ranks: RanksReport) -> list[Finding]:
    """Rank 0's findings and the others': one with ``rank`` None where every rank has it, else
    one per rank that has it; plus the straggler."""
    by_rank: dict[int, list[Finding]] = {0: own}
    for rank_index, rank_summary in others.items():
        by_rank[rank_index] = [Finding(**{k: v for k, v in finding.items() if k != "rank"})
                      for finding in rank_summary["findings"]]
    for rank_index, rank_findings in by_rank.items():
        # two step-time levels that the CPU waits of the host's ranks explain: decided here,
        # where every rank's wait is known (diagnose/ranks.py)
        by_rank[rank_index] = [finding for finding in rank_findings
                               if finding.id != "step_time_bimodal"
                               or not bimodal_is_the_hosts(ranks, rank_index, finding)]
    reported = len(by_rank)
    ids: dict[str, list[tuple[int, Finding]]] = defaultdict(list)
    for rank_index, rank_findings in by_rank.items():
        for finding in rank_findings:
            ids[finding.id].append((rank_index, finding))
    out = []
    for fid, found in ids.items():
        if fid == "straggler":
            continue  # decided here, from all ranks (diagnose_ranks)
        if len({rank_index for rank_index, _ in found}) == reported:
            out.append(dataclasses.replace(found[0][1], rank=None))
        else:
            out += [dataclasses.replace(finding, rank=rank_index) for rank_index, finding in found]
    return rank([*out, *diagnose_ranks(ranks)])


def encode(payload: dict[str, Any]) -> bytes:
    return zlib.compress(json.dumps(payload, separators=(",", ":"), default=str).encode())


def decode(blob: bytes) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(zlib.decompress(blob))
    return data


def exchange(w: Recorder, report: Report, store: JobStore | None = None,
             timeout_s: float = GATHER_TIMEOUT_S) -> tuple[Report, dict[int, dict[str, Any]]]:
    """Send this rank's summary; on rank 0, gather the others' (up to ``timeout_s``) and
    return the merged report and the other ranks' summaries by rank. Other ranks return their
    own report, with a note, and no summaries. A store that cannot be reached leaves the
    report as it was, said in a note."""
    info: RankInfo = w.rank
    key = w.progress_key
    try:
        store = store or JobStore(info)
        mine = summary(w, report)
        if info.rank != 0:
            store.put_confirmed(f"{key}/rank{info.rank}", encode(mine))
            report.measurements.notes.append(
                f"rank {info.rank} of {info.world_size}: rank 0 prints the job's merged report")
            return report, {}
        want = [f"{key}/rank{rank_index}" for rank_index in range(1, info.world_size)]
        ended: set[int] = set()
        identities: dict[int, bytes] = {}
        job_store = store

        def gone(summary_key: str) -> bool:
            rank_index = int(summary_key.rsplit("rank", 1)[1])
            identity = identities.get(rank_index)
            if identity is None:  # read once: it never changes
                identity = job_store.peek(f"{key}/process{rank_index}")
                if identity is None:
                    return False
                identities[rank_index] = identity
            if process_ended(identity):
                ended.add(rank_index)
            return rank_index in ended

        got = store.gather(want, timeout_s, gone)
    except Exception as e:  # the exchange is best effort: the local report stands
        report.measurements.notes.append(
            f"the ranks' reports could not be exchanged through the job's store "
            f"({type(e).__name__}: {e}); this is rank {info.rank}'s alone")
        return report, {}
    others = {int(k.rsplit("rank", 1)[1]): decode(blob) for k, blob in got.items()}
    ranks, findings = merge(mine, others, info.world_size, report.findings)
    got_all = {0: mine, **others}
    for entry in ranks.ranks:
        if entry.status == "missing":  # how far it got, from its progress beacon
            with contextlib.suppress(Exception):
                beat = store.peek(f"{key}/progress{entry.rank}")
                entry.last_step = int(beat) - 1 if beat else None
    never = [f"{rank_entry.rank} ({rank_entry.status}: "
             f"{got_all[rank_entry.rank].get('status_detail') or 'no detail'})"
             for rank_entry in ranks.ranks if rank_entry.status != "missing" and rank_entry.last_step is None]
    if never:
        report.measurements.notes.append(
            f"rank(s) {', '.join(never)} never completed a step")
    def seen(entries: list[RankEntry]) -> str:
        return ", ".join(f"{entry.rank} (last step it reported: {entry.last_step})"
                         if entry.last_step is not None else f"{entry.rank} (no step reported)"
                         for entry in entries)

    missing = [entry for entry in ranks.ranks if entry.status == "missing"]
    dead = [entry for entry in missing if entry.rank in ended]
    unheard = [entry for entry in missing if entry.rank not in ended]
    if dead:
        report.measurements.notes.append(
            f"no report from rank(s) {seen(dead)}: the process ended without one (crashed or "
            "killed)")
    if unheard:
        report.measurements.notes.append(
            f"no report from rank(s) {seen(unheard)} within {timeout_s:g} s of rank 0's end "
            "(crashed, killed or still running)")
    if report.trace is not None:
        report, findings = _job_trace(report, findings, got_all)
    return dataclasses.replace(report, ranks=ranks, findings=findings), others


def _job_trace(report: Report, findings: list[Finding],
               got: dict[int, dict[str, Any]]) -> tuple[Report, list[Finding]]:
    """``doctor --trace`` on every rank: rank 0 analyses the ranks' traces together (arrival
    skew from collective kernels, or gloo's host-side collectives on CPU), where the files
    are on this host's file system."""
    assert report.trace is not None
    paths = {rank_index: rank_summary["trace_path"] for rank_index, rank_summary in sorted(got.items())
             if rank_summary.get("trace_path")}
    readable = {rank_index: Path(path).is_file() for rank_index, path in paths.items()}
    here = [path for rank_index, path in paths.items() if readable[rank_index]]
    elsewhere = [f"{rank_index} ({got[rank_index]['host']})" for rank_index in paths
                 if not readable[rank_index]]
    parts = [f"{len(here)} of {len(got)} ranks' traces analysed together" if len(here) >= 2
             else f"{len(here)} of {len(got)} ranks' traces on this host: not analysed "
             "together"]
    if elsewhere:
        parts.append(f"rank(s) {', '.join(elsewhere)} wrote theirs on another host: copy them "
                     "into one folder and run `redline trace` on it")
    analysis = None
    if len(here) >= 2:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                analysis = analyze_paths(sorted(here))
        except TraceError as e:
            parts = [f"the ranks' traces could not be analysed together: {e}"]
    if analysis is not None and analysis.stragglers:
        worst = max(analysis.stragglers, key=lambda straggler: straggler.mean_lateness_us)
        side = "collective kernels" if analysis.stragglers_source == "device" else \
            "gloo's host-side collectives"
        parts.append(f"in them rank {worst.rank} arrives last at {worst.last_arrivals} of "
                     f"{worst.collectives} {side}, {worst.mean_lateness_us / 1e3:.1f} ms late "
                     "on average")
    if analysis is not None and not any(finding.id == "straggler" for finding in findings):
        found = [dataclasses.replace(finding, rank=rank_index
                                     if isinstance(rank_index := finding.evidence.get("rank"), int)
                                     else None)
                 for finding in diagnose_trace(analysis) if finding.id == "straggler"]
        findings = rank([*findings, *found])
    note = "; ".join(path for path in (report.trace.note, *parts) if path)
    return dataclasses.replace(report, trace=dataclasses.replace(report.trace, note=note)), \
        findings
