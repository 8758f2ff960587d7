"""What the HTML report shows, as blocks built from the JSON documents redline writes: headings,
sentences, tables and plotly figures (plain dicts of ``data`` and ``layout``).

Every number comes from the document as it is: charts plot its values (seconds shown as
milliseconds, µs as ms, nothing else derived), tables print them, and an unknown value (null)
is shown as "unknown", never as 0. The page (:mod:`redline.report.html`) turns the blocks into
markup; this module has no markup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PHASE_COLOURS = {
    "data_wait": "#d62728", "h2d_copy": "#ff7f0e", "forward": "#1f77b4", "backward": "#2ca02c",
    "optimizer": "#9467bd", "comm": "#8c564b", "evaluation": "#17becf", "other": "#c7c7c7",
}
"""One colour per phase on every chart (the data wait red: what the report is usually about)."""

OUTLIER_FACTOR = 2.0
"""A measured step longer than this multiple of the measured steps' median is marked as an
outlier on the step timeline. A display choice, not a finding: it draws the eye to the steps
that stand out of a steady loop's spread (the statistics keep them; the stall note and the
robust shares in the breakdown are what the diagnosis reads)."""

SCALE_FACTOR = 3.0
"""When a step (usually the first) lasts more than this multiple of the longest measured step,
the timeline's scale fits the measured steps and names the steps above it."""


@dataclass(slots=True, kw_only=True)
class Block:
    """One piece of the page: ``kind`` is ``h2``, ``p``, ``table`` or ``chart``."""

    kind: str
    text: str = ""
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    figure: dict[str, Any] | None = None


def h2(text: str) -> Block:
    return Block(kind="h2", text=text)


def p(text: str) -> Block:
    return Block(kind="p", text=text)


def table(headers: list[str], rows: list[list[str]]) -> Block:
    return Block(kind="table", headers=headers, rows=rows)


def chart(data: list[dict[str, Any]], title: str, height: int = 360, **layout: Any) -> Block:
    base: dict[str, Any] = {"title": {"text": title, "x": 0.01, "xanchor": "left"},
                            "height": height, "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
                            "hovermode": "closest", "template": None}
    base.update(layout)
    return Block(kind="chart", figure={"data": data, "layout": base})


def fmt(v: Any, unit: str = "", scale: float = 1.0, digits: int = 2) -> str:
    """A number as the page prints it; None is 'unknown'."""
    if v is None:
        return "unknown"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    scaled = v * scale
    text = f"{scaled:,.{digits}f}" if isinstance(scaled, float) else f"{scaled:,}"
    return f"{text} {unit}".strip()


def pct(v: float | None, digits: int = 1) -> str:
    return "unknown" if v is None else f"{v * 100:.{digits}f}%"


def ms(v: float | None) -> str:
    return fmt(v, "ms", 1e3)


# -- a report (doctor, demo, watch) ---------------------------------------------------------


def findings_blocks(findings: list[dict[str, Any]], what: str) -> list[Block]:
    out = [h2(f"Findings ({what})")]
    if not findings:
        return [*out, p("No finding: nothing this data supports points at a bottleneck outside "
                        "the model's own compute.")]
    rows = [[finding.get("id", "") + ("" if finding.get("rank") is None else f" (rank {finding['rank']})"),
             finding.get("severity", ""), finding.get("title", ""),
             "none stated" if finding.get("ceiling_speedup") is None
             else f"{finding['ceiling_speedup']:.2f}×", finding.get("fix", ""),
             ", ".join(f"{k}={value}" for k, value in (finding.get("evidence") or {}).items())]
            for finding in findings]
    out.append(table(["finding", "severity", "what was measured", "ceiling", "fix", "evidence"],
                     rows))
    with_ceiling = [finding for finding in findings if finding.get("ceiling_speedup") is not None]
    if with_ceiling:
        out.append(chart([{
            "type": "bar", "orientation": "h", "name": "ceiling",
            "y": [f"{i + 1}. {finding['id']}" + ("" if finding.get("rank") is None
                                            else f" (rank {finding['rank']})")
                  for i, finding in enumerate(with_ceiling)],
            "x": [finding["ceiling_speedup"] for finding in with_ceiling],
            "marker": {"color": "#d62728"},
            "hovertemplate": "%{y}: at most %{x:.2f}× faster if removed<extra></extra>"}],
            "Ceilings: the speed-up if each cause were removed entirely (Amdahl)",
            height=120 + 40 * len(with_ceiling),
            xaxis={"title": {"text": "× speed-up (upper bound)"}},
            yaxis={"autorange": "reversed", "automargin": True}))
    return out


