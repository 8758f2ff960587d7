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
from redline.measure.ranks import GATHER_TIMEOUT_S, JobStore, RankInfo
from redline.measure.recorder import Recorder
from redline.measure.timeline import BACKWARD, FORWARD, OPTIMIZER
from redline.report.perfetto import rank_timeline
from redline.trace import TraceError, analyze_paths

MERGED = ("step_time_mean_s", "data_wait_s", "forward_s", "backward_s", "optimizer_s",
          "comm_s", "comm_wait_s")


def summary(w: Recorder, report: Report) -> dict[str, Any]:
    """What this rank sends to rank 0."""
    m = report.measurements
    info = w.rank
    phases = {p.phase: p.mean_s for p in m.breakdown}
    return {
        "rank": info.rank, "local_rank": info.local_rank, "host": info.host,
        "status": report.status, "steps_measured": m.timing.steps_measured,
        "status_detail": _first_sentence(report.status_detail),
        "last_step": w.tracker.closed - 1 if w.tracker.closed else None,
        "step_time_mean_s": m.timing.step_time_mean_s, "phases": phases,
        "throughput_samples_per_s": m.timing.throughput_samples_per_s,
        "main_cpu_cores": m.host.main_cpu_cores,
        # what the straggler's cause is judged on: the device, the CPUs the ranks of a host
        # share, and the GPU's own word on slowed clocks
        "device": m.device.type, "cpus_available": m.host.cpus_available,
        "device_clock_events": (None if m.device_metrics.nvml is None
                                else list(m.device_metrics.nvml.clock_event_reasons)),
        "run_delay_s": (None if m.host.main_thread_run_delay_fraction is None
                        or m.timing.step_time_mean_s is None else
                        m.host.main_thread_run_delay_fraction * m.timing.step_time_mean_s),
        "ddp_exposed_comm_s": _ddp_exposed(m),
        "arrivals": [[a.group, a.seq, a.created_ns] for a in w.arrivals],
        "arrivals_reason": w.arrivals_reason,
        "clock": None if w.beacon is None else w.beacon.clock,
        "findings": [dataclasses.asdict(f) for f in report.findings],
        "trace_path": (str(w.capture.path) if w.capture is not None and w.capture.written
                       else None),
        # per measured step: its end on the wall clock (ns) and its compute (forward +
        # backward + optimizer, host s), for the per-rank scores
        "step_ends_ns": [int(s.end_s * 1e9) + w.wall_offset_ns for s in w.measured_steps],
        "step_compute_s": [round(s.phases[FORWARD] + s.phases[BACKWARD] + s.phases[OPTIMIZER], 7)
                           for s in w.measured_steps],
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
    d = m.ddp
    if d is None or d.backward_comm_s is None:
        return None
    exposed = max(0.0, d.backward_comm_s - (d.backward_overlap_s or 0.0)) * (
        d.backward_per_step or 1.0)
    # DDP's averages come from its sampled iterations, warm-up included; the exposed
    # all-reduce happens inside backward, so it cannot exceed the measured backward
    backward = next((p.mean_s for p in m.breakdown if p.phase == "backward"), None)
    return exposed if backward is None else min(exposed, backward)


def merge(own: dict[str, Any], others: dict[int, dict[str, Any]], world_size: int,
          findings: list[Finding]) -> tuple[RanksReport, list[Finding]]:
    """Rank 0's view: its summary and the others' (by rank), the findings merged."""
    got = {own["rank"]: own, **others}
    missing = [r for r in range(world_size) if r not in got]
    skew, source, clock_error_s = _skew(got)
    entries = []
    for r in range(world_size):
        s = got.get(r)
        if s is None:
            entries.append(RankEntry(
                rank=r, local_rank=-1, host="unknown", status="missing", steps_measured=0,
                last_step=None, step_time_mean_s=None, data_wait_s=None, h2d_copy_s=None,
                forward_s=None, backward_s=None, optimizer_s=None, comm_s=None,
                comm_wait_s=None, transfer_s=None,
                throughput_samples_per_s=None, main_cpu_cores=None, collectives=0,
                last_arrivals=0, lateness_s=None))
            continue
        # a rank with no measured step has no phase times: unknown, not zero
        ph = s["phases"] if s["steps_measured"] else {}
        steps = max(1, int(s["steps_measured"]))
        k = skew.get(r, {}) if s["steps_measured"] else {}
        wait = k["wait_ns"] / 1e9 / steps if k else None
        exposed = s.get("ddp_exposed_comm_s")
        comm = (None if exposed is None and not ph.get("comm") else
                (exposed or 0.0) + (ph.get("comm") or 0.0))
        entries.append(RankEntry(
            rank=r, local_rank=s["local_rank"], host=s["host"], status=s["status"],
            steps_measured=s["steps_measured"], last_step=s["last_step"],
            step_time_mean_s=s["step_time_mean_s"], data_wait_s=ph.get("data_wait"),
            h2d_copy_s=ph.get("h2d_copy"), forward_s=ph.get("forward"),
            backward_s=ph.get("backward"), optimizer_s=ph.get("optimizer"),
            comm_s=comm, comm_wait_s=wait,
            transfer_s=None if comm is None or wait is None else max(0.0, comm - wait),
            throughput_samples_per_s=s["throughput_samples_per_s"],
            main_cpu_cores=s["main_cpu_cores"], collectives=k.get("collectives", 0),
            last_arrivals=k.get("last", 0),
            lateness_s=k["late_ns"] / 1e9 / steps if k else None,
            caused_wait_s=k["caused_ns"] / 1e9 / steps if k else None,
            run_delay_s=s.get("run_delay_s") if s["steps_measured"] else None,
            device=s.get("device"), cpus_available=s.get("cpus_available"),
            device_clock_events=s.get("device_clock_events")))
    _score(entries, got, skew)
    merged = {name: _merged(entries, name) for name in MERGED}
    ranks = RanksReport(world_size, missing, entries, merged, source, clock_error_s)
    return ranks, _merge_findings(findings, others, ranks)


def _skew(got: dict[int, dict[str, Any]]) -> tuple[dict[int, dict[str, Any]], str, float]:
    """Per rank: collectives met on every rank, how often it was last, its wait for later
    ranks and its lateness behind the first (ns, summed); where the arrivals came from; and
    the clock alignment's error bound (s)."""
    reasons = {s["arrivals_reason"] for s in got.values() if s["arrivals_reason"]}
    if reasons:
        return {}, "arrivals unknown: " + "; ".join(sorted(reasons)), 0.0
    hosts = {s["host"] for s in got.values()}
    clocks = {r: s.get("clock") for r, s in got.items()}
    if len(hosts) > 1 and any(c is None for c in clocks.values()):
        unaligned = sorted(r for r, c in clocks.items() if c is None)
        return {}, (f"arrivals not compared: the ranks run on {len(hosts)} hosts and the "
                    f"clocks of rank(s) {', '.join(map(str, unaligned))} could not be aligned "
                    "to rank 0's"), 0.0
    offset = {r: (c[0] if c is not None and len(hosts) > 1 else 0) for r, c in clocks.items()}
    error_ns = max((c[1] for c in clocks.values() if c is not None and len(hosts) > 1),
                   default=0)
    at: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
    for r, s in got.items():
        for group, seq, t in s["arrivals"]:
            at[(group, seq)][r] = t + offset[r]
    out: dict[int, dict[str, Any]] = {r: {"collectives": 0, "last": 0, "wait_ns": 0,
                                          "late_ns": 0, "caused_ns": 0} for r in got}
    ends = {r: s.get("step_ends_ns") or [] for r, s in got.items()}
    # collectives outside some rank's window are not comparable
    met = [times for times in at.values() if len(times) == len(got)]
    for times in met:
        last_rank = max(times, key=lambda r: (times[r], r))
        out[last_rank]["last"] += 1
        for r in times:
            out[r]["collectives"] += 1
    for chain in _chains(met):
        # One stretch of overlapping waits: each rank waited (and was late) once, by its
        # longest, to the rank that came last where that wait was longest.
        for r in got:
            at_c = max(chain, key=lambda c: c[1] - c[0][r])
            wait = at_c[1] - at_c[0][r]
            culprit = max(at_c[0], key=lambda q: (at_c[0][q], q))
            o = out[r]
            o["wait_ns"] += wait
            o["late_ns"] += max(c[0][r] - c[2] for c in chain)
            out[culprit]["caused_ns"] += wait
            step = bisect.bisect_right(ends[r], at_c[0][r] - offset[r])  # the step it was in
            by_step = o.setdefault("wait_by_step", {})
            by_step[step] = by_step.get(step, 0.0) + wait / 1e9
    n = out[min(out)]["collectives"]
    where = ("one host (one clock)" if len(hosts) == 1 else
             f"{len(hosts)} hosts, clocks aligned to rank 0's by round trips through the job's "
             f"store (error bound ≤ {error_ns / 1e3:,.0f} µs)")
    return out, f"flight-recorder enqueue times of {n} collectives met on every rank, {where}", \
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
    for times in sorted(met, key=lambda t: min(t.values())):
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
    for e in entries:
        s = got.get(e.rank)
        if s is None or not s.get("step_compute_s"):
            continue
        waits = skew.get(e.rank, {}).get("wait_by_step", {})
        computes[e.rank] = [max(0.0, c - waits.get(i, 0.0))
                            for i, c in enumerate(s["step_compute_s"])]
    medians = {r: statistics.median(c) for r, c in computes.items()}
    fastest = min((m for m in medians.values() if m > 0), default=None)
    for e in entries:
        c = computes.get(e.rank)
        if c is None:
            continue
        if fastest is not None and medians[e.rank] > 0:
            e.score_vs_fastest = round(fastest / medians[e.rank], 4)
        chunks = [statistics.median(c[i:i + SCORE_CHUNK])
                  for i in range(0, len(c) - SCORE_CHUNK + 1, SCORE_CHUNK)]
        if len(chunks) >= 2 and chunks[-1] > 0:
            e.score_vs_own_best = round(min(chunks) / chunks[-1], 4)


def _merged(entries: list[RankEntry], name: str) -> MergedMetric:
    vals = {e.rank: getattr(e, name) for e in entries if getattr(e, name) is not None}
    if not vals:
        return MergedMetric(None, None, None)
    worst = max(vals, key=lambda r: vals[r])
    return MergedMetric(statistics.median(vals.values()), worst,
                        max(vals.values()) - min(vals.values()))


def _merge_findings(own: list[Finding], others: dict[int, dict[str, Any]],
                    ranks: RanksReport) -> list[Finding]:
    """Rank 0's findings and the others': one with ``rank`` None where every rank has it, else
    one per rank that has it; plus the straggler."""
    by_rank: dict[int, list[Finding]] = {0: own}
    for r, s in others.items():
        by_rank[r] = [Finding(**{k: v for k, v in f.items() if k != "rank"})
                      for f in s["findings"]]
    reported = len(by_rank)
    ids: dict[str, list[tuple[int, Finding]]] = defaultdict(list)
    for r, fs in by_rank.items():
        for f in fs:
            ids[f.id].append((r, f))
    out = []
    for fid, found in ids.items():
        if fid == "straggler":
            continue  # decided here, from all ranks (diagnose_ranks)
        if len({r for r, _ in found}) == reported:
            out.append(dataclasses.replace(found[0][1], rank=None))
        else:
            out += [dataclasses.replace(f, rank=r) for r, f in found]
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
            store.put(f"{key}/rank{info.rank}", encode(mine))
            report.measurements.notes.append(
                f"rank {info.rank} of {info.world_size}: rank 0 prints the job's merged report")
            return report, {}
        want = [f"{key}/rank{r}" for r in range(1, info.world_size)]
        got = store.gather(want, timeout_s)
    except Exception as e:  # the exchange is best effort: the local report stands
        report.measurements.notes.append(
            f"the ranks' reports could not be exchanged through the job's store "
            f"({type(e).__name__}: {e}); this is rank {info.rank}'s alone")
        return report, {}
    others = {int(k.rsplit("rank", 1)[1]): decode(v) for k, v in got.items()}
    ranks, findings = merge(mine, others, info.world_size, report.findings)
    got_all = {0: mine, **others}
    for entry in ranks.ranks:
        if entry.status == "missing":  # how far it got, from its progress beacon
            with contextlib.suppress(Exception):
                beat = store.peek(f"{key}/progress{entry.rank}")
                entry.last_step = int(beat) - 1 if beat else None
    never = [f"{x.rank} ({x.status}: {got_all[x.rank].get('status_detail') or 'no detail'})"
             for x in ranks.ranks if x.status != "missing" and x.last_step is None]
    if never:
        report.measurements.notes.append(
            f"rank(s) {', '.join(never)} never completed a step")
    if ranks.missing:
        seen = ", ".join(f"{x.rank} (last step it reported: {x.last_step})"
                         if x.last_step is not None else f"{x.rank} (no step reported)"
                         for x in ranks.ranks if x.status == "missing")
        report.measurements.notes.append(
            f"no report from rank(s) {seen} within {timeout_s:g} s of rank 0's end "
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
    paths = {r: s["trace_path"] for r, s in sorted(got.items()) if s.get("trace_path")}
    readable = {r: Path(p).is_file() for r, p in paths.items()}
    here = [p for r, p in paths.items() if readable[r]]
    elsewhere = [f"{r} ({got[r]['host']})" for r in paths if not readable[r]]
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
        worst = max(analysis.stragglers, key=lambda x: x.mean_lateness_us)
        side = "collective kernels" if analysis.stragglers_source == "device" else \
            "gloo's host-side collectives"
        parts.append(f"in them rank {worst.rank} arrives last at {worst.last_arrivals} of "
                     f"{worst.collectives} {side}, {worst.mean_lateness_us / 1e3:.1f} ms late "
                     "on average")
    if analysis is not None and not any(f.id == "straggler" for f in findings):
        found = [dataclasses.replace(f, rank=r if isinstance(r := f.evidence.get("rank"), int)
                                     else None)
                 for f in diagnose_trace(analysis) if f.id == "straggler"]
        findings = rank([*findings, *found])
    note = "; ".join(p for p in (report.trace.note, *parts) if p)
    return dataclasses.replace(report, trace=dataclasses.replace(report.trace, note=note)), \
        findings
