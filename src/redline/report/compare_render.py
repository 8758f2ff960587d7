"""Terminal and JSON output of ``redline compare`` (presentation only): the verdict first,
then what changed."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from redline.compare.model import IMPROVEMENT, NO_CHANGE, REGRESSION, Comparison, OpDelta
from redline.report.json_io import clean

COMPARE_SCHEMA = "redline.compare/1"
TOP_OPS = 15
"""Kernels and operators shown in the terminal (the JSON lists them all)."""
COLOURS = {REGRESSION: "bold red", IMPROVEMENT: "bold green", NO_CHANGE: "bold"}


def to_dict(c: Comparison) -> dict[str, Any]:
    """JSON form: times as named (``_s``, ``_ms``, ``_us``), fractions 0..1, ``_pct`` 0..100."""
    out: dict[str, Any] = clean({"schema": COMPARE_SCHEMA, **dataclasses.asdict(c)})
    return out


def _ms(v: float | None, digits: int = 2) -> str:
    return "unknown" if v is None else f"{v:,.{digits}f}"


def _pct(v: float | None) -> str:
    return "" if v is None else f"{v:+.1f}%"


def _share(v: float | None) -> str:
    return "" if v is None else f"{v:.0%}"


def _num(v: float | None) -> str:
    if v is None:
        return "unknown"
    return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"


def headline(c: Comparison) -> str:
    """The verdict in one line, with the step time and throughput deltas."""
    verdict = c.verdict
    parts = [verdict.verdict.upper()]
    if verdict.step_time_delta_ms is not None:
        parts.append(f"step time {_ms(verdict.step_time_before_ms)} → {_ms(verdict.step_time_after_ms)} ms "
                     f"({verdict.step_time_delta_ms:+,.2f} ms, {_pct(verdict.step_time_delta_pct)})")
    if verdict.throughput_delta_pct is not None:
        parts.append(f"throughput {_num(verdict.throughput_before_samples_per_s)} → "
                     f"{_num(verdict.throughput_after_samples_per_s)} samples/s "
                     f"({_pct(verdict.throughput_delta_pct)})")
    return " · ".join(parts)


def render(c: Comparison, console: Console) -> None:
    what = {"reports": "two doctor reports", "traces": "two trace sets",
            "plan_vs_report": "a plan's projection and a measured run"}.get(c.kind, c.kind)
    console.rule(f"[bold]redline compare[/bold] · {what}")
    console.print(Text(f"before: {c.before_source}\nafter:  {c.after_source}"))
    verdict = c.verdict
    console.print(Text(headline(c), style=COLOURS.get(verdict.verdict, "bold yellow")))
    console.print(Text(verdict.reason))
    if verdict.test is not None:
        console.print(Text(f"test: {verdict.test.method_detail}; minimum effect "
                           f"{verdict.min_effect_fraction:.0%}, α = {verdict.alpha:g}"))
    if c.differences:
        table = Table(title="The runs differ in", title_justify="left")
        for col in ("field", "before", "after", "what it means here"):
            table.add_column(col)
        for difference in c.differences:
            table.add_row(difference.field, Text(str(difference.before)),
                          Text(str(difference.after)), Text(difference.consequence))
        console.print(table)
    if c.phases:
        table = Table(title="Phases, mean per step", title_justify="left")
        for col in ("phase", "before ms", "after ms", "Δ ms", "share before", "share after"):
            table.add_column(col, justify="left" if col == "phase" else "right")
        for phase in c.phases:
            table.add_row(phase.phase, _ms(phase.before_ms), _ms(phase.after_ms),
                      "" if phase.delta_ms is None else f"{phase.delta_ms:+,.2f}",
                      _share(phase.before_fraction), _share(phase.after_fraction))
        console.print(table)
    if c.findings:
        table = Table(title="Findings", title_justify="left")
        for col in ("finding", "change", "severity", "ceiling"):
            table.add_column(col)
        for finding in c.findings:
            ceil = " → ".join("—" if speedup is None else f"{speedup:.2f}×"
                              for speedup in (finding.before_ceiling_speedup,
                                              finding.after_ceiling_speedup))
            sev = " → ".join(severity or "—"
                             for severity in (finding.before_severity, finding.after_severity))
            label = finding.id + (f" (rank {finding.rank})" if finding.rank is not None else "")
            table.add_row(Text(label), finding.change, sev, ceil)
        console.print(table)
    if c.metrics:
        table = Table(title="Metrics that changed", title_justify="left")
        for col in ("metric", "before", "after", "Δ"):
            table.add_column(col, justify="left" if col == "metric" else "right")
        for metric in c.metrics:
            table.add_row(metric.name, _num(metric.before), _num(metric.after),
                      "" if metric.delta_fraction is None else f"{metric.delta_fraction:+.0%}")
        console.print(table)
    for title, ops in (("Kernels", c.kernels), ("Operators", c.operators)):
        changed = [op for op in ops if op.change != "unchanged"]
        if ops:
            _ops_table(console, title, changed, len(ops), c.per)
    for note in c.notes:
        console.print(Text(f"note: {note}"))


def _ops_table(console: Console, title: str, changed: list[OpDelta], total: int,
               per: str | None) -> None:
    unit = "per step" if per == "step" else "per trace window"
    if not changed:
        console.print(Text(f"{title}: all {total} unchanged ({unit})"))
        return
    table = Table(title=f"{title} that changed ({len(changed)} of {total}, µs {unit}, largest Δ "
              "first)", title_justify="left")
    for col in ("name", "change", "count", "before µs", "after µs", "Δ µs", "share"):
        table.add_column(col, justify="left" if col in ("name", "change") else "right")
    for op in changed[:TOP_OPS]:
        table.add_row(Text(op.name[:70]), op.change, f"{op.before_count:,.4g} → {op.after_count:,.4g}",
                  f"{op.before_us:,.1f}", f"{op.after_us:,.1f}", f"{op.delta_us:+,.1f}",
                  f"{_share(op.before_share) or '—'} → {_share(op.after_share) or '—'}")
    console.print(table)