def _ms_exact(seconds: float) -> float:
    """Seconds as ms to the timeline's precision (its rows hold ns: 9 decimals of a second),
    without the float noise of the product (0.0123 s → 12.3, not 12.299999999999999): the
    thousands of points of a long run stay short on the page."""
    return round(seconds * 1e3, 6)


def step_timeline(tl: dict[str, Any]) -> list[Block]:
    """Each step's phases stacked, warm-up and excluded steps faded, outliers marked."""
    steps = tl["steps"]
    phases = list(tl["phases"])
    idx = [step_row[0] for step_row in steps]
    kinds = [step_row[3] for step_row in steps]
    opacity = [1 if k == "measured" else 0.35 for k in kinds]
    data: list[dict[str, Any]] = []
    for i, phase in enumerate(phases):
        phase_ms = [_ms_exact(step_row[5][i]) for step_row in steps]
        if not any(phase_ms):
            continue
        data.append({"type": "bar", "name": phase, "x": idx, "y": phase_ms,
                     "marker": {"color": PHASE_COLOURS.get(phase), "opacity": opacity},
                     "hovertemplate": f"{phase} %{{y:.3f}} ms<extra></extra>"})
    other = [_ms_exact(max(0.0, step_row[2] - sum(step_row[5]))) for step_row in steps]
    data.append({"type": "bar", "name": "other (not in a phase)", "x": idx, "y": other,
                 "marker": {"color": PHASE_COLOURS["other"], "opacity": opacity},
                 "hovertemplate": "other %{y:.3f} ms<extra></extra>"})
    durations = [_ms_exact(step_row[2]) for step_row in steps]
    data.append({"type": "scatter", "mode": "lines", "name": "step time", "x": idx,
                 "y": durations, "line": {"color": "#333", "width": 1}, "customdata": kinds,
                 "hovertemplate": "step %{x} (%{customdata}): %{y:.3f} ms<extra></extra>"})
    measured = sorted(duration_ms for duration_ms, k in zip(durations, kinds, strict=True) if k == "measured")
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    if measured:
        median = measured[len(measured) // 2]
        outliers = [(step_index, duration_ms)
                    for step_index, duration_ms, k in zip(idx, durations, kinds, strict=True)
                    if k == "measured" and duration_ms > OUTLIER_FACTOR * median]
        if outliers:
            data.append({"type": "scatter", "mode": "markers",
                         "name": f"outlier (> {OUTLIER_FACTOR:g}× the median step)",
                         "x": [step_index for step_index, _ in outliers],
                         "y": [duration_ms for _, duration_ms in outliers],
                         "marker": {"symbol": "x", "size": 10, "color": "#000"},
                         "hovertemplate": "step %{x}: %{y:.3f} ms (outlier)<extra></extra>"})
    yaxis: dict[str, Any] = {"title": {"text": "ms"}}
    if measured and max(durations) > SCALE_FACTOR * measured[-1]:
        # a long first step (imports, worker start-up, compilation) would flatten the measured
        # ones: scale to those and say what is off the scale
        top = measured[-1] * 1.25
        yaxis["range"] = [0, top]
        off = [(step_index, duration_ms)
               for step_index, duration_ms in zip(idx, durations, strict=True) if duration_ms > top]
        annotations.append({"x": 1, "y": 1, "xref": "paper", "yref": "paper",
                            "xanchor": "right", "yanchor": "bottom", "showarrow": False,
                            "text": "off the scale: " + ", ".join(
                                f"step {step_index} {duration_ms:,.1f} ms"
                                for step_index, duration_ms in off[:3])
                            + (f" and {len(off) - 3} more" if len(off) > 3 else "")})
    warm = [step_index for step_index, k in zip(idx, kinds, strict=True) if k == "warmup"]
    if warm:
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": min(warm) - 0.5,
                       "x1": max(warm) + 0.5, "y0": 0, "y1": 1, "fillcolor": "#999",
                       "opacity": 0.12, "line": {"width": 0}, "layer": "below"})
        annotations.append({"x": (min(warm) + max(warm)) / 2, "y": 1, "xref": "x",
                            "yref": "paper", "text": "warm-up (not measured)",
                            "showarrow": False, "yanchor": "bottom"})
    blocks = [h2("Step timeline"),
              p("Each step's phases stacked (exclusive host time within the step); warm-up and "
                "excluded steps are faded and left out of every statistic; the line is the "
                "step's wall time." + (f" The first {tl['steps_left_out']} steps are not listed "
                                       "(the report keeps the last ones)."
                                       if tl.get("steps_left_out") else "")),
              chart(data, "Step time by phase, step by step", height=420, barmode="stack",
                    shapes=shapes, annotations=annotations,
                    xaxis={"title": {"text": "step"}}, yaxis=yaxis, hovermode="x unified",
                    legend={"orientation": "h", "y": -0.2})]
    return blocks


