"""Terminal and JSON output of a trace analysis (presentation only)."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from redline.core.findings import Finding
from redline.report.json_io import clean
from redline.report.terminal import render_findings
from redline.trace.analyze import TraceAnalysis

TRACE_SCHEMA = "redline.trace/1"


def to_dict(a: TraceAnalysis, findings: list[Finding]) -> dict[str, Any]:
    """JSON form; times in µs (the trace's unit), fractions 0..1, percentages 0..100."""
    d = dataclasses.asdict(a)
    d["findings"] = [dataclasses.asdict(f) for f in findings]
    for r, rd in zip(a.ranks, d["ranks"], strict=True):
        rd["idle_sum_over_streams"] = r.idle_sum_over_streams
        rd["idle_by_stream"] = {str(k): v for k, v in r.idle_by_stream.items()}
        t = r.temporal
        if t is not None:
            rd["temporal"].update(idle_pct=t.pct(t.idle_us), compute_pct=t.pct(t.compute_us),
                                  non_compute_pct=t.pct(t.non_compute_us))
    d["kernel_types_us"] = a.kernel_types_us
    out: dict[str, Any] = clean({"schema": TRACE_SCHEMA, **d})  # NaN/inf are not JSON
    return out


def render(a: TraceAnalysis, findings: list[Finding], console: Console) -> None:
    mode = "HTA-compatible rounding" if a.hta_compat else "exact times"
    console.rule(f"[bold]redline trace[/bold] · {len(a.ranks)} rank(s) · {mode}")
    t = Table(title="Where GPU time goes, per rank (window = first to last device event)",
              title_justify="left")
    for col in ("rank", "device", "window ms", "idle", "compute", "non-compute", "idle: host wait",
                "kernel wait", "other", "comm overlapped"):
        t.add_column(col, justify="left" if col == "device" else "right")
    for r in a.ranks:
        tb = r.temporal
        if tb is None:
            t.add_row(str(r.rank), Text(str(r.device_name)), "no GPU events", *[""] * 7)
            continue
        idle = r.idle_sum_over_streams
        s = sum(idle.values()) or 1.0
        ov = r.comm_comp_overlap_pct
        t.add_row(str(r.rank), Text(str(r.device_name or "unknown")), f"{tb.window_us / 1e3:,.1f}",
                  f"{tb.pct(tb.idle_us):.1f}%", f"{tb.pct(tb.compute_us):.1f}%",
                  f"{tb.pct(tb.non_compute_us):.1f}%", f"{idle['host_wait'] / s:.0%}",
                  f"{idle['kernel_wait'] / s:.0%}", f"{idle['other'] / s:.0%}",
                  "no comm" if ov is None else f"{ov:.1f}%")
    console.print(t)
    kt = a.kernel_types_us
    total = sum(kt.values()) or 1.0
    k = Table(title="Kernel types (all ranks)", title_justify="left")
    k.add_column("type")
    k.add_column("ms", justify="right")
    k.add_column("share", justify="right")
    for name, us in sorted(kt.items(), key=lambda x: -x[1]):
        k.add_row(Text(name), f"{us / 1e3:,.2f}", f"{us / total:.1%}")
    console.print(k)
    first = next((r for r in a.ranks if r.temporal is not None), None)
    if first is not None:
        top = Table(title=f"Top kernels, rank {first.rank}", title_justify="left")
        for col in ("kernel", "count", "total ms", "mean µs", "of busy"):
            top.add_column(col, justify="left" if col == "kernel" else "right")
        for ks in first.top_kernels:
            top.add_row(Text(ks.name[:70]), str(ks.count), f"{ks.total_us / 1e3:,.2f}",
                        f"{ks.mean_us:,.1f}", f"{ks.share_of_busy:.1%}")
        console.print(top)
        ls = first.launches
        if ls is not None and ls.launches:
            console.print(
                f"launches (rank {first.rank}): {ls.launches}; median CPU launch "
                f"{ls.cpu_launch_us_median:.1f} µs, kernel {ls.gpu_kernel_us_median:.1f} µs, "
                f"launch delay {ls.launch_delay_us_median:.1f} µs; {ls.short_kernels} kernels "
                f"shorter than their launch; outliers: {ls.runtime_outliers} slow launches "
                f"(> 50 µs), {ls.delay_outliers} long delays (> 100 µs)")
        for c in first.copies:
            bw = "unknown" if c.gb_per_s is None else f"{c.gb_per_s:.1f} GB/s"
            console.print(f"{c.kind}: {c.count} × {c.total_us / max(1, c.count):.1f} µs, {bw}"
                          + (f", {c.pageable} pageable" if c.pageable else ""), markup=False)
        for sy in first.syncs:
            console.print(f"host sync {sy.name}: {sy.count}×, host blocked "
                          f"{sy.host_blocked_us / 1e3:.2f} ms, GPU idle after "
                          f"{sy.device_idle_after_us / 1e3:.2f} ms", markup=False)
    for st in a.stragglers:
        console.print(f"rank {st.rank}: last at {st.last_arrivals}/{st.collectives} collectives, "
                      f"{st.mean_lateness_us:.0f} µs late on average")
    if findings:
        render_findings(findings, console)
    else:
        console.print("[green]No finding[/green] from this trace.")
    for w in a.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
