"""The HTML report's blocks for a comparison (``redline compare --json``'s document): the
verdict first, then the phases side by side, what differs, findings, metrics, and the kernels
and operators with the largest change."""

from __future__ import annotations

from typing import Any

from redline.compare.stats import t_quantile
from redline.report.html_charts import Block, chart, fmt, h2, p, table

TOP_OPS = 15
"""Kernels and operators drawn on the change chart (the tables list 40, the JSON all)."""
TABLE_OPS = 40
NAME_CHARS = 90
"""Kernel and operator names are cut to this in the tables (C++ signatures run to hundreds of
characters); the chart's hover and the JSON keep them whole."""
CHANGE_COLOURS = {"added": "#d62728", "slower": "#ff7f0e", "faster": "#2ca02c",
                  "removed": "#1f77b4"}


def _pct(v: float | None) -> str:
    return "" if v is None else f"{v:+.1f}%"


def _cut(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[:NAME_CHARS - 1] + "…"


def _share(v: float | None) -> str:
    return "—" if v is None else f"{v:.0%}"


def _test_chart(test: dict[str, Any]) -> Block:
    """The two means the verdict tested, each with its own 95 % interval (t × its standard
    error), in ms per step or per sample."""
    sides = []
    for side in ("before", "after"):
        std, sample_count = test.get(f"{side}_std_s"), test[f"{side}_n"]
        half = (None if std is None or sample_count < 2
                else t_quantile(0.975, sample_count - 1) * std / sample_count ** 0.5 * 1e3)
        sides.append((side, test[f"{side}_mean_s"] * 1e3, half))
    per = "sample" if test["metric"] == "time_per_sample" else "step"
    return chart([{"type": "bar", "x": [side_bar[0] for side_bar in sides],
                   "y": [side_bar[1] for side_bar in sides],
                   "error_y": {"type": "data", "array": [side_bar[2] or 0.0 for side_bar in sides],
                               "visible": True},
                   "hovertemplate": f"%{{x}}: %{{y:,.3f}} ms per {per}<extra></extra>"}],
                 f"Tested time, ms per {per} (95 % interval of each mean)", height=300,
                 yaxis={"title": {"text": "ms"}, "rangemode": "tozero"})


def compare_blocks(doc: dict[str, Any]) -> list[Block]:
    verdict = doc["verdict"]
    out = [h2(f"Verdict: {verdict['verdict']}"), p(verdict["reason"])]
    rows = [["step time (ms)", fmt(verdict.get("step_time_before_ms")),
             fmt(verdict.get("step_time_after_ms")),
             "" if verdict.get("step_time_delta_ms") is None
             else f"{verdict['step_time_delta_ms']:+,.2f} ({_pct(verdict.get('step_time_delta_pct'))})"],
            ["throughput (samples/s)", fmt(verdict.get("throughput_before_samples_per_s")),
             fmt(verdict.get("throughput_after_samples_per_s")), _pct(verdict.get("throughput_delta_pct"))]]
    out.append(table(["", "before", "after", "Δ"], rows))
    test = verdict.get("test")
    if test is not None:
        out.append(_test_chart(test))
        out.append(p(f"Test: {test['method_detail']}. 95 % interval of the difference: "
                     f"{test['ci_low_s'] * 1e3:+,.3f} to {test['ci_high_s'] * 1e3:+,.3f} ms "
                     f"({'per sample' if test['metric'] == 'time_per_sample' else 'per step'});"
                     f" p = {test['p_value']:.2g}; minimum effect "
                     f"{verdict['min_effect_fraction']:.0%}."))
    out.append(p(f"Before: {doc['before_source']}. After: {doc['after_source']}."))
    diffs = doc.get("differences") or []
    if diffs:
        out.append(h2("The runs differ in"))
        out.append(table(["field", "before", "after", "what it means here"],
                         [[diff["field"], str(diff["before"]), str(diff["after"]), diff["consequence"]]
                          for diff in diffs]))
    phases = doc.get("phases") or []
    if phases:
        out.append(chart(
            [{"type": "bar", "name": side, "x": [phase["phase"] for phase in phases],
              "y": [phase.get(f"{side}_ms") for phase in phases],
              "hovertemplate": f"{side}: %{{x}} %{{y:,.2f}} ms<extra></extra>"}
             for side in ("before", "after")],
            "Phases, mean ms per step", barmode="group", yaxis={"title": {"text": "ms"}}))
        out.append(table(["phase", "before ms", "after ms", "Δ ms", "share before",
                          "share after"],
                         [[phase["phase"], fmt(phase.get("before_ms")), fmt(phase.get("after_ms")),
                           "" if phase.get("delta_ms") is None else f"{phase['delta_ms']:+,.2f}",
                           _share(phase.get("before_fraction")), _share(phase.get("after_fraction"))]
                          for phase in phases]))
        out.append(chart(
            [{"type": "bar", "name": phase["phase"], "x": ["before", "after"],
              "y": [None if phase.get(f"{side}_fraction") is None else phase[f"{side}_fraction"] * 100
                    for side in ("before", "after")],
              "hovertemplate": f"{phase['phase']}: %{{y:.1f}}% of the step<extra></extra>"}
             for phase in phases],
            "Share of the step by phase (%)", barmode="stack",
            yaxis={"title": {"text": "% of the step"}}))
    pct = [metric for metric in doc.get("metrics") or [] if metric["name"].endswith("_pct")]
    if pct:
        out.append(chart(
            [{"type": "bar", "name": side, "x": [metric["name"] for metric in pct],
              "y": [metric.get(side) for metric in pct],
              "hovertemplate": f"{side}: %{{x}} %{{y:.1f}}%<extra></extra>"}
             for side in ("before", "after")],
            "Where device time goes (first rank, % of the kernel window)", barmode="group",
            yaxis={"title": {"text": "%"}, "range": [0, 100]}))
    findings = doc.get("findings") or []
    if findings:
        out.append(h2("Findings that appeared, vanished or changed"))
        out.append(table(["finding", "change", "severity", "ceiling", "title"],
                         [[finding["id"], finding["change"],
                           f"{finding.get('before_severity') or '—'} → "
                           f"{finding.get('after_severity') or '—'}",
                           " → ".join("—" if speedup is None else f"{speedup:.2f}×" for speedup in
                                      (finding.get("before_ceiling_speedup"),
                                       finding.get("after_ceiling_speedup"))), finding.get("title", "")]
                          for finding in findings]))
    metrics = doc.get("metrics") or []
    if metrics:
        out.append(h2("Metrics that changed"))
        out.append(table(["metric", "before", "after", "Δ"],
                         [[metric["name"], fmt(metric.get("before"), digits=4),
                           fmt(metric.get("after"), digits=4),
                           "" if metric.get("delta_fraction") is None
                           else f"{metric['delta_fraction']:+.0%}"] for metric in metrics]))
    unit = "per step" if doc.get("per") == "step" else "per trace window"
    for title, ops in (("Kernels", doc.get("kernels") or []),
                       ("Operators", doc.get("operators") or [])):
        changed = [op for op in ops if op["change"] != "unchanged"]
        if not ops:
            continue
        out.append(h2(f"{title}: {len(changed)} of {len(ops)} changed (µs {unit})"))
        if not changed:
            continue
        top = changed[:TOP_OPS]
        out.append(p("Bars: red added, orange slower, green faster, blue removed (after − "
                     "before; hover for the whole name)."))
        out.append(chart([{"type": "bar", "orientation": "h",
                           "y": [f"{i + 1}. {op['name'][:60]}" for i, op in enumerate(top)],
                           "x": [op["delta_us"] for op in top],
                           "marker": {"color": [CHANGE_COLOURS.get(op["change"], "#7f7f7f")
                                                for op in top]},
                           "customdata": [[op["name"], op["change"]] for op in top],
                           "hovertemplate": "%{customdata[0]}<br>%{customdata[1]}, "
                           "%{x:+,.1f} µs<extra></extra>"}],
                         f"{title}: largest changes (Δ µs {unit})", height=140 + 28 * len(top),
                         yaxis={"autorange": "reversed", "automargin": True},
                         xaxis={"title": {"text": "Δ µs"}}))
        out.append(table(["name", "change", "count", "before µs", "after µs", "Δ µs", "share"],
                         [[_cut(op["name"]), op["change"],
                           f"{op['before_count']:,.4g} → {op['after_count']:,.4g}",
                           f"{op['before_us']:,.1f}", f"{op['after_us']:,.1f}",
                           f"{op['delta_us']:+,.1f}",
                           f"{_share(op.get('before_share'))} → {_share(op.get('after_share'))}"]
                          for op in changed[:TABLE_OPS]]))
    for note in doc.get("notes") or []:
        out.append(p(f"note: {note}"))
    return out