def breakdown_blocks(m: dict[str, Any]) -> list[Block]:
    shares = m.get("breakdown") or []
    if not shares:
        return []
    return [h2("Where each step's time goes"),
            chart([{"type": "bar", "orientation": "h", "name": "ms per step",
                    "y": [share["phase"] for share in shares],
                    "x": [share["mean_s"] * 1e3 for share in shares],
                    "customdata": [share["fraction"] for share in shares],
                    "marker": {"color": [PHASE_COLOURS.get(share["phase"], "#7f7f7f")
                                         for share in shares]},
                    "hovertemplate": "%{y}: %{x:.3f} ms per step, %{customdata:.1%} of the step"
                    "<extra></extra>"}],
                  "Mean per measured step (host clock)", height=120 + 30 * len(shares),
                  xaxis={"title": {"text": "ms per step"}},
                  yaxis={"autorange": "reversed", "automargin": True}),
            table(["phase", "ms per step", "share of the step", "share without the slowest step",
                   "slowest step"],
                  [[share["phase"], ms(share["mean_s"]), pct(share["fraction"]),
                    pct(share.get("fraction_without_slowest")),
                    "unknown" if share.get("slowest_step") is None
                    else f"step {share['slowest_step']} ({ms(share.get('slowest_step_s'))})"]
                   for share in shares])]


DATA_WAIT_CAUSES = (("cpu_share_of_wait", "computing (decode, transforms)"),
                    ("contention_share_of_wait", "runnable, waiting for a CPU"),
                    ("waiting_share_of_wait", "off-CPU: storage, locks, sleeps"))


def data_wait_blocks(findings: list[dict[str, Any]], m: dict[str, Any]) -> list[Block]:
    """The data wait split by what the fetcher did, from the data_starvation finding."""
    out = [h2("The data wait, by cause")]
    finding = next((finding for finding in findings if finding.get("id") == "data_starvation"), None)
    if finding is None:
        share = next((share_entry["fraction"] for share_entry in m.get("breakdown") or []
                      if share_entry["phase"] == "data_wait"), None)
        return [*out, p(f"The loop did not starve for data (data wait {pct(share)} of the step, "
                        "below the threshold of the data_starvation finding): no split.")]
    evidence = finding["evidence"]
    known = [(label, evidence.get(key)) for key, label in DATA_WAIT_CAUSES]
    shown = [(label, value) for label, value in known if value is not None]
    out.append(p(f"The loop waits {fmt(evidence.get('data_wait_ms_per_step'), 'ms')} per step for "
                 f"data ({pct(evidence.get('data_wait_fraction'))} of the step). How the fetcher spent "
                 f"that time: {evidence.get('split_basis', 'basis unknown')}."
                 + "".join(f" {label}: unknown." for label, value in known if value is None)))
    if shown:
        out.append(chart([{"type": "bar", "orientation": "h", "name": "share of the wait",
                           "y": [label for label, _ in shown], "x": [value for _, value in shown],
                           "marker": {"color": ["#1f77b4", "#ff7f0e", "#7f7f7f"][:len(shown)]},
                           "hovertemplate": "%{y}: %{x:.1%} of the data wait<extra></extra>"}],
                         "Share of the data wait", height=100 + 40 * len(shown),
                         xaxis={"tickformat": ".0%", "range": [0, 1]},
                         yaxis={"autorange": "reversed", "automargin": True}))
    return out


