"""Before/after table of ``redline tune`` and its JSON form. Pure presentation."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:  # annotations only: `redline trace --html` reads TUNE_SCHEMA without torch
    from redline.tune.result import TuneResult

TUNE_SCHEMA = "redline.tune/1"


def _pct(f: float | None) -> str:
    return "unknown" if f is None else f"{f:.1%}"


def _dur(s: float | None) -> str:
    if s is None:
        return "unknown"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s / 3600:,.2f} h" if s >= 3600 else f"{s / 60:,.1f} min" if s >= 60 else f"{s:.1f} s"


def _mib(b: int | None) -> str:
    if b is None:
        return "unknown"
    return f"{b / 2**20:,.1f} MiB" if b >= 2**20 else f"{b / 1024:,.1f} KiB"


def _ratio(a: float | None, b: float | None, lower_is_better: bool = False) -> str:
    if not a or b is None:
        return ""
    ratio = b / a
    return f"{1 / ratio:.2f}× less" if lower_is_better and ratio < 1 else f"{ratio:.2f}×"


def rows(r: TuneResult) -> list[tuple[str, str, str, str]]:
    before, after = r.before, r.after
    before_projection, after_projection = r.before_projection, r.after_projection
    price = r.price_per_device_hour
    return [
        ("throughput (samples/s)", f"{before.throughput_samples_per_s or 0:,.1f}",
         f"{after.throughput_samples_per_s or 0:,.1f}",
         _ratio(before.throughput_samples_per_s, after.throughput_samples_per_s)),
        ("step time (median, one effective batch)", _dur(before.step_time_s), _dur(after.step_time_s),
         ""),
        ("data wait", _pct(before.data_wait_fraction), _pct(after.data_wait_fraction), ""),
        ("device busy (kernels)", _pct(before.device_busy_kernels_fraction),
         _pct(after.device_busy_kernels_fraction),
         after.device_busy_kernels_source if before.device_busy_fraction is not None else "CUDA only"),
        ("device span (events)", _pct(before.device_busy_fraction), _pct(after.device_busy_fraction),
         "upper bound of busy: counts gaps between kernels of a host-bound step"
         if before.device_busy_fraction is not None else "CUDA only"),
        ("MFU", _pct(before.mfu), _pct(after.mfu), "" if before.mfu is not None else "no peak FLOPs known"),
        ("peak memory", _mib(before.peak_memory_bytes), _mib(after.peak_memory_bytes),
         before.peak_memory_source),
        (f"job time ({before_projection.run_steps:,} steps)", _dur(before_projection.job_time_s),
         _dur(after_projection.job_time_s),
         _ratio(after_projection.job_time_s, before_projection.job_time_s) + " faster"
         if before_projection.job_time_s and after_projection.job_time_s else ""),
        ("cost", "unknown" if before_projection.cost is None else f"{before_projection.cost:,.2f}",
         "unknown" if after_projection.cost is None else f"{after_projection.cost:,.2f}",
         f"at {price:g} per device-hour" if price is not None else "no price given"),
        ("energy",
         "unknown" if before_projection.energy_kwh is None
         else f"{before_projection.energy_kwh:,.3f} kWh",
         "unknown" if after_projection.energy_kwh is None else f"{after_projection.energy_kwh:,.3f} kWh",
         before.energy_source if before_projection.energy_kwh is None else ""),
    ]


def render(r: TuneResult, console: Console | None = None, label: str | None = None) -> None:
    """Print the before/after table, the decisions and the plan; ``label`` (e.g. the
    simulated accelerator's) is printed above the table."""
    console = console or Console()
    plan = r.plan
    if label:
        console.print(label, style="bold", markup=False)
    table = Table(title="redline tune: before → after (measured side by side)",
              title_justify="left")
    for column in ("metric", "before", "after", "change / source"):
        table.add_column(column, justify="right" if column in ("before", "after") else "left")
    for row in rows(r):
        table.add_row(*row)
    console.print(table)
    console.print(f"run length: {r.run_steps_source}", markup=False)
    for lim in r.limits:
        console.print(f"still limited: {lim.id} — {lim.evidence}; next: {lim.next_step}",
                      markup=False)
    decisions_table = Table(title="decisions, in path order", title_justify="left", show_lines=False)
    decisions_table.add_column("step")
    decisions_table.add_column("kept")
    decisions_table.add_column("why")
    for decision in plan.decisions:
        decisions_table.add_row(Text(decision.label), "yes" if decision.kept else "no", Text(decision.reason))
    console.print(decisions_table)
    world_size = plan.key.world_size
    job = (f" per rank; {plan.effective_batch * world_size} over the job's {world_size} ranks"
           if world_size > 1 else "")
    changed = (f"changed from {plan.user_effective_batch}, learning rate × {plan.lr_scale:.3g}"
               if plan.user_effective_batch else "unchanged")
    from redline.tune.knobs import KNOBS  # here: reading TUNE_SCHEMA needs no torch

    settings = [word for knob in KNOBS for word in knob.summary(plan)]
    console.print(
        f"plan: micro-batch {plan.micro_batch} × {plan.accumulation_steps} (effective batch "
        f"{plan.effective_batch}{job}, {changed}), " + ", ".join(settings), markup=False)
    for note in plan.notes:
        console.print(f"note: {note}", style="bold", markup=False)
    if r.reused_plan:
        console.print(f"reused the remembered plan {r.reused_plan}", markup=False)
    elif r.plan_path:
        console.print(f"plan remembered at {r.plan_path}", markup=False)
    console.print("apply it: tuned = redline.tune.apply_plan(redline.tune.load_plan(PATH), "
                  "model, optimizer, loader, loss_fn, device); for batch in tuned.loader: "
                  "tuned.step(batch)")


def to_dict(r: TuneResult) -> dict[str, Any]:
    doc = dataclasses.asdict(r)
    doc["plan"] = r.plan.to_dict()
    doc["speedup"] = r.speedup
    if r.batch_search is not None:
        doc["batch_search"]["trials"] = r.batch_search.trials
        doc["batch_search"]["ooms"] = r.batch_search.ooms
    return {"schema": TUNE_SCHEMA, **doc}

