"""Terminal rendering of a report (rich). Pure presentation: it computes nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from redline.diagnose.thresholds import LOOP_NAMING_MIN_SAMPLES, MEMORY_TREND_MIN_Z
from redline.measure.trend import samples_for_trend

if TYPE_CHECKING:  # annotations only: a trace's findings render without the report's records
    from redline.core.findings import Finding
    from redline.core.measurements import Measurements
    from redline.core.report import RanksReport, Report

_SEV_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}


def _ms(s: float | None) -> str:
    return "unknown" if s is None else f"{s * 1e3:.2f} ms"


def _pct(f: float | None) -> str:
    return "unknown" if f is None else f"{f:.1%}"


def bar(f: float, width: int = 24) -> str:
    """A share 0..1 as a bar of ``width`` characters (the breakdown table's, the live panel's)."""
    filled = round(max(0.0, min(1.0, f)) * width)
    return "█" * filled + "·" * (width - filled)


def render_findings(findings: list[Finding], console: Console) -> None:
    """The ranked findings table (shared by the step report and the trace report)."""
    findings_table = Table(title="Findings, largest possible gain first", title_justify="left",
               show_lines=True)
    findings_table.add_column("#", justify="right")
    findings_table.add_column("finding")
    findings_table.add_column("ceiling", justify="right")
    findings_table.add_column("what and how to fix")
    for i, finding in enumerate(findings, 1):
        ceil = "unknown" if finding.ceiling_speedup is None else f"≤ {finding.ceiling_speedup:.2f}×"
        body = Text()
        body.append(finding.title + "\n", style="bold")
        body.append("fix: " + finding.fix + "\n")
        evidence = ", ".join(f"{k}={value}" for k, value in finding.evidence.items() if value is not None)
        body.append("evidence: " + evidence, style="dim")
        who = "" if finding.rank is None else f"\nrank {finding.rank}"
        findings_table.add_row(str(i), Text(f"{finding.id}\n{finding.severity}{who}",
                                style=_SEV_STYLE.get(finding.severity, "")), ceil, body)
    console.print(findings_table)


SCORE_NOTE_BELOW = 0.9
"""Per-rank scores below this are named under the ranks table (the JSON has them all)."""


def render_ranks(r: RanksReport, console: Console) -> None:
    """The per-rank table and the merged view of a multi-process job."""
    ranks_table = Table(title=f"Ranks ({r.world_size}): ms per step", title_justify="left")
    for col in ("rank", "host", "status", "step", "data", "fwd", "bwd", "opt", "comm", "wait",
                "last", "late"):
        ranks_table.add_column(col, justify="left" if col in ("host", "status") else "right",
                     overflow="fold")

    def ms(v: float | None) -> str:
        return "" if v is None else f"{v * 1e3:,.1f}"

    for e in r.ranks:
        last = f"{e.last_arrivals}/{e.collectives}" if e.collectives else ""
        ranks_table.add_row(str(e.rank), Text(e.host), e.status, ms(e.step_time_mean_s), ms(e.data_wait_s),
                  ms(e.forward_s), ms(e.backward_s), ms(e.optimizer_s), ms(e.comm_s),
                  ms(e.comm_wait_s), last, ms(e.lateness_s))
    console.print(ranks_table)
    slower = [f"rank {e.rank} ({e.score_vs_fastest:.2f})" for e in r.ranks
              if e.score_vs_fastest is not None and e.score_vs_fastest < SCORE_NOTE_BELOW]
    slowed = [f"rank {e.rank} ({e.score_vs_own_best:.2f} of its best)" for e in r.ranks
              if e.score_vs_own_best is not None and e.score_vs_own_best < SCORE_NOTE_BELOW]
    if slower:
        console.print("computes slower than the fastest rank: " + ", ".join(slower))
    if slowed:
        console.print("slowed down during the run: " + ", ".join(slowed))
    parts = [f"{name.removesuffix('_s').replace('_', ' ')} median {ms(merged_metric.median)} ms, slowest "
             f"rank {merged_metric.slowest_rank}, spread {ms(merged_metric.spread)} ms"
             for name, merged_metric in r.merged.items() if merged_metric.median is not None]
    if parts:
        console.print("merged: " + " · ".join(parts))
    console.print("[dim]comm: blocked in communication not overlapped with compute; wait: "
                  "of it, waiting at collectives for later ranks; last: collectives it arrived "
                  "at last; late: behind the first rank, per step. Arrivals: "
                  f"{r.arrivals_source}[/dim]")
    if r.missing:
        console.print(f"[yellow]missing ranks:[/yellow] {', '.join(map(str, r.missing))}")


LOOP_SITES_SHOWN = 5
"""Lines shown under the breakdown, where the time outside the phases went."""


def render_loop_sites(m: Measurements, console: Console) -> None:
    """The user's lines that spent the time outside every phase ('other'), largest first."""
    loop = m.loop
    if loop is None or loop.other_fraction < 0.02 or not loop.sites:
        return
    few = (": too few to split it, the shares below are those samples'"
           if loop.samples < LOOP_NAMING_MIN_SAMPLES else "")
    table = Table(title=f"Where 'other' went ({loop.other_fraction:.1%} of each step; "
                        f"{loop.samples} stack samples{few})", title_justify="left")
    table.add_column("line")
    table.add_column("kind")
    table.add_column("share", justify="right")
    table.add_column("code")
    for site in loop.sites[:LOOP_SITES_SHOWN]:
        table.add_row(escape(f"{site.file}:{site.line} ({site.function})"), site.kind,
                      f"{site.step_fraction:.1%}", escape(site.text or site.via or ""))
    gc_out = loop.kind_fractions.get("gc", 0.0)
    if gc_out >= 0.005:
        table.add_row("garbage collection", "gc", f"{gc_out:.1%}", "gc.callbacks (exact)")
    console.print(table)


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[int] | list[float], width: int = 40) -> str:
    """Values as a line of block characters, lowest ▁ to highest █ (at most ``width``, evenly
    spaced); a flat series is all ▁."""
    if not values:
        return ""
    step = max(1, -(-len(values) // width))
    sampled = values[::step]
    low, high = min(sampled), max(sampled)
    span = high - low
    return "".join(SPARK[0] if span <= 0 else SPARK[min(7, int((value - low) / span * 8))]
                   for value in sampled)


def _mib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if abs(b) >= 2**30 else f"{b / 2**20:.1f} MiB"


MEMORY_CURVES_SHOWN = 4
"""Memory curves shown (the training process, the device's, then the workers)."""


def render_memory(m: Measurements, console: Console) -> None:
    """Each memory curve as a sparkline with its start, end and slope."""
    memory = m.memory
    if memory is None or not memory.curves:
        return
    order = sorted(memory.curves, key=lambda curve: (curve.process == "worker", curve.kind))
    for curve in order[:MEMORY_CURVES_SHOWN]:
        who = {"host_rss": "RSS", "cuda_allocated": "device allocated",
               "cuda_reserved": "device reserved"}[curve.kind]
        who += "" if curve.kind != "host_rss" else (" main" if curve.process == "main"
                                                 else f" worker {curve.pid}")
        per_k = curve.slope_bytes_per_1k_steps
        need = samples_for_trend(MEMORY_TREND_MIN_Z)
        # a slope fitted to fewer samples than the trend test needs is noise: not shown
        slope = ("" if per_k is None or curve.window_samples < need else
                 f" · {'+' if per_k >= 0 else ''}{_mib(per_k)}/1k steps")
        short = ("" if curve.window_samples >= need else
                 f" · {curve.window_samples} samples in the window, a trend test needs {need}: "
                 "measure more steps")
        console.print(f"memory {who:<18} {sparkline(curve.bytes)} {_mib(curve.start_bytes)} → "
                      f"{_mib(curve.end_bytes)}{slope}{short}", markup=False)


def render_drift(m: Measurements, console: Console) -> None:
    """Start-up cost and the steady steps' trend."""
    drift = m.drift
    if drift is None:
        return
    parts = []
    startup = drift.startup
    if startup is not None and startup.steps:
        parts.append(f"start-up {startup.steps} step(s), {startup.extra_s:.2f} s above the steady "
                     f"{startup.steady_step_s * 1e3:.2f} ms step"
                     + (f" ({startup.steps_after_warmup} after the warm-up, "
                        + ("left out)" if startup.left_out else "kept in the statistics)")
                        if startup.steps_after_warmup else ""))
    trend = drift.trend
    if trend is not None:
        parts.append(f"trend {trend.slope_s_per_1k_steps * 1e3:+.2f} ms per 1k steps "
                     f"({trend.start_s * 1e3:.2f} → {trend.end_s * 1e3:.2f} ms, z {trend.trend_z:+.1f})")
    if parts:
        console.print("steps: " + " · ".join(parts), markup=False)


def render(report: Report, console: Console) -> None:
    measurements = report.measurements
    timing = measurements.timing
    console.rule(f"[bold]redline[/bold] · {report.status.replace('_', ' ')}")
    if report.status_detail:
        console.print(report.status_detail, markup=False)
    cfg = measurements.config
    console.print(
        f"device [bold]{escape(measurements.device.name)}[/bold] ({measurements.device.type}) · "
        f"metric tier [bold]{measurements.tier.tier}"
        f"[/bold] · steps {timing.steps_measured} measured, {timing.steps_warmup} warm-up, "
        f"{timing.steps_excluded} excluded · step = {timing.step_source or 'none seen'}")
    loader_config = cfg.loader
    loader = ("no DataLoader" if loader_config is None else
              f"workers {loader_config.num_workers} · pin_memory {loader_config.pin_memory} · prefetch "
              f"{loader_config.prefetch_factor} · persistent {loader_config.persistent_workers}")
    console.print(
        f"config: batch {cfg.batch_size or 'unknown'} · {loader} · precision "
        f"{cfg.precision or 'unknown'} · torch threads "
        f"{cfg.torch_threads} · data {cfg.data_source}")
    tput = timing.throughput_samples_per_s
    mfu = measurements.mfu
    mfu_s = f"{mfu.mfu:.1%}" if mfu.mfu is not None else f"unknown ({mfu.reason})"
    console.print(
        f"step p50 {_ms(timing.step_time_p50_s)} · p95 {_ms(timing.step_time_p95_s)} · throughput "
        f"{'unknown' if tput is None else f'{tput:,.1f} samples/s'} · MFU {mfu_s}")
    device_metrics = measurements.device_metrics
    if measurements.device.type == "cuda":
        nvml = device_metrics.nvml
        util = f"{nvml.util_gpu_pct:.0f}%" if nvml and nvml.util_gpu_pct is not None else "unknown"
        console.print(
            f"device span {_pct(device_metrics.device_span_fraction)} of step time (upper bound of busy) · "
            f"NVML util {util} (duty cycle, not efficiency) · peak reserved "
            f"{(device_metrics.peak_reserved_bytes or 0) / 2**30:.2f} GiB"
            + (f" · energy {nvml.energy_j:.0f} J" if nvml and nvml.energy_j is not None else ""))
    host = measurements.host
    console.print(
        f"host: {host.cpus_available:g} usable CPUs ({host.cpus_source}) · training process "
        f"{'unknown' if host.main_cpu_cores is None else f'{host.main_cpu_cores:.2f}'} cores · workers "
        f"{'unknown' if host.workers_cpu_cores is None else f'{host.workers_cpu_cores:.2f}'} cores")

    if timing.steps_total:
        table = Table(title="Where each step's time goes (host clock)", title_justify="left")
        table.add_column("phase")
        table.add_column("ms/step", justify="right")
        table.add_column("share", justify="right")
        table.add_column("")
        for phase_time in measurements.breakdown:
            table.add_row(phase_time.phase, f"{phase_time.mean_s * 1e3:.2f}",
                          f"{phase_time.fraction:.1%}", bar(phase_time.fraction))
        console.print(table)
        render_loop_sites(measurements, console)
        render_drift(measurements, console)
    render_memory(measurements, console)

    if report.ranks is not None:
        render_ranks(report.ranks, console)
    if report.findings:
        render_findings(report.findings, console)
    elif timing.steps_total:
        console.print("[green]No finding:[/green] nothing this data supports points at a "
                      "bottleneck outside the model's own compute.")
    trace = report.trace
    if trace is not None:
        if trace.idle_pct is not None:
            console.print(
                f"trace ({trace.steps} steps, {trace.device_events} device events): GPU idle "
                f"{trace.idle_pct:.1f}% · compute {trace.compute_pct:.1f}% · non-compute "
                f"{trace.non_compute_pct:.1f}% of the kernel window — {trace.path} (open in Perfetto)")
        else:
            console.print(f"trace: {escape(str(trace.note))}"
                          + (f" — {escape(trace.path)} (open in Perfetto)"
                             if trace.path else ""))
    for loader_stats in measurements.loaders:
        if loader_stats.cache is not None:
            hit_rate = loader_stats.cache["hit_rate"]
            console.print(f"sample cache: {loader_stats.cache['hits']} hits, "
                          f"{loader_stats.cache['misses']} misses"
                          f" ({'no reads' if hit_rate is None else f'{hit_rate:.0%} hit rate'}), "
                          f"{int(loader_stats.cache['bytes_read'] or 0) / 2**20:.1f} MiB read, "
                          f"{loader_stats.cache['uncached']} not stored (store full)")
    for miss in measurements.tier.missing:
        console.print(f"[dim]not measured: {escape(miss['metric'])} — {escape(miss['reason'])}[/dim]")
    for note in measurements.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")


def print_report(report: Report, console: Console | None = None) -> None:
    """Print the report to the terminal (Rich).

    Args:
        report: the report.
        console: the Rich console to print to; None = a new one on stdout.
    """
    render(report, console or Console(stderr=False))