def counters_blocks(tl: dict[str, Any]) -> list[Block]:
    counters: dict[str, list[list[float]]] = tl.get("counters") or {}
    out = [h2("Device and host metrics over time")]
    if not counters:
        return [*out, p("No sampled counter (the watch read none on this run).")]
    stride = tl.get("points_stride", 1)
    if stride > 1:
        out.append(p(f"Every {stride}th sample is shown (the report keeps at most a few "
                     "thousand points per series)."))
    for name, pts in counters.items():
        out.append(chart([{"type": "scatter", "mode": "lines", "name": name,
                           "x": [time_s for time_s, _ in pts], "y": [value for _, value in pts],
                           "hovertemplate": "%{x:.2f} s: %{y:.3f}<extra></extra>"}],
                         name, height=240, xaxis={"title": {"text": "s from the first step"}}))
    return out


MEMORY_LABELS = {"host_rss": "RSS", "cuda_allocated": "device allocated",
                 "cuda_reserved": "device reserved"}


def memory_blocks(m: dict[str, Any]) -> list[Block]:
    """Memory over the run (``measurements.memory``): one line per curve, bytes against seconds
    from the watch's entry, and each curve's fitted growth."""
    memory = m.get("memory")
    if not memory or not memory.get("curves"):
        return []
    data: list[dict[str, Any]] = []
    rows: list[list[str]] = []
    for curve in memory["curves"]:
        name = MEMORY_LABELS.get(curve["kind"], curve["kind"]) + (
            "" if curve["kind"] != "host_rss" else " main" if curve["process"] == "main"
            else f" worker {curve['pid']}")
        data.append({"type": "scatter", "mode": "lines", "name": name, "x": curve["t_s"],
                     "y": curve["bytes"], "customdata": curve["steps"],
                     "hovertemplate": "%{x:.1f} s, step %{customdata}: %{y:.4s}B"
                                      "<extra>" + name + "</extra>"})
        rows.append([name, "unknown" if curve.get("pid") is None else str(curve["pid"]),
                     fmt(curve["start_bytes"] / 2**20, "MiB", 1, 1),
                     fmt(curve["end_bytes"] / 2**20, "MiB", 1, 1),
                     fmt(None if curve.get("slope_bytes_per_1k_steps") is None
                         else curve["slope_bytes_per_1k_steps"] / 2**20, "MiB", 1, 2),
                     fmt(None if curve.get("slope_bytes_per_hour") is None
                         else curve["slope_bytes_per_hour"] / 2**20, "MiB", 1, 1),
                     fmt(curve.get("trend_z"), "", 1, 1),
                     fmt(curve.get("hours_to_limit"), "h", 1, 1)])
    return [h2("Memory over the run"),
            chart(data, "Memory (sampled off the step path)", height=320,
                  xaxis={"title": {"text": "s from the watch's start"}},
                  yaxis={"title": {"text": "bytes"}, "tickformat": ".3s"}),
            table(["curve", "pid", "window start", "end", "slope per 1,000 steps",
                   "slope per hour", "trend z", "to the limit"], rows)]


