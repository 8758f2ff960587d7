"""redline's own timeline as a Chrome-trace JSON file (``--timeline PATH``), for Perfetto UI
(ui.perfetto.dev) and ``chrome://tracing``.

Format: the Trace Event Format (Google, "Trace Event Format" document): an object with a
``traceEvents`` list; complete events (``ph: "X"``, ``ts`` and ``dur`` in µs), counter events
(``ph: "C"``, numeric ``args``), and metadata events (``ph: "M"``) naming processes and threads.

Layout: one process per rank ("rank N (host)"); in it a ``steps`` track with one
``ProfilerStep#N`` slice per step (the name torch.profiler gives its steps, so trace readers —
redline's own included — see them as steps; warm-up and excluded steps say so in their
category), then one track per phase. The phases are exclusive *totals* within the step, not
intervals (the always-on watch sums them; it does not keep every interval): each phase's slice
starts at the step's start and lasts the phase's total, so the tracks compare, step by step,
how much of the step each phase took. Counter tracks: step time, data wait share, the process's
and its DataLoader workers' CPU use, and, on CUDA with NVML, utilization, power, memory and SM
clock. Times are wall-clock (each rank's host clock; ranks of one host share it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redline.core.files import write_text_atomic
from redline.measure.step_record import DATA_WAIT, PHASES

if TYPE_CHECKING:
    from redline.measure.recorder import Recorder

STEP_TRACK = 0
"""Thread id of the steps track; phase i is on thread ``i + 1``, 'other' after them."""

FORMAT = "redline.timeline/1"


MIN_RATE_WINDOW_S = 0.1
"""Shortest window a CPU-use point is computed over: process CPU times advance in clock ticks
(USER_HZ = 100 on Linux, ``man 5 proc``), so a window of 10 ticks keeps a point within 0.1 core
of the truth however often the sampler reads."""


def _rate_windows(series: list[tuple[float, float, float]]
                  ) -> list[tuple[tuple[float, float, float], tuple[float, float, float]]]:
    """Consecutive (start, end) readings at least :data:`MIN_RATE_WINDOW_S` apart; a run
    shorter than that gets one window over all of it (coarser, but not nothing)."""
    if len(series) < 2:
        return []
    out = []
    anchor = series[0]
    for reading in series[1:]:
        if reading[0] - anchor[0] >= MIN_RATE_WINDOW_S:
            out.append((anchor, reading))
            anchor = reading
    if not out and series[-1][0] > series[0][0]:
        out.append((series[0], series[-1]))
    return out


def rank_timeline(w: Recorder) -> dict[str, Any]:
    """This rank's steps and sampled counters, compact and JSON-ready (it travels through the
    job's store in a multi-process job): times in wall-clock ns."""
    off = w.wall_offset_ns

    def ns(t: float) -> int:
        return int(t * 1e9) + off

    steps = [[step.index, ns(step.start_s), ns(step.end_s), step.kind, step.samples,
              [round(phase_s, 9) for phase_s in step.phases]] for step in w.steps]
    counters: dict[str, list[list[float]]] = {}
    cpu = _rate_windows(list(w.cpu.series))
    for name, col in (("CPU cores, training process", 1), ("CPU cores, loader workers", 2)):
        pts = [[ns(window_end[0]), max(0.0, (window_end[col] - window_start[col])
                                       / (window_end[0] - window_start[0]))]
               for window_start, window_end in cpu]
        if pts and (col == 1 or any(value for _, value in pts)):
            counters[name] = pts
    if w.nvml is not None:
        nvml_series = list(w.nvml.series)
        for name, col, scale in (("GPU utilization %", 1, 1.0), ("GPU power W", 2, 1.0),
                                 ("GPU memory used GiB", 3, 2.0 ** -30),
                                 ("SM clock MHz", 4, 1.0)):
            pts = [[ns(row[0]), value * scale] for row in nvml_series if (value := row[col]) is not None]
            if pts:
                counters[name] = pts
    info = w.rank
    return {"rank": info.rank, "host": info.host, "device": str(w.device), "steps": steps,
            "counters": counters}


