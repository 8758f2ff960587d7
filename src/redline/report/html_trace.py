"""The HTML report's blocks for a trace analysis (``redline trace --json``'s document)."""

from __future__ import annotations

from typing import Any

from redline.report.html_charts import Block, chart, findings_blocks, fmt, h2, p, table

TOP_KERNELS = 10
"""Kernels shown per rank on the top-kernels chart (the table in the JSON keeps more)."""

TEMPORAL = (("idle_pct", "idle", "#d62728"), ("compute_pct", "compute", "#2ca02c"),
            ("non_compute_pct", "non-compute (memory, communication)", "#1f77b4"))
IDLE = (("host_wait", "waiting for the host (launches)", "#ff7f0e"),
        ("kernel_wait", "between kernels", "#9467bd"), ("other", "other", "#c7c7c7"))


def _short(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else name[:limit - 1] + "…"


def trace_blocks(doc: dict[str, Any]) -> list[Block]:
    ranks = doc["ranks"]
    labels = [f"rank {rank_entry['rank']}" for rank_entry in ranks]
    out = [h2(f"Trace: {len(ranks)} rank(s)"),
           p("Where GPU time goes, per rank, over the window from the first to the last device "
             "event (Holistic Trace Analysis's temporal breakdown)"
             + (", timestamps rounded as HTA does" if doc.get("hta_compat") else "") + ".")]
    out += findings_blocks(doc.get("findings") or [], "from the trace")
    temporal = [rank_entry.get("temporal") or {} for rank_entry in ranks]
    out.append(chart(
        [{"type": "bar", "name": label, "x": labels,
          "y": [temporal_entry.get(key) for temporal_entry in temporal],
          "marker": {"color": colour},
          "hovertemplate": f"%{{x}}: {label} %{{y:.1f}}% of the window<extra></extra>"}
         for key, label, colour in TEMPORAL],
        "Temporal breakdown (% of the kernel window)", barmode="stack",
        yaxis={"title": {"text": "% of the window"}, "range": [0, 100]}))
    idle = [rank_entry.get("idle_sum_over_streams") or {} for rank_entry in ranks]
    out.append(chart(
        [{"type": "bar", "name": label, "x": labels,
          "y": [None if i.get(key) is None else i[key] / 1e3 for i in idle],
          "marker": {"color": colour},
          "hovertemplate": f"%{{x}}: {label} %{{y:,.2f}} ms<extra></extra>"}
         for key, label, colour in IDLE],
        "Idle time by cause, summed over streams (ms)", barmode="stack",
        yaxis={"title": {"text": "ms"}}))
    out.append(table(["rank", "device", "window", "idle", "compute", "non-compute",
                      "communication overlapped by compute"],
                     [[str(rank_entry["rank"]), str(rank_entry.get("device_name") or "unknown"),
                       fmt(temporal_entry.get("window_us"), "ms", 1e-3, 1),
                       fmt(temporal_entry.get("idle_pct"), "%", 1, 1),
                       fmt(temporal_entry.get("compute_pct"), "%", 1, 1),
                       fmt(temporal_entry.get("non_compute_pct"), "%", 1, 1),
                       "no communication" if rank_entry.get("comm_comp_overlap_pct") is None
                       else fmt(rank_entry["comm_comp_overlap_pct"], "%", 1, 1)]
                      for rank_entry, temporal_entry in zip(ranks, temporal, strict=True)]))
    types = list(dict.fromkeys(k for rank_entry in ranks for k in (rank_entry.get("kernel_types_us") or {})))
    if types:
        out.append(chart([{"type": "bar", "orientation": "h", "name": label, "y": types,
                           "x": [None if (v := (rank_entry.get("kernel_types_us") or {}).get(k)) is None
                                 else v / 1e3 for k in types],
                           "hovertemplate": f"{label}: %{{y}} %{{x:,.2f}} ms<extra></extra>"}
                          for rank_entry, label in zip(ranks, labels, strict=True)],
                         "Kernel time by type, per rank (ms)",
                         height=140 + 24 * len(types) * max(1, min(len(ranks), 4)),
                         barmode="group", yaxis={"autorange": "reversed", "automargin": True},
                         xaxis={"title": {"text": "ms"}}))
    for rank_entry, label in zip(ranks, labels, strict=True):
        top = (rank_entry.get("top_kernels") or [])[:TOP_KERNELS]
        if not top:
            continue
        out.append(chart([{"type": "bar", "orientation": "h", "name": "total",
                           "y": [f"{i + 1}. {_short(k['name'])}" for i, k in enumerate(top)],
                           "x": [k["total_us"] / 1e3 for k in top],
                           "customdata": [[k["name"], k["count"], k["mean_us"],
                                           k.get("share_of_busy")] for k in top],
                           "hovertemplate": "%{customdata[0]}<br>%{x:,.3f} ms in "
                           "%{customdata[1]} launches, mean %{customdata[2]:,.1f} µs, "
                           "%{customdata[3]:.1%} of busy time<extra></extra>"}],
                         f"Top kernels, {label} (total ms)", height=140 + 32 * len(top),
                         yaxis={"autorange": "reversed", "automargin": True},
                         xaxis={"title": {"text": "ms"}}))
    stragglers = doc.get("stragglers") or []
    if stragglers:
        out.append(h2("Arrivals at collectives"))
        out.append(p(f"Source: {doc.get('stragglers_source')}."))
        out.append(table(["rank", "collectives", "arrived last", "mean lateness"],
                         [[str(straggler["rank"]), str(straggler["collectives"]),
                           str(straggler["last_arrivals"]),
                           fmt(straggler.get("mean_lateness_us"), "ms", 1e-3, 3)]
                          for straggler in stragglers]))
    for warning in doc.get("warnings") or []:
        out.append(p(f"warning: {warning}"))
    return out