def drift_blocks(m: dict[str, Any]) -> list[Block]:
    """Start-up cost and how the steady step time moved (``measurements.drift``)."""
    drift = m.get("drift")
    if not drift:
        return []
    out: list[Block] = []
    startup = drift.get("startup")
    if startup and startup["steps"]:
        out.append(p(f"Start-up: the first {startup['steps']} step(s) took {fmt(startup['seconds'], 's')}, "
                     f"{fmt(startup['extra_s'], 's')} above the steady {ms(startup['steady_step_s'])} step"
                     + (f"; {startup['steps_after_warmup']} of them after the warm-up, "
                        + ("left out of" if startup["left_out"] else "kept in")
                        + " the step statistics" if startup["steps_after_warmup"] else "") + "."))
    trend = drift.get("trend")
    if trend:
        out.append(p(f"Steady steps: {ms(trend['start_s'])} at the first, {ms(trend['end_s'])} at the "
                     f"last of {trend['steps']} (Theil–Sen, "
                     f"{fmt(trend['slope_s_per_1k_steps'] * 1e3, 'ms', 1, 2)} "
                     f"per 1,000 steps, Mann–Kendall z {fmt(trend['trend_z'], '', 1, 1)}, noise "
                     f"{ms(trend['noise_s'])})."))
    modes = drift.get("modes")
    if modes:
        out.append(p(f"Two levels (Otsu): fast {ms(modes['fast_s'])}, slow {ms(modes['slow_s'])} "
                     f"({pct(modes['slow_share'])} of the steps), separation (Ashman's D) "
                     f"{fmt(modes.get('separation'), '', 1, 1)}."))
    return [h2("Start-up and drift"), *out] if out else []


RANK_PARTS = (("data_wait_s", "data_wait"), ("h2d_copy_s", "h2d_copy"),
              ("forward_s", "forward"), ("backward_s", "backward"),
              ("optimizer_s", "optimizer"), ("comm_s", "comm"))


def ranks_blocks(ranks: dict[str, Any], findings: list[dict[str, Any]]) -> list[Block]:
    entries = ranks["ranks"]
    labels = [f"rank {entry['rank']}" for entry in entries]
    data: list[dict[str, Any]] = []
    for key, phase in RANK_PARTS:
        vals = [entry.get(key) for entry in entries]
        if all(value is None for value in vals):
            continue
        data.append({"type": "bar", "name": phase, "x": labels,
                     "y": [None if value is None else value * 1e3 for value in vals],
                     "marker": {"color": PHASE_COLOURS[phase]},
                     "hovertemplate": f"%{{x}}: {phase} %{{y:.3f}} ms per step<extra></extra>"})
    data.append({"type": "scatter", "mode": "markers", "name": "step time", "x": labels,
                 "y": [None if entry.get("step_time_mean_s") is None else entry["step_time_mean_s"] * 1e3
                       for entry in entries], "marker": {"symbol": "diamond", "size": 11,
                                                     "color": "#000"},
                 "hovertemplate": "%{x}: step %{y:.3f} ms<extra></extra>"})
    out = [h2(f"Ranks ({ranks['world_size']} processes)"),
           chart(data, "Per rank: mean ms per measured step by phase", height=400,
                 barmode="stack", yaxis={"title": {"text": "ms per step"}})]
    waits = [(entry.get("comm_wait_s"), entry.get("caused_wait_s")) for entry in entries]
    if any(waited_s is not None or caused_s is not None for waited_s, caused_s in waits):
        out.append(chart([
            {"type": "bar", "name": "waited for late peers", "x": labels,
             "y": [None if waited_s is None else waited_s * 1e3 for waited_s, _ in waits],
             "hovertemplate": "%{x} waited %{y:.3f} ms per step<extra></extra>"},
            {"type": "bar", "name": "made the others wait", "x": labels,
             "y": [None if caused_s is None else caused_s * 1e3 for _, caused_s in waits],
             "hovertemplate": "%{x} made the others wait %{y:.3f} ms per step<extra></extra>"}],
            "Waiting at collectives (per step)", height=320, barmode="group",
            yaxis={"title": {"text": "ms per step"}}))
    out.append(table(
        ["rank", "host", "status", "steps", "step time", "throughput", "last arrivals",
         "lateness", "compute vs fastest", "compute vs own best"],
        [[str(entry["rank"]), entry["host"], entry["status"], str(entry["steps_measured"]),
          ms(entry.get("step_time_mean_s")), fmt(entry.get("throughput_samples_per_s"), "samples/s", 1, 1),
          f"{entry['last_arrivals']} of {entry['collectives']}", ms(entry.get("lateness_s")),
          fmt(entry.get("score_vs_fastest"), "", 1, 3), fmt(entry.get("score_vs_own_best"), "", 1, 3)]
         for entry in entries]))
    merged = ranks.get("merged") or {}
    out.append(table(["metric", "median over ranks", "largest on", "spread (largest − smallest)"],
                     [[k, ms(value.get("median")), "unknown" if value.get("slowest_rank") is None
                       else f"rank {value['slowest_rank']}", ms(value.get("spread"))]
                      for k, value in merged.items()]))
    straggle = [finding for finding in findings if finding.get("id") == "straggler"]
    for finding in straggle:
        out.append(p(f"Straggler: {finding['title']}. Evidence: "
                     + ", ".join(f"{k}={value}" for k, value in finding["evidence"].items())))
    if ranks.get("missing"):
        out.append(p(f"Ranks whose report did not arrive: {ranks['missing']}."))
    out.append(p(f"Arrival times: {ranks.get('arrivals_source')}"))
    return out


