"""Terminal rendering of a report (rich). Pure presentation: it computes nothing."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

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
    n = round(max(0.0, min(1.0, f)) * width)
    return "█" * n + "·" * (width - n)


def render_findings(findings: list[Finding], console: Console) -> None:
    """The ranked findings table (shared by the step report and the trace report)."""
    ft = Table(title="Findings, largest possible gain first", title_justify="left",
               show_lines=True)
    ft.add_column("#", justify="right")
    ft.add_column("finding")
    ft.add_column("ceiling", justify="right")
    ft.add_column("what and how to fix")
    for i, f in enumerate(findings, 1):
        ceil = "unknown" if f.ceiling_speedup is None else f"≤ {f.ceiling_speedup:.2f}×"
        body = Text()
        body.append(f.title + "\n", style="bold")
        body.append("fix: " + f.fix + "\n")
        ev = ", ".join(f"{k}={v}" for k, v in f.evidence.items() if v is not None)
        body.append("evidence: " + ev, style="dim")
        who = "" if f.rank is None else f"\nrank {f.rank}"
        ft.add_row(str(i), Text(f"{f.id}\n{f.severity}{who}",
                                style=_SEV_STYLE.get(f.severity, "")), ceil, body)
    console.print(ft)


SCORE_NOTE_BELOW = 0.9
"""Per-rank scores below this are named under the ranks table (the JSON has them all)."""


def render_ranks(r: RanksReport, console: Console) -> None:
    """The per-rank table and the merged view of a multi-process job."""
    t = Table(title=f"Ranks ({r.world_size}): ms per step", title_justify="left")
    for col in ("rank", "host", "status", "step", "data", "fwd", "bwd", "opt", "comm", "wait",
                "last", "late"):
        t.add_column(col, justify="left" if col in ("host", "status") else "right",
                     overflow="fold")

    def ms(v: float | None) -> str:
        return "" if v is None else f"{v * 1e3:,.1f}"

    for e in r.ranks:
        last = f"{e.last_arrivals}/{e.collectives}" if e.collectives else ""
        t.add_row(str(e.rank), Text(e.host), e.status, ms(e.step_time_mean_s), ms(e.data_wait_s),
                  ms(e.forward_s), ms(e.backward_s), ms(e.optimizer_s), ms(e.comm_s),
                  ms(e.comm_wait_s), last, ms(e.lateness_s))
    console.print(t)
    slower = [f"rank {e.rank} ({e.score_vs_fastest:.2f})" for e in r.ranks
              if e.score_vs_fastest is not None and e.score_vs_fastest < SCORE_NOTE_BELOW]
    slowed = [f"rank {e.rank} ({e.score_vs_own_best:.2f} of its best)" for e in r.ranks
              if e.score_vs_own_best is not None and e.score_vs_own_best < SCORE_NOTE_BELOW]
    if slower:
        console.print("computes slower than the fastest rank: " + ", ".join(slower))
    if slowed:
        console.print("slowed down during the run: " + ", ".join(slowed))
    parts = [f"{name.removesuffix('_s').replace('_', ' ')} median {ms(m.median)} ms, slowest "
             f"rank {m.slowest_rank}, spread {ms(m.spread)} ms"
             for name, m in r.merged.items() if m.median is not None]
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
    lw = m.loop
    if lw is None or lw.other_fraction < 0.02 or not lw.sites:
        return
    table = Table(title=f"Where 'other' went ({lw.other_fraction:.1%} of each step; "
                        f"{lw.samples} stack samples)", title_justify="left")
    table.add_column("line")
    table.add_column("kind")
    table.add_column("share", justify="right")
    table.add_column("code")
    for site in lw.sites[:LOOP_SITES_SHOWN]:
        table.add_row(escape(f"{site.file}:{site.line} ({site.function})"), site.kind,
                      f"{site.step_fraction:.1%}", escape(site.text or site.via or ""))
    gc_out = lw.kind_fractions.get("gc", 0.0)
    if gc_out >= 0.005:
        table.add_row("garbage collection", "gc", f"{gc_out:.1%}", "gc.callbacks (exact)")
    console.print(table)


def render(report: Report, console: Console) -> None:
    m = report.measurements
    t = m.timing
    console.rule(f"[bold]redline[/bold] · {report.status.replace('_', ' ')}")
    if report.status_detail:
        console.print(report.status_detail, markup=False)
    cfg = m.config
    console.print(
        f"device [bold]{escape(m.device.name)}[/bold] ({m.device.type}) · metric tier [bold]{m.tier.tier}"
        f"[/bold] · steps {t.steps_measured} measured, {t.steps_warmup} warm-up, "
        f"{t.steps_excluded} excluded · step = {t.step_source or 'none seen'}")
    ld = cfg.loader
    loader = ("no DataLoader" if ld is None else
              f"workers {ld.num_workers} · pin_memory {ld.pin_memory} · prefetch "
              f"{ld.prefetch_factor} · persistent {ld.persistent_workers}")
    console.print(
        f"config: batch {cfg.batch_size} · {loader} · precision {cfg.precision} · torch threads "
        f"{cfg.torch_threads} · data {cfg.data_source}")
    tput = t.throughput_samples_per_s
    mfu = m.mfu
    mfu_s = f"{mfu.mfu:.1%}" if mfu.mfu is not None else f"unknown ({mfu.reason})"
    console.print(
        f"step p50 {_ms(t.step_time_p50_s)} · p95 {_ms(t.step_time_p95_s)} · throughput "
        f"{'unknown' if tput is None else f'{tput:,.1f} samples/s'} · MFU {mfu_s}")
    dm = m.device_metrics
    if m.device.type == "cuda":
        nv = dm.nvml
        util = f"{nv.util_gpu_pct:.0f}%" if nv and nv.util_gpu_pct is not None else "unknown"
        console.print(
            f"device span {_pct(dm.device_span_fraction)} of step time (upper bound of busy) · "
            f"NVML util {util} (duty cycle, not efficiency) · peak reserved "
            f"{(dm.peak_reserved_bytes or 0) / 2**30:.2f} GiB"
            + (f" · energy {nv.energy_j:.0f} J" if nv and nv.energy_j is not None else ""))
    h = m.host
    console.print(
        f"host: {h.cpus_available:g} usable CPUs ({h.cpus_source}) · training process "
        f"{'unknown' if h.main_cpu_cores is None else f'{h.main_cpu_cores:.2f}'} cores · workers "
        f"{'unknown' if h.workers_cpu_cores is None else f'{h.workers_cpu_cores:.2f}'} cores")

    if t.steps_total:
        table = Table(title="Where each step's time goes (host clock)", title_justify="left")
        table.add_column("phase")
        table.add_column("ms/step", justify="right")
        table.add_column("share", justify="right")
        table.add_column("")
        for p in m.breakdown:
            table.add_row(p.phase, f"{p.mean_s * 1e3:.2f}", f"{p.fraction:.1%}", bar(p.fraction))
        console.print(table)
        render_loop_sites(m, console)

    if report.ranks is not None:
        render_ranks(report.ranks, console)
    if report.findings:
        render_findings(report.findings, console)
    elif t.steps_total:
        console.print("[green]No finding:[/green] nothing this data supports points at a "
                      "bottleneck outside the model's own compute.")
    tr = report.trace
    if tr is not None:
        if tr.idle_pct is not None:
            console.print(
                f"trace ({tr.steps} steps, {tr.device_events} device events): GPU idle "
                f"{tr.idle_pct:.1f}% · compute {tr.compute_pct:.1f}% · non-compute "
                f"{tr.non_compute_pct:.1f}% of the kernel window — {tr.path} (open in Perfetto)")
        else:
            console.print(f"trace: {escape(str(tr.note))}" + (f" — {escape(tr.path)} (open in Perfetto)"
                                                 if tr.path else ""))
    for li in m.loaders:
        if li.cache is not None:
            hr = li.cache["hit_rate"]
            console.print(f"sample cache: {li.cache['hits']} hits, {li.cache['misses']} misses"
                          f" ({'no reads' if hr is None else f'{hr:.0%} hit rate'}), "
                          f"{int(li.cache['bytes_read'] or 0) / 2**20:.1f} MiB read, "
                          f"{li.cache['uncached']} not stored (store full)")
    for miss in m.tier.missing:
        console.print(f"[dim]not measured: {escape(miss['metric'])} — {escape(miss['reason'])}[/dim]")
    for note in m.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")


def print_report(report: Report, console: Console | None = None) -> None:
    render(report, console or Console(stderr=False))
