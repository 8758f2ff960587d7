"""The HTML report's blocks for a tuning result (``redline tune --json``'s document)."""

from __future__ import annotations

from typing import Any

from redline.report.html_charts import Block, chart, fmt, h2, ms, p, pct, table

KEPT, NOT_KEPT = "#2ca02c", "#bbbbbb"


def _mib(b: int | None) -> str:
    return fmt(b, "MiB", 2.0 ** -20)


def _gain(d: dict[str, Any]) -> str:
    after_per_s, before_per_s = d.get("samples_per_s_after"), d.get("samples_per_s_before")
    return f"{after_per_s / before_per_s:.3f}×" if after_per_s and before_per_s else "not measured"


def path_blocks(decisions: list[dict[str, Any]]) -> list[Block]:
    """Every step of the path in order: what was tried, kept or not, and the measured gain."""
    labels = [f"{i + 1}. {decision['step']}" for i, decision in enumerate(decisions)]
    measured = [(lab, decision) for lab, decision in zip(labels, decisions, strict=True)
                if decision.get("samples_per_s_before") is not None
                or decision.get("samples_per_s_after") is not None]
    out = [h2("The tuning path, in order")]
    if measured:
        kept = ["kept" if decision["kept"] else "not kept" for _, decision in measured]
        out.append(chart(
            [{"type": "bar", "name": "current setup", "x": [lab for lab, _ in measured],
              "y": [decision.get("samples_per_s_before") for _, decision in measured],
              "marker": {"color": "#7f7f7f"},
              "hovertemplate": "%{x}: current %{y:,.1f} samples/s<extra></extra>"},
             {"type": "bar", "name": "with the change", "x": [lab for lab, _ in measured],
              "y": [decision.get("samples_per_s_after") for _, decision in measured],
              "marker": {"color": [KEPT if decision["kept"] else NOT_KEPT for _, decision in measured]},
              "customdata": kept,
              "hovertemplate": "%{x}: %{y:,.1f} samples/s (%{customdata})<extra></extra>"}],
            "Each trial side by side: current setup vs the change (green: kept)",
            height=420, barmode="group", yaxis={"title": {"text": "samples/s"}},
            xaxis={"tickangle": -30}, margin={"l": 70, "r": 20, "t": 50, "b": 140}))
    out.append(table(["#", "step", "kept", "samples/s before", "samples/s after", "gain",
                      "measured", "why"],
                     [[str(i + 1), decision["step"], "kept" if decision["kept"] else "not kept",
                       fmt(decision.get("samples_per_s_before"), "", 1, 1),
                       fmt(decision.get("samples_per_s_after"), "", 1, 1), _gain(decision),
                       decision.get("measured") or "not measured", decision.get("reason", "")]
                      for i, decision in enumerate(decisions)]))
    return out


ROWS = (("throughput_samples_per_s", "throughput", lambda v: fmt(v, "samples/s", 1, 1)),
        ("step_time_s", "step time (median)", ms),
        ("data_wait_fraction", "data wait", pct),
        ("device_busy_fraction", "device busy", pct),
        ("mfu", "MFU", pct),
        ("peak_memory_bytes", "peak memory", _mib),
        ("energy_j_per_step", "energy per step", lambda v: fmt(v, "J", 1, 3)))