def report_blocks(doc: dict[str, Any]) -> list[Block]:
    """A doctor/demo/watch report (schema ``redline.report/*``)."""
    measurements = doc["measurements"]
    timing = measurements["timing"]
    dev = measurements["device"]
    mfu = measurements.get("mfu") or {}
    cmd = " ".join(doc.get("command") or []) or "redline.watch"
    out = [h2(f"Run: {cmd}"),
           p(f"status {doc['status'].replace('_', ' ')}"
             + (f" ({doc['status_detail']})" if doc.get("status_detail") else "")
             + f" · device {dev['name']} ({dev['type']}) · metric tier {measurements['tier']['tier']} · "
             f"redline {doc['redline_version']}, torch {doc['torch_version']} · "
             f"{doc['created_utc']}"),
           table(["steps measured", "warm-up", "excluded", "step time (mean)", "p50", "p95",
                  "throughput", "MFU"],
                 [[str(timing["steps_measured"]), str(timing["steps_warmup"]), str(timing["steps_excluded"]),
                   ms(timing.get("step_time_mean_s")), ms(timing.get("step_time_p50_s")),
                   ms(timing.get("step_time_p95_s")),
                   fmt(timing.get("throughput_samples_per_s"), "samples/s", 1, 1),
                   pct(mfu.get("mfu")) if mfu.get("mfu") is not None
                   else f"unknown ({mfu.get('reason')})"]])]
    findings = doc.get("findings") or []
    timeline = doc.get("timeline")
    if not timing["steps_total"]:
        out.append(p("No step was measured, so there is nothing to chart or diagnose; the "
                     "status above says what was seen."))
    else:
        out += findings_blocks(findings, "ranked by ceiling")
        if timeline:
            out += step_timeline(timeline)
        out += breakdown_blocks(measurements)
        out += data_wait_blocks(findings, measurements)
        out += drift_blocks(measurements)
        out += memory_blocks(measurements)
        if timeline:
            out += counters_blocks(timeline)
    if doc.get("ranks"):
        out += ranks_blocks(doc["ranks"], findings)
    trace = doc.get("trace")
    if trace:
        out += [h2("Profiler trace"),
                p(f"{trace['steps']} steps, {trace['device_events']} device events: GPU idle "
                  f"{fmt(trace.get('idle_pct'), '%', 1, 1)}, compute "
                  f"{fmt(trace.get('compute_pct'), '%', 1, 1)}, non-compute "
                  f"{fmt(trace.get('non_compute_pct'), '%', 1, 1)} of the kernel window"
                  + (f" — {trace['note']}" if trace.get("note") else "")
                  + (f" — {trace['path']} (open in Perfetto)" if trace.get("path") else ""))]
    missing = measurements["tier"].get("missing") or []
    notes = measurements.get("notes") or []
    if missing or notes:
        out.append(h2("Not measured, and notes"))
        out += [p(f"not measured: {gap['metric']} — {gap['reason']}") for gap in missing]
        out += [p(f"note: {note}") for note in notes]
    return out
