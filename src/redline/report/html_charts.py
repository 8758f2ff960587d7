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


@dataclass(slots=True)
class Block:
    """One piece of the page: ``kind`` is ``h2``, ``p``, ``table`` or ``chart``."""

    kind: str
    text: str = ""
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    figure: dict[str, Any] | None = None


def h2(text: str) -> Block:
    return Block("h2", text)


def p(text: str) -> Block:
    return Block("p", text)


def table(headers: list[str], rows: list[list[str]]) -> Block:
    return Block("table", headers=headers, rows=rows)


def chart(data: list[dict[str, Any]], title: str, height: int = 360, **layout: Any) -> Block:
    base: dict[str, Any] = {"title": {"text": title, "x": 0.01, "xanchor": "left"},
                            "height": height, "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
                            "hovermode": "closest", "template": None}
    base.update(layout)
    return Block("chart", figure={"data": data, "layout": base})


def fmt(v: Any, unit: str = "", scale: float = 1.0, digits: int = 2) -> str:
    """A number as the page prints it; None is 'unknown'."""
    if v is None:
        return "unknown"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    x = v * scale
    s = f"{x:,.{digits}f}" if isinstance(x, float) else f"{x:,}"
    return f"{s} {unit}".strip()


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
    rows = [[f.get("id", "") + ("" if f.get("rank") is None else f" (rank {f['rank']})"),
             f.get("severity", ""), f.get("title", ""),
             "none stated" if f.get("ceiling_speedup") is None
             else f"{f['ceiling_speedup']:.2f}×", f.get("fix", ""),
             ", ".join(f"{k}={v}" for k, v in (f.get("evidence") or {}).items())]
            for f in findings]
    out.append(table(["finding", "severity", "what was measured", "ceiling", "fix", "evidence"],
                     rows))
    with_ceiling = [f for f in findings if f.get("ceiling_speedup") is not None]
    if with_ceiling:
        out.append(chart([{
            "type": "bar", "orientation": "h", "name": "ceiling",
            "y": [f"{i + 1}. {f['id']}" + ("" if f.get("rank") is None
                                            else f" (rank {f['rank']})")
                  for i, f in enumerate(with_ceiling)],
            "x": [f["ceiling_speedup"] for f in with_ceiling],
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
    idx = [s[0] for s in steps]
    kinds = [s[3] for s in steps]
    opacity = [1 if k == "measured" else 0.35 for k in kinds]
    data: list[dict[str, Any]] = []
    for i, ph in enumerate(phases):
        ys = [_ms_exact(s[5][i]) for s in steps]
        if not any(ys):
            continue
        data.append({"type": "bar", "name": ph, "x": idx, "y": ys,
                     "marker": {"color": PHASE_COLOURS.get(ph), "opacity": opacity},
                     "hovertemplate": f"{ph} %{{y:.3f}} ms<extra></extra>"})
    other = [_ms_exact(max(0.0, s[2] - sum(s[5]))) for s in steps]
    data.append({"type": "bar", "name": "other (not in a phase)", "x": idx, "y": other,
                 "marker": {"color": PHASE_COLOURS["other"], "opacity": opacity},
                 "hovertemplate": "other %{y:.3f} ms<extra></extra>"})
    durations = [_ms_exact(s[2]) for s in steps]
    data.append({"type": "scatter", "mode": "lines", "name": "step time", "x": idx,
                 "y": durations, "line": {"color": "#333", "width": 1}, "customdata": kinds,
                 "hovertemplate": "step %{x} (%{customdata}): %{y:.3f} ms<extra></extra>"})
    measured = sorted(d for d, k in zip(durations, kinds, strict=True) if k == "measured")
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    if measured:
        median = measured[len(measured) // 2]
        outliers = [(x, d) for x, d, k in zip(idx, durations, kinds, strict=True)
                    if k == "measured" and d > OUTLIER_FACTOR * median]
        if outliers:
            data.append({"type": "scatter", "mode": "markers",
                         "name": f"outlier (> {OUTLIER_FACTOR:g}× the median step)",
                         "x": [x for x, _ in outliers], "y": [d for _, d in outliers],
                         "marker": {"symbol": "x", "size": 10, "color": "#000"},
                         "hovertemplate": "step %{x}: %{y:.3f} ms (outlier)<extra></extra>"})
    yaxis: dict[str, Any] = {"title": {"text": "ms"}}
    if measured and max(durations) > SCALE_FACTOR * measured[-1]:
        # a long first step (imports, worker start-up, compilation) would flatten the measured
        # ones: scale to those and say what is off the scale
        top = measured[-1] * 1.25
        yaxis["range"] = [0, top]
        off = [(x, d) for x, d in zip(idx, durations, strict=True) if d > top]
        annotations.append({"x": 1, "y": 1, "xref": "paper", "yref": "paper",
                            "xanchor": "right", "yanchor": "bottom", "showarrow": False,
                            "text": "off the scale: " + ", ".join(
                                f"step {x} {d:,.1f} ms" for x, d in off[:3])
                            + (f" and {len(off) - 3} more" if len(off) > 3 else "")})
    warm = [x for x, k in zip(idx, kinds, strict=True) if k == "warmup"]
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
                    "y": [s["phase"] for s in shares], "x": [s["mean_s"] * 1e3 for s in shares],
                    "customdata": [s["fraction"] for s in shares],
                    "marker": {"color": [PHASE_COLOURS.get(s["phase"], "#7f7f7f")
                                         for s in shares]},
                    "hovertemplate": "%{y}: %{x:.3f} ms per step, %{customdata:.1%} of the step"
                    "<extra></extra>"}],
                  "Mean per measured step (host clock)", height=120 + 30 * len(shares),
                  xaxis={"title": {"text": "ms per step"}},
                  yaxis={"autorange": "reversed", "automargin": True}),
            table(["phase", "ms per step", "share of the step", "share without the slowest step",
                   "slowest step"],
                  [[s["phase"], ms(s["mean_s"]), pct(s["fraction"]),
                    pct(s.get("fraction_without_slowest")),
                    "unknown" if s.get("slowest_step") is None
                    else f"step {s['slowest_step']} ({ms(s.get('slowest_step_s'))})"]
                   for s in shares])]


DATA_WAIT_CAUSES = (("cpu_share_of_wait", "computing (decode, transforms)"),
                    ("contention_share_of_wait", "runnable, waiting for a CPU"),
                    ("waiting_share_of_wait", "off-CPU: storage, locks, sleeps"))


def data_wait_blocks(findings: list[dict[str, Any]], m: dict[str, Any]) -> list[Block]:
    """The data wait split by what the fetcher did, from the data_starvation finding."""
    out = [h2("The data wait, by cause")]
    f = next((f for f in findings if f.get("id") == "data_starvation"), None)
    if f is None:
        share = next((s["fraction"] for s in m.get("breakdown") or []
                      if s["phase"] == "data_wait"), None)
        return [*out, p(f"The loop did not starve for data (data wait {pct(share)} of the step, "
                        "below the threshold of the data_starvation finding): no split.")]
    ev = f["evidence"]
    known = [(label, ev.get(key)) for key, label in DATA_WAIT_CAUSES]
    shown = [(label, v) for label, v in known if v is not None]
    out.append(p(f"The loop waits {fmt(ev.get('data_wait_ms_per_step'), 'ms')} per step for "
                 f"data ({pct(ev.get('data_wait_fraction'))} of the step). How the fetcher spent "
                 f"that time: {ev.get('split_basis', 'basis unknown')}."
                 + "".join(f" {label}: unknown." for label, v in known if v is None)))
    if shown:
        out.append(chart([{"type": "bar", "orientation": "h", "name": "share of the wait",
                           "y": [label for label, _ in shown], "x": [v for _, v in shown],
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
                           "x": [t for t, _ in pts], "y": [v for _, v in pts],
                           "hovertemplate": "%{x:.2f} s: %{y:.3f}<extra></extra>"}],
                         name, height=240, xaxis={"title": {"text": "s from the first step"}}))
    return out


RANK_PARTS = (("data_wait_s", "data_wait"), ("h2d_copy_s", "h2d_copy"),
              ("forward_s", "forward"), ("backward_s", "backward"),
              ("optimizer_s", "optimizer"), ("comm_s", "comm"))


def ranks_blocks(ranks: dict[str, Any], findings: list[dict[str, Any]]) -> list[Block]:
    entries = ranks["ranks"]
    labels = [f"rank {e['rank']}" for e in entries]
    data: list[dict[str, Any]] = []
    for key, ph in RANK_PARTS:
        vals = [e.get(key) for e in entries]
        if all(v is None for v in vals):
            continue
        data.append({"type": "bar", "name": ph, "x": labels,
                     "y": [None if v is None else v * 1e3 for v in vals],
                     "marker": {"color": PHASE_COLOURS[ph]},
                     "hovertemplate": f"%{{x}}: {ph} %{{y:.3f}} ms per step<extra></extra>"})
    data.append({"type": "scatter", "mode": "markers", "name": "step time", "x": labels,
                 "y": [None if e.get("step_time_mean_s") is None else e["step_time_mean_s"] * 1e3
                       for e in entries], "marker": {"symbol": "diamond", "size": 11,
                                                     "color": "#000"},
                 "hovertemplate": "%{x}: step %{y:.3f} ms<extra></extra>"})
    out = [h2(f"Ranks ({ranks['world_size']} processes)"),
           chart(data, "Per rank: mean ms per measured step by phase", height=400,
                 barmode="stack", yaxis={"title": {"text": "ms per step"}})]
    waits = [(e.get("comm_wait_s"), e.get("caused_wait_s")) for e in entries]
    if any(a is not None or b is not None for a, b in waits):
        out.append(chart([
            {"type": "bar", "name": "waited for late peers", "x": labels,
             "y": [None if a is None else a * 1e3 for a, _ in waits],
             "hovertemplate": "%{x} waited %{y:.3f} ms per step<extra></extra>"},
            {"type": "bar", "name": "made the others wait", "x": labels,
             "y": [None if b is None else b * 1e3 for _, b in waits],
             "hovertemplate": "%{x} made the others wait %{y:.3f} ms per step<extra></extra>"}],
            "Waiting at collectives (per step)", height=320, barmode="group",
            yaxis={"title": {"text": "ms per step"}}))
    out.append(table(
        ["rank", "host", "status", "steps", "step time", "throughput", "last arrivals",
         "lateness", "compute vs fastest", "compute vs own best"],
        [[str(e["rank"]), e["host"], e["status"], str(e["steps_measured"]),
          ms(e.get("step_time_mean_s")), fmt(e.get("throughput_samples_per_s"), "samples/s", 1, 1),
          f"{e['last_arrivals']} of {e['collectives']}", ms(e.get("lateness_s")),
          fmt(e.get("score_vs_fastest"), "", 1, 3), fmt(e.get("score_vs_own_best"), "", 1, 3)]
         for e in entries]))
    merged = ranks.get("merged") or {}
    out.append(table(["metric", "median over ranks", "largest on", "spread (largest − smallest)"],
                     [[k, ms(v.get("median")), "unknown" if v.get("slowest_rank") is None
                       else f"rank {v['slowest_rank']}", ms(v.get("spread"))]
                      for k, v in merged.items()]))
    straggle = [f for f in findings if f.get("id") == "straggler"]
    for f in straggle:
        out.append(p(f"Straggler: {f['title']}. Evidence: "
                     + ", ".join(f"{k}={v}" for k, v in f["evidence"].items())))
    if ranks.get("missing"):
        out.append(p(f"Ranks whose report did not arrive: {ranks['missing']}."))
    out.append(p(f"Arrival times: {ranks.get('arrivals_source')}"))
    return out


def report_blocks(doc: dict[str, Any]) -> list[Block]:
    """A doctor/demo/watch report (schema ``redline.report/*``)."""
    m = doc["measurements"]
    t = m["timing"]
    dev = m["device"]
    mfu = m.get("mfu") or {}
    cmd = " ".join(doc.get("command") or []) or "redline.watch"
    out = [h2(f"Run: {cmd}"),
           p(f"status {doc['status'].replace('_', ' ')}"
             + (f" ({doc['status_detail']})" if doc.get("status_detail") else "")
             + f" · device {dev['name']} ({dev['type']}) · metric tier {m['tier']['tier']} · "
             f"redline {doc['redline_version']}, torch {doc['torch_version']} · "
             f"{doc['created_utc']}"),
           table(["steps measured", "warm-up", "excluded", "step time (mean)", "p50", "p95",
                  "throughput", "MFU"],
                 [[str(t["steps_measured"]), str(t["steps_warmup"]), str(t["steps_excluded"]),
                   ms(t.get("step_time_mean_s")), ms(t.get("step_time_p50_s")),
                   ms(t.get("step_time_p95_s")),
                   fmt(t.get("throughput_samples_per_s"), "samples/s", 1, 1),
                   pct(mfu.get("mfu")) if mfu.get("mfu") is not None
                   else f"unknown ({mfu.get('reason')})"]])]
    findings = doc.get("findings") or []
    tl = doc.get("timeline")
    if not t["steps_total"]:
        out.append(p("No step was measured, so there is nothing to chart or diagnose; the "
                     "status above says what was seen."))
    else:
        out += findings_blocks(findings, "ranked by ceiling")
        if tl:
            out += step_timeline(tl)
        out += breakdown_blocks(m)
        out += data_wait_blocks(findings, m)
        if tl:
            out += counters_blocks(tl)
    if doc.get("ranks"):
        out += ranks_blocks(doc["ranks"], findings)
    tr = doc.get("trace")
    if tr:
        out += [h2("Profiler trace"),
                p(f"{tr['steps']} steps, {tr['device_events']} device events: GPU idle "
                  f"{fmt(tr.get('idle_pct'), '%', 1, 1)}, compute "
                  f"{fmt(tr.get('compute_pct'), '%', 1, 1)}, non-compute "
                  f"{fmt(tr.get('non_compute_pct'), '%', 1, 1)} of the kernel window"
                  + (f" — {tr['note']}" if tr.get("note") else "")
                  + (f" — {tr['path']} (open in Perfetto)" if tr.get("path") else ""))]
    missing = m["tier"].get("missing") or []
    notes = m.get("notes") or []
    if missing or notes:
        out.append(h2("Not measured, and notes"))
        out += [p(f"not measured: {x['metric']} — {x['reason']}") for x in missing]
        out += [p(f"note: {n}") for n in notes]
    return out
