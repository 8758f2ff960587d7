"""Terminal and JSON output of a trace analysis (presentation only). The terminal tables are
plain text (:mod:`redline.report.text_table`): this command loads no rich."""

from __future__ import annotations

import dataclasses

from redline.core.findings import Finding
from redline.core.record import as_dict
from redline.report.json_io import clean
from redline.report.text_table import Cell, Column, Output
from redline.trace.analyze import RankAnalysis, TraceAnalysis

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from typing import Any, TextIO

TRACE_SCHEMA = "redline.trace/1"


def to_dict(analysis: TraceAnalysis, findings: list[Finding]) -> dict[str, Any]:
    """JSON form; times in µs (the trace's unit), fractions 0..1, percentages 0..100."""
    doc = as_dict(analysis)
    doc["findings"] = [dataclasses.asdict(finding) for finding in findings]
    for rank, rank_doc in zip(analysis.ranks, doc["ranks"], strict=True):
        rank_doc["idle_sum_over_streams"] = rank.idle_sum_over_streams
        rank_doc["idle_by_stream"] = {str(k): value for k, value in rank.idle_by_stream.items()}
        temporal = rank.temporal
        if temporal is not None:
            rank_doc["temporal"].update(idle_pct=temporal.pct(temporal.idle_us),
                                        compute_pct=temporal.pct(temporal.compute_us),
                                        non_compute_pct=temporal.pct(temporal.non_compute_us))
    doc["kernel_types_us"] = analysis.kernel_types_us
    out: dict[str, Any] = clean({"schema": TRACE_SCHEMA, **doc})  # NaN/inf are not JSON
    return out


SEVERITY_STYLES = {"high": "bold red", "medium": "yellow", "low": "cyan"}
"""A finding's id and severity, styled by severity (the step report's colours)."""


def render(analysis: TraceAnalysis, findings: list[Finding],
           stream: TextIO | None = None) -> None:
    """Print the analysis and its findings to ``stream`` (default stdout)."""
    out = Output(stream)
    mode = "HTA-compatible rounding" if analysis.hta_compat else "exact times"
    out.rule(f"redline trace · {len(analysis.ranks)} rank(s) · {mode}")
    columns = [Column(header=header, right=header != "device") for header in (
        "rank", "device", "window ms", "idle", "compute", "non-compute", "idle: host wait",
        "kernel wait", "other", "comm overlapped")]
    rows: list[list[str | Cell]] = []
    for rank in analysis.ranks:
        temporal = rank.temporal
        if temporal is None:
            rows.append([str(rank.rank), str(rank.device_name or "none seen"), "no GPU events",
                         *[""] * 7])
            continue
        idle = rank.idle_sum_over_streams
        idle_us = sum(idle.values()) or 1.0
        overlap = rank.comm_comp_overlap_pct
        rows.append([str(rank.rank), str(rank.device_name or "unknown"),
                     f"{temporal.window_us / 1e3:,.1f}", f"{temporal.pct(temporal.idle_us):.1f}%",
                     f"{temporal.pct(temporal.compute_us):.1f}%",
                     f"{temporal.pct(temporal.non_compute_us):.1f}%",
                     f"{idle['host_wait'] / idle_us:.0%}", f"{idle['kernel_wait'] / idle_us:.0%}",
                     f"{idle['other'] / idle_us:.0%}",
                     "no comm" if overlap is None else f"{overlap:.1f}%"])
    out.table("Where GPU time goes, per rank (window = first to last device event)", columns,
              rows)
    types_us = analysis.kernel_types_us
    types_total_us = sum(types_us.values()) or 1.0
    if types_us:
        out.table("Kernel types (all ranks)",
                  [Column(header="type", wrap=True), Column(header="ms", right=True),
                   Column(header="share", right=True)],
                  [[name, f"{duration_us / 1e3:,.2f}", f"{duration_us / types_total_us:.1%}"]
                   for name, duration_us in sorted(types_us.items(), key=lambda x: -x[1])])
    else:
        out.line("Kernel types: none (the trace holds no device kernels)")
    first = next((rank_entry for rank_entry in analysis.ranks if rank_entry.temporal is not None), None)
    if first is not None:
        _render_rank_details(out, first)
    for straggler in analysis.stragglers:
        out.line(f"rank {straggler.rank}: last at "
                 f"{straggler.last_arrivals}/{straggler.collectives} collectives, "
                 f"{straggler.mean_lateness_us:.0f} µs late on average")
    if findings:
        _render_findings(out, findings)
    else:
        out.line(out.style("No finding", "green") + " from this trace.")
    for warning in analysis.warnings:
        out.line(out.style("warning:", "yellow") + " " + warning)


def _render_rank_details(out: Output, rank: RankAnalysis) -> None:
    """The first rank's top kernels, launches, copies and host syncs."""
    out.table(f"Top kernels, rank {rank.rank}",
              [Column(header="kernel", wrap=True), *[Column(header=header, right=True) for header in (
                  "count", "total ms", "mean µs", "of busy")]],
              [[kernel_share.name[:70], str(kernel_share.count),
                f"{kernel_share.total_us / 1e3:,.2f}", f"{kernel_share.mean_us:,.1f}",
                f"{kernel_share.share_of_busy:.1%}"] for kernel_share in rank.top_kernels])
    launches = rank.launches
    if launches is not None and launches.launches:
        out.line(f"launches (rank {rank.rank}): {launches.launches}; median CPU launch "
                 f"{launches.cpu_launch_us_median:.1f} µs, kernel "
                 f"{launches.gpu_kernel_us_median:.1f} µs, launch delay "
                 f"{launches.launch_delay_us_median:.1f} µs; {launches.short_kernels} kernels "
                 f"shorter than their launch; outliers: {launches.runtime_outliers} slow "
                 f"launches (> 50 µs), {launches.delay_outliers} long delays (> 100 µs)")
    for copy in rank.copies:
        speed = "unknown" if copy.gb_per_s is None else f"{copy.gb_per_s:.1f} GB/s"
        out.line(f"{copy.kind}: {copy.count} × {copy.total_us / max(1, copy.count):.1f} µs, "
                 f"{speed}" + (f", {copy.pageable} pageable" if copy.pageable else ""))
    for sync in rank.syncs:
        out.line(f"host sync {sync.name}: {sync.count}×, host blocked "
                 f"{sync.host_blocked_us / 1e3:.2f} ms, GPU idle after "
                 f"{sync.device_idle_after_us / 1e3:.2f} ms")


def _render_findings(out: Output, findings: list[Finding]) -> None:
    """The ranked findings, as the step report's table shows them."""
    rows: list[list[str | Cell]] = []
    for number, finding in enumerate(findings, 1):
        ceiling = ("unknown" if finding.ceiling_speedup is None
                   else f"≤ {finding.ceiling_speedup:.2f}×")
        evidence = ", ".join(f"{k}={value}" for k, value in finding.evidence.items() if value is not None)
        who = "" if finding.rank is None else f"\nrank {finding.rank}"
        rows.append([str(number),
                     Cell(text=f"{finding.id}\n{finding.severity}{who}",
                          styles=(SEVERITY_STYLES.get(finding.severity, ""),)),
                     ceiling,
                     Cell(text=f"{finding.title}\nfix: {finding.fix}\nevidence: {evidence}",
                          styles=("bold", "", "dim"))])
    out.table("Findings, largest possible gain first",
              [Column(header="#", right=True), Column(header="finding"),
               Column(header="ceiling", right=True),
               Column(header="what and how to fix", wrap=True)], rows, lines_between=True)