def before_after_blocks(doc: dict[str, Any]) -> list[Block]:
    before, after = doc["before"], doc["after"]
    before_projection, after_projection = doc["before_projection"], doc["after_projection"]
    price = doc.get("price_per_device_hour")
    rows = [[label, formatter(before.get(key)), formatter(after.get(key))]
            for key, label, formatter in ROWS]
    rows += [[f"job time ({before_projection['run_steps']:,} steps)",
              fmt(before_projection.get("job_time_s"), "s", 1, 1),
              fmt(after_projection.get("job_time_s"), "s", 1, 1)],
             ["cost" + ("" if price is None else f" (at {price:g} per device-hour)"),
              "unknown (no price given)" if price is None else fmt(before_projection.get("cost"), "", 1, 2),
              "unknown (no price given)" if price is None else fmt(after_projection.get("cost"), "", 1, 2)],
             ["energy", fmt(before_projection.get("energy_kwh"), "kWh", 1, 4),
              fmt(after_projection.get("energy_kwh"), "kWh", 1, 4)]]
    speedup = doc.get("speedup")
    out = [h2("Before and after"),
           p(("unknown speed-up" if speedup is None else f"{speedup:.2f}× the throughput")
             + f"; the job's length from {doc.get('run_steps_source')}; energy: "
             f"{after.get('energy_source')}; memory: {after.get('peak_memory_source')}."),
           table(["", "before", "after"], rows)]
    times = [(lab, side_doc.get("step_times_s") or [])
             for lab, side_doc in (("before", before), ("after", after))]
    if any(step_times for _, step_times in times):
        out.append(chart([{"type": "box", "name": lab, "y": [step_s * 1e3 for step_s in step_times],
                           "boxpoints": "all", "jitter": 0.4,
                           "hovertemplate": f"{lab}: %{{y:.3f}} ms<extra></extra>"}
                          for lab, step_times in times],
                         "Measured step times, before and after (ms per optimizer step)",
                         height=360, yaxis={"title": {"text": "ms"}}, showlegend=False))
    return out


def batch_blocks(bs: dict[str, Any]) -> list[Block]:
    probes = bs.get("probes") or []
    out = [h2("Batch size search"),
           p(f"{bs.get('reason')}; {bs.get('trials')} trials, {bs.get('ooms')} out of memory; "
             f"memory: {bs.get('overhead_source')}.")]
    if probes:
        fitting = [probe for probe in probes if not probe.get("oom")]
        oom = [probe for probe in probes if probe.get("oom")]
        data: list[dict[str, Any]] = [{
            "type": "scatter", "mode": "markers", "name": "fits", "x": [probe["batch"] for probe in fitting],
            "y": [probe["peak_bytes"] / 2 ** 20 for probe in fitting],
            "marker": {"color": KEPT, "size": 10},
            "hovertemplate": "batch %{x}: peak %{y:,.2f} MiB<extra></extra>"}]
        if oom and bs.get("usable_bytes") is not None:
            data.append({"type": "scatter", "mode": "markers",
                         "name": "out of memory (drawn at the usable memory)",
                         "x": [probe["batch"] for probe in oom],
                         "y": [bs["usable_bytes"] / 2 ** 20 for _ in oom],
                         "marker": {"color": "#d62728", "symbol": "x", "size": 12},
                         "hovertemplate": "batch %{x}: out of memory<extra></extra>"})
        shapes = [] if bs.get("usable_bytes") is None else [{
            "type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y",
            "y0": bs["usable_bytes"] / 2 ** 20, "y1": bs["usable_bytes"] / 2 ** 20,
            "line": {"dash": "dot", "color": "#d62728"}}]
        out.append(chart(data, "Probes: peak memory by micro-batch", height=340,
                         xaxis={"title": {"text": "micro-batch"}, "type": "log"},
                         yaxis={"title": {"text": "MiB"}}, shapes=shapes))
    return out


def tune_blocks(doc: dict[str, Any]) -> list[Block]:
    plan = doc["plan"]
    out = before_after_blocks(doc)
    # what the plan changed beyond speed (a larger effective batch): said before the trials
    out += [p(f"Note: {note}") for note in plan.get("notes") or []]
    out += path_blocks(plan.get("decisions") or [])
    if doc.get("batch_search"):
        out += batch_blocks(doc["batch_search"])
    for numeric in doc.get("numerics") or []:
        out.append(p(f"numerics, {numeric['precision']}: {numeric['reason']}"))
    limits = doc.get("limits") or []
    if limits:
        out.append(h2("What still limits the tuned step"))
        out.append(table(["limit", "share of the step", "evidence", "next step"],
                         [[limit["id"], pct(limit.get("step_fraction")), limit["evidence"],
                           limit["next_step"]] for limit in limits]))
    return out
