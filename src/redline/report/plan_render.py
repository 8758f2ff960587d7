"""``redline plan``: ranked layouts, the chosen one's memory terms with their formulas, why,
what lost and why, and how to run it; and the JSON form. Pure presentation."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from redline.plan.emit import deepspeed_config, pytorch_snippet, torchrun_command
from redline.plan.search import Candidate, PlanResult, project, why

PLAN_SCHEMA = "redline.parallel-plan/1"


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def _dur(s: float) -> str:
    if s < 1:
        return f"{s * 1e3:,.1f} ms"
    if s < 120:
        return f"{s:,.2f} s"
    return f"{s / 3600:,.1f} h" if s >= 3 * 3600 else f"{s / 60:,.1f} min"


def candidate_dict(res: PlanResult, c: Candidate, steps: int | None = None) -> dict[str, Any]:
    lay, t, mem = c.layout, c.timing, c.memory
    terms = {x.name: x.bytes for x in mem.terms}
    return {
        "name": lay.name, "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "zero_stage": lay.zero,
        "sequence_parallel": lay.sequence_parallel and lay.tp > 1,
        "recompute": lay.recompute, "optimizer_offload": lay.offload,
        "micro_batch": lay.micro_batch, "accumulation_steps": res.accumulation(lay),
        "memory_per_gpu_bytes": {"total": mem.total_bytes, **terms},
        "formulas": {x.name: x.formula for x in mem.terms},
        "host_bytes_per_gpu": mem.host_bytes_per_gpu,
        "activations_known": mem.activations_known,
        "fits": c.fits, "over_bytes": c.over_bytes,
        "why": why(res, c) if c.fits else None,
        "time": {"step_s": t.step_s, "tokens_per_s": t.tokens_per_s,
                 "flops_per_step": t.flops_per_step, "compute_s": t.compute_s,
                 "bubble_fraction": t.bubble_fraction, "dp_comm_s": t.dp_comm_s,
                 "dp_exposed_s": t.dp_exposed_s, "tp_comm_s": t.tp_comm_s,
                 "pp_comm_s": t.pp_comm_s, "pp_exposed_s": t.pp_exposed_s,
                 "offload_s": t.offload_s, "notes": t.notes},
        "projection": (dataclasses.asdict(project(res, c, steps)) if steps is not None
                       else None),
    }


def to_dict(res: PlanResult, steps: int | None = None, top: int = 10,
            script: str = "train.py") -> dict[str, Any]:
    best = res.best
    chosen = None
    if best is not None:
        chosen = candidate_dict(res, best, steps)
        chosen["torchrun"] = torchrun_command(res.cluster, script)
        chosen["pytorch_snippet"] = pytorch_snippet(res.training, best.layout)
        chosen["deepspeed_config"] = deepspeed_config(res.training, best.layout)
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
        "candidates": [candidate_dict(res, c, steps) for c in res.ranked[:top]],
        "rejected": [{"family": f, "why": w} for f, w in res.rejected],
        "why": res.why,
    }


def render(res: PlanResult, console: Console | None = None, steps: int | None = None,
           top: int = 5, script: str = "train.py") -> None:
    con = console or Console()
    sp, cl, tr = res.spec, res.cluster, res.training
    con.print(Text(
        f"redline plan: {sp.params / 1e9:,.3g}B parameters ({sp.source}"
        + (f"; {sp.params_formula}" if sp.params_formula else "") + f") on {cl.gpus} × "
        f"{cl.gpu_name} ({cl.nodes} node(s) of {cl.gpus_per_node}); global batch "
        f"{tr.global_batch} × {tr.seq or sp.seq or 1} tokens, {tr.precision}, {tr.optimizer}; "
        f"MFU assumed {res.mfu:.0%}; {res.evaluated:,} layouts evaluated, {len(res.ranked):,} "
        "fit"))
    if res.thinned:
        con.print(Text(f"search thinned: {res.thinned}"))
    act = (res.measured.source if res.measured else
           "Korthikanti et al. formula" if sp.transformer else "unknown (not counted)")
    con.print(Text(f"activations: {act}"))
    if res.ranked:
        t = Table(title="fastest layouts that fit", title_justify="left")
        for col in ("#", "layout", "memory/GPU", "step", "tokens/s", "exposed comm"):
            t.add_column(col, justify="right" if col not in ("layout",) else "left")
        for i, c in enumerate(res.ranked[:top], 1):
            t.add_row(str(i), Text(c.layout.name), _gb(c.memory.total_bytes),
                      _dur(c.timing.step_s), f"{c.timing.tokens_per_s:,.0f}",
                      _dur(c.timing.comm_exposed_s))
        con.print(t)
    best = res.best
    if best is not None:
        m = Table(title=f"chosen: {best.layout.name} — memory per GPU", title_justify="left")
        m.add_column("term")
        m.add_column("bytes", justify="right")
        m.add_column("formula")
        for x in best.memory.terms:
            m.add_row(x.name, _gb(x.bytes), Text(x.formula))
        m.add_row("total", _gb(best.memory.total_bytes), f"of {_gb(res.usable_bytes)} usable")
        con.print(m)
    con.print(Text(f"why: {res.why}"))
    for fam, reason in res.rejected:
        con.print(Text(f"  not {fam}: {reason}"))
    if best is not None:
        for note in best.timing.notes:
            con.print(Text(f"  note: {note}"))
        if steps is not None:
            pj = project(res, best, steps)
            con.print(Text(
                f"job of {steps:,} steps: {_dur(pj.job_time_s)}"
                + (f", cost {pj.cost:,.0f} at {cl.price_per_gpu_hour:g} per GPU-hour"
                   if pj.cost is not None else ", cost unknown (pass --price-per-gpu-hour)")
                + (f", energy ≤ {pj.energy_kwh:,.0f} kWh (every GPU at its "
                   f"{cl.power_w:g} W limit)" if pj.energy_kwh is not None else "")))
        con.print(Text(f"run: {torchrun_command(cl, script)}"))
        con.print(Text(pytorch_snippet(tr, best.layout)))
        ds = deepspeed_config(tr, best.layout)
        if ds is not None:
            import json

            con.print(Text("DeepSpeed config: " + json.dumps(ds)))
