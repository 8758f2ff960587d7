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
    r = b / a
    return f"{1 / r:.2f}× less" if lower_is_better and r < 1 else f"{r:.2f}×"


def rows(r: TuneResult) -> list[tuple[str, str, str, str]]:
    b, a = r.before, r.after
    pb, pa = r.before_projection, r.after_projection
    price = r.price_per_device_hour
    return [
        ("throughput (samples/s)", f"{b.throughput_samples_per_s or 0:,.1f}",
         f"{a.throughput_samples_per_s or 0:,.1f}",
         _ratio(b.throughput_samples_per_s, a.throughput_samples_per_s)),
        ("step time (median, one effective batch)", _dur(b.step_time_s), _dur(a.step_time_s),
         ""),
        ("data wait", _pct(b.data_wait_fraction), _pct(a.data_wait_fraction), ""),
        ("device busy (kernels)", _pct(b.device_busy_kernels_fraction),
         _pct(a.device_busy_kernels_fraction),
         a.device_busy_kernels_source if b.device_busy_fraction is not None else "CUDA only"),
        ("device span (events)", _pct(b.device_busy_fraction), _pct(a.device_busy_fraction),
         "upper bound of busy: counts gaps between kernels of a host-bound step"
         if b.device_busy_fraction is not None else "CUDA only"),
        ("MFU", _pct(b.mfu), _pct(a.mfu), "" if b.mfu is not None else "no peak FLOPs known"),
        ("peak memory", _mib(b.peak_memory_bytes), _mib(a.peak_memory_bytes),
         b.peak_memory_source),
        (f"job time ({pb.run_steps:,} steps)", _dur(pb.job_time_s), _dur(pa.job_time_s),
         _ratio(pa.job_time_s, pb.job_time_s) + " faster" if pb.job_time_s and pa.job_time_s
         else ""),
        ("cost", "unknown" if pb.cost is None else f"{pb.cost:,.2f}",
         "unknown" if pa.cost is None else f"{pa.cost:,.2f}",
         f"at {price:g} per device-hour" if price is not None else
         "pass --price-per-hour"),
        ("energy", "unknown" if pb.energy_kwh is None else f"{pb.energy_kwh:,.3f} kWh",
         "unknown" if pa.energy_kwh is None else f"{pa.energy_kwh:,.3f} kWh",
         b.energy_source if pb.energy_kwh is None else ""),
    ]


def render(r: TuneResult, console: Console | None = None, label: str | None = None) -> None:
    """Print the before/after table, the decisions and the plan; ``label`` (e.g. the
    simulated accelerator's) is printed above the table."""
    console = console or Console()
    p = r.plan
    if label:
        console.print(label, style="bold", markup=False)
    t = Table(title="redline tune: before → after (measured side by side)",
              title_justify="left")
    for c in ("metric", "before", "after", "change / source"):
        t.add_column(c, justify="right" if c in ("before", "after") else "left")
    for row in rows(r):
        t.add_row(*row)
    console.print(t)
    console.print(f"run length: {r.run_steps_source}", markup=False)
    for lim in r.limits:
        console.print(f"still limited: {lim.id} — {lim.evidence}; next: {lim.next_step}",
                      markup=False)
    d = Table(title="decisions, in path order", title_justify="left", show_lines=False)
    d.add_column("step")
    d.add_column("kept")
    d.add_column("why")
    for e in p.decisions:
        d.add_row(Text(e.label), "yes" if e.kept else "no", Text(e.reason))
    console.print(d)
    n = p.key.world_size
    job = (f" per rank; {p.effective_batch * n} over the job's {n} ranks" if n > 1 else "")
    ddp = [f"{k} {v}" for k, v in (("DDP bucket_cap_mb", p.ddp.bucket_cap_mb),
                                   ("DDP gradient_as_bucket_view", p.ddp.gradient_as_bucket_view))
           if v is not None]
    changed = (f"changed from {p.user_effective_batch}, learning rate × {p.lr_scale:.3g}"
               if p.user_effective_batch else "unchanged")
    console.print(
        f"plan: micro-batch {p.micro_batch} × {p.accumulation_steps} (effective batch "
        f"{p.effective_batch}{job}, {changed}), {p.precision}, workers {p.loader.num_workers}, "
        f"prefetch {p.loader.prefetch_factor}, pin_memory {p.loader.pin_memory}, "
        f"channels_last {p.channels_last}, "
        f"cudnn.benchmark {p.cudnn_benchmark}, compile {p.compile}, "
        f"optimizer {p.optimizer_impl or 'as built'}"
        + (", decode cache" if p.decode_cache else "") + "".join(f", {x}" for x in ddp))
    for note in p.notes:
        console.print(f"note: {note}", style="bold", markup=False)
    if r.reused_plan:
        console.print(f"reused the remembered plan {r.reused_plan}", markup=False)
    elif r.plan_path:
        console.print(f"plan remembered at {r.plan_path}", markup=False)
    console.print("apply it: tuned = redline.tune.apply_plan(redline.tune.load_plan(PATH), "
                  "model, optimizer, loader, loss_fn, device); for batch in tuned.loader: "
                  "tuned.step(batch)")


def to_dict(r: TuneResult) -> dict[str, Any]:
    d = dataclasses.asdict(r)
    d["plan"] = r.plan.to_dict()
    d["speedup"] = r.speedup
    if r.batch_search is not None:
        d["batch_search"]["trials"] = r.batch_search.trials
        d["batch_search"]["ooms"] = r.batch_search.ooms
    return {"schema": TUNE_SCHEMA, **d}

