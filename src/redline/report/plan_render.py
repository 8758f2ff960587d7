"""``redline plan``: ranked layouts, the chosen one's memory terms with their formulas, why,
what lost and why, and how to run it; and the JSON form. Pure presentation."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from redline.plan.outcome import CandidateOutcome, PlanOutcome
from redline.plan.search import PlanResult

PLAN_SCHEMA = "redline.parallel-plan/1"


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def _dur(s: float) -> str:
    if s < 1:
        return f"{s * 1e3:,.1f} ms"
    if s < 120:
        return f"{s:,.2f} s"
    return f"{s / 3600:,.1f} h" if s >= 3 * 3600 else f"{s / 60:,.1f} min"


def candidate_dict(res: PlanResult, co: CandidateOutcome) -> dict[str, Any]:
    candidate = co.candidate
    lay, timing, mem = candidate.layout, candidate.timing, candidate.memory
    terms = {term.name: term.bytes for term in mem.terms}
    return {
        "name": lay.name, "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "zero_stage": lay.zero,
        "sequence_parallel": lay.sequence_parallel and lay.tp > 1,
        "recompute": lay.recompute, "optimizer_offload": lay.offload,
        "micro_batch": lay.micro_batch, "accumulation_steps": res.accumulation(lay),
        "memory_per_gpu_bytes": {"total": mem.total_bytes, **terms},
        "formulas": {term.name: term.formula for term in mem.terms},
        "host_bytes_per_gpu": mem.host_bytes_per_gpu,
        "activations_known": mem.activations_known,
        "fits": candidate.fits, "over_bytes": candidate.over_bytes,
        "why": co.why,
        "time": {"step_s": timing.step_s, "tokens_per_s": timing.tokens_per_s,
                 "flops_per_step": timing.flops_per_step, "compute_s": timing.compute_s,
                 "bubble_fraction": timing.bubble_fraction, "dp_comm_s": timing.dp_comm_s,
                 "dp_exposed_s": timing.dp_exposed_s, "tp_comm_s": timing.tp_comm_s,
                 "pp_comm_s": timing.pp_comm_s, "pp_exposed_s": timing.pp_exposed_s,
                 "offload_s": timing.offload_s, "notes": timing.notes},
        "projection": dataclasses.asdict(co.projection) if co.projection is not None else None,
    }


def to_dict(out: PlanOutcome) -> dict[str, Any]:
    res = out.result
    chosen = None
    if out.chosen is not None:
        chosen = candidate_dict(res, out.chosen)
        chosen["torchrun"] = out.torchrun
        chosen["pytorch_snippet"] = out.pytorch_snippet
        chosen["deepspeed_config"] = out.deepspeed_config
    return {
        "schema": PLAN_SCHEMA,
        "model": dataclasses.asdict(res.spec),
        "activations": (dataclasses.asdict(res.measured) if res.measured is not None else
                        {"source": "Korthikanti et al. 2022 formula" if res.spec.transformer
                         else "unknown"}),
        "training": dataclasses.asdict(res.training),
        "cluster": dataclasses.asdict(res.cluster),
        "mfu_assumed": res.mfu, "usable_bytes_per_gpu": res.usable_bytes,
        "layouts_evaluated": res.evaluated, "layouts_thinned": res.thinned,
        "feasible": len(res.ranked),
        "chosen": chosen,
        "candidates": [candidate_dict(res, outcome) for outcome in out.listed],
        "rejected": [{"family": family, "why": why} for family, why in res.rejected],
        "why": res.why,
    }


def render(out: PlanOutcome, console: Console | None = None, top: int = 5) -> None:
    con = console or Console()
    res = out.result
    spec, cluster, training = res.spec, res.cluster, res.training
    con.print(Text(
        f"redline plan: {spec.params / 1e9:,.3g}B parameters ({spec.source}"
        + (f"; {spec.params_formula}" if spec.params_formula else "") + f") on {cluster.gpus} × "
        f"{cluster.gpu_name} ({cluster.nodes} node(s) of {cluster.gpus_per_node}); global batch "
        f"{training.global_batch} × {training.seq or spec.seq or 1} tokens, {training.precision}, "
        f"{training.optimizer}; "
        f"MFU assumed {res.mfu:.0%}; {res.evaluated:,} layouts evaluated, {len(res.ranked):,} "
        "fit"))
    if res.thinned:
        con.print(Text(f"search thinned: {res.thinned}"))
    act = (res.measured.source if res.measured else
           "Korthikanti et al. formula" if spec.transformer else "unknown (not counted)")
    con.print(Text(f"activations: {act}"))
    if res.ranked:
        layouts_table = Table(title="fastest layouts that fit", title_justify="left")
        for col in ("#", "layout", "memory/GPU", "step", "tokens/s", "exposed comm"):
            layouts_table.add_column(col, justify="right" if col not in ("layout",) else "left")
        for i, candidate in enumerate((outcome.candidate for outcome in out.listed[:top]), 1):
            layouts_table.add_row(str(i), Text(candidate.layout.name), _gb(candidate.memory.total_bytes),
                      _dur(candidate.timing.step_s), f"{candidate.timing.tokens_per_s:,.0f}",
                      _dur(candidate.timing.comm_exposed_s))
        con.print(layouts_table)
    best = out.chosen.candidate if out.chosen is not None else None
    if best is not None:
        memory_table = Table(title=f"chosen: {best.layout.name} — memory per GPU", title_justify="left")
        memory_table.add_column("term")
        memory_table.add_column("bytes", justify="right")
        memory_table.add_column("formula")
        for term in best.memory.terms:
            memory_table.add_row(term.name, _gb(term.bytes), Text(term.formula))
        memory_table.add_row("total", _gb(best.memory.total_bytes), f"of {_gb(res.usable_bytes)} usable")
        con.print(memory_table)
    con.print(Text(f"why: {res.why}"))
    for fam, reason in res.rejected:
        con.print(Text(f"  not {fam}: {reason}"))
    if best is not None:
        for note in best.timing.notes:
            con.print(Text(f"  note: {note}"))
        projection = out.chosen.projection if out.chosen is not None else None
        if projection is not None:
            con.print(Text(
                f"job of {projection.steps:,} steps: {_dur(projection.job_time_s)}"
                + (f", cost {projection.cost:,.0f} at {cluster.price_per_gpu_hour:g} per GPU-hour"
                   if projection.cost is not None else ", cost unknown (no price per GPU-hour given)")
                + (f", energy ≤ {projection.energy_kwh:,.0f} kWh (every GPU at its "
                   f"{cluster.power_w:g} W limit)" if projection.energy_kwh is not None else "")))
        con.print(Text(f"run: {out.torchrun}"))
        con.print(Text(out.pytorch_snippet or ""))
        if out.deepspeed_config is not None:
            import json

            con.print(Text("DeepSpeed config: " + json.dumps(out.deepspeed_config)))