def chrome_trace(timelines: list[dict[str, Any]]) -> dict[str, Any]:
    """The Chrome-trace document of one or more ranks' :func:`rank_timeline`."""
    starts = [step_row[1] for timeline in timelines for step_row in timeline["steps"]]
    starts += [point[0] for timeline in timelines for pts in timeline["counters"].values()
               for point in pts]
    start_ns = min(starts, default=0)

    def us(t_ns: int | float) -> float:
        return round((t_ns - start_ns) / 1e3, 3)

    events: list[dict[str, Any]] = []
    for rank_doc in sorted(timelines, key=lambda timeline: int(timeline["rank"])):
        pid = int(rank_doc["rank"])

        def meta(name: str, args: dict[str, Any], tid: int = 0, pid: int = pid) -> None:
            events.append({"ph": "M", "name": name, "pid": pid, "tid": tid, "ts": 0,
                           "args": args})

        meta("process_name", {"name": f"rank {pid} ({rank_doc['host']}, {rank_doc['device']})"})
        meta("process_sort_index", {"sort_index": pid})
        tracks = ["steps", *PHASES, "other"]
        for tid, track in enumerate(tracks):
            meta("thread_name", {"name": track}, tid)
            meta("thread_sort_index", {"sort_index": tid}, tid)
        for index, start, end, kind, samples, phases in rank_doc["steps"]:
            step_s = (end - start) / 1e9
            other = max(0.0, step_s - sum(phases))
            phase_ms = {phase_name: round(value * 1e3, 4)
                        for phase_name, value in zip(PHASES, phases, strict=True)}
            args: dict[str, Any] = {"step_ms": round(step_s * 1e3, 4), "kind": kind,
                                    **{f"{phase_name}_ms": value for phase_name, value in phase_ms.items()},
                                    "other_ms": round(other * 1e3, 4)}
            if samples is not None:
                args["samples"] = samples
            events.append({"ph": "X", "name": f"ProfilerStep#{index}", "cat":
                           f"user_annotation,redline_{kind}", "pid": pid, "tid": STEP_TRACK,
                           "ts": us(start), "dur": us(end) - us(start), "args": args})
            for tid, (phase, secs) in enumerate([*zip(PHASES, phases, strict=True),
                                                 ("other", other)], start=1):
                if secs > 0:
                    events.append({"ph": "X", "name": phase, "cat": "redline_phase",
                                   "pid": pid, "tid": tid, "ts": us(start),
                                   "dur": round(secs * 1e6, 3),
                                   "args": {"ms": round(secs * 1e3, 4), "step": index,
                                            "note": "total within the step, not one interval"}})
            events.append({"ph": "C", "name": "step time ms", "pid": pid, "ts": us(start),
                           "args": {"ms": round(step_s * 1e3, 4)}})
            events.append({"ph": "C", "name": "data wait share", "pid": pid, "ts": us(start),
                           "args": {"share": round(phases[DATA_WAIT] / step_s, 4) if step_s > 0
                                    else 0.0}})
        for name, pts in rank_doc["counters"].items():
            events.extend({"ph": "C", "name": name, "pid": pid, "ts": us(time_ns),
                           "args": {"value": round(value, 4)}} for time_ns, value in pts)
    # distributedInfo: trace readers take the file's rank from it; this one file holds every
    # rank of the job, each its own process (pid = rank)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "distributedInfo": {"rank": min((int(timeline["rank"]) for timeline in timelines), default=0),
                                "world_size": len(timelines)},
            "otherData": {"format": FORMAT, "ranks": len(timelines),
                          "phases": "exclusive totals within each step, not intervals",
                          "t0_wall_ns": start_ns}}


def write_timeline(path: str | Path, timelines: list[dict[str, Any]]) -> Path:
    """Write the timeline file atomically (whole or absent)."""
    return write_text_atomic(json.dumps(chrome_trace(timelines), separators=(",", ":")), path)
