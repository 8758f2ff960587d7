"""Every layout of the cluster that reproduces the global batch, its memory and predicted step
time; the feasible ones ranked, the chosen one explained, the others' reasons kept.

Known practice is built in (Ultra-Scale Playbook, "Finding the best training configuration";
llm-analysis after MT-NLG): tensor parallelism only within a node (its all-reduces cannot be
hidden and leave NVLink beyond it); pipeline stages only where they pay for their bubble;
micro-batch × accumulation × data-parallel degree = the global batch exactly. Among layouts of
the same predicted time, the lower ZeRO stage, no recompute and no offload win (each only when
needed).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from redline.plan.activations import MeasuredActivations
from redline.plan.hardware import Cluster
from redline.plan.limits import MAX_LAYOUTS, PlanInputError, positive, whole
from redline.plan.memory import Layout, Memory, Training, memory
from redline.plan.spec import ModelSpec
from redline.plan.timing import DEFAULT_MFU, Timing, step_time

HEADROOM = 0.10
"""Share of device memory left free: the CUDA context, NCCL buffers and the caching
allocator's fragmentation (the batch finder measures the latter at 5–40 %; 10 % is a floor)."""
MAX_MICRO_BATCH = 64


@dataclass(slots=True, kw_only=True)
class Candidate:
    """One layout evaluated: its memory per GPU, predicted step time and whether it fits."""

    layout: Layout
    memory: Memory
    timing: Timing
    fits: bool
    over_bytes: int
    """By how much it exceeds the usable memory (0 when it fits)."""


@dataclass(slots=True, kw_only=True)
class PlanResult:
    """The layouts of a cluster for one model and training, ranked, with the rejected
    alternatives and why the first was chosen."""

    spec: ModelSpec
    training: Training
    cluster: Cluster
    mfu: float
    usable_bytes: int
    ranked: list[Candidate] = field(default_factory=list)
    """Feasible layouts, fastest first."""
    rejected: list[tuple[str, str]] = field(default_factory=list)
    """(layout or family, why not) for the alternatives worth naming."""
    why: str = ""
    evaluated: int = 0
    measured: MeasuredActivations | None = None
    """Activations counted from the model, when they were."""
    thinned: str | None = None
    """What the search left out to stay within :data:`redline.plan.limits.MAX_LAYOUTS`
    layouts (None: every layout was evaluated)."""

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None

    def accumulation(self, lay: Layout) -> int:
        return self.training.global_batch // (lay.dp * lay.micro_batch)


def _divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending, in O(√n)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _ladder(values: list[int], ratio: float) -> list[int]:
    """The first value, each next one at least ``ratio`` times the last kept, and the last:
    a geometric subset of an ascending list."""
    if len(values) <= 2:
        return values
    kept = [values[0]]
    for v in values[1:-1]:
        if v >= kept[-1] * ratio:
            kept.append(v)
    return [*kept, values[-1]]


def _recompute_options(spec: ModelSpec, tr: Training) -> list[str]:
    if not spec.transformer:
        return ["none"]
    # With FlashAttention there is no s² term left for selective recompute to drop.
    return ["none", "full"] if tr.flash_attention else ["none", "selective", "full"]


_RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}


def _interleavings(spec: ModelSpec, pp: int, m: int) -> list[int]:
    """Chunks per GPU to try: 1, and 2 where the layers split into 2·p chunks and the
    micro-batches are a multiple of p (Megatron's condition for the interleaved schedule)."""
    if pp == 1 or not spec.layers or m % pp or spec.layers % (2 * pp):
        return [1]
    return [1, 2]


TIE = 0.02
"""Predicted step times within 2 % of each other are a tie, settled by practice (no offload, no
recompute, the lower ZeRO stage, fewer stages, less TP): the model's assumptions (MFU, bus
efficiency, perfect overlap) are not more precise than that."""


def _rank(cands: list[Candidate]) -> list[Candidate]:
    """Fastest first, in tiers of :data:`TIE`; practice orders each tier."""
    if not cands:
        return []
    best = min(c.timing.step_s for c in cands)

    def key(c: Candidate) -> tuple[int, int, int, int, int, int, int, float]:
        lay = c.layout
        tier = int(math.log(c.timing.step_s / best) / math.log1p(TIE) + 1e-9)
        return (tier, int(lay.offload), _RECOMPUTE_ORDER[lay.recompute], lay.zero, lay.pp,
                lay.virtual_stages, lay.tp, c.timing.step_s)

    return sorted(cands, key=key)


def search(spec: ModelSpec, tr: Training, cl: Cluster, mfu: float = DEFAULT_MFU,
           headroom: float = HEADROOM,
           measured: MeasuredActivations | None = None) -> PlanResult:
    """Rank the layouts of ``cl`` for ``spec`` trained as ``tr`` (activations ``measured``
    from the model where given, else from the transformer formula).

    Args:
        spec: the model.
        tr: the training (global batch, precision, sequence length).
        cl: the cluster.
        mfu: the model FLOPs utilization assumed, a fraction of the peak (> 0).
        headroom: share of each GPU's memory left free, in [0, 1).
        measured: activations counted from the model; None = the transformer formula.

    Returns:
        A :class:`PlanResult`: the layouts that fit, ranked, the rejected alternatives, and
        why the first was chosen (or why none fits).

    Raises:
        PlanInputError: ``mfu`` or ``headroom`` out of range; the sequence length unknown
            without ``measured``; or no layout divides the global batch.
    """
    positive("mfu", mfu, what="model FLOPs utilization, a fraction of the peak")
    if not (isinstance(headroom, int | float) and 0 <= headroom < 1):
        raise PlanInputError(f"`headroom` (share of memory left free) must be in [0, 1), got "
                             f"{headroom}")
    if measured is None and (tr.seq or spec.seq) is None:
        raise PlanInputError(
            "the sequence length is not known and the activations were not counted from the "
            "model: the memory per GPU and the FLOPs per sample would be guesses (one token "
            "per sample); give `seq`, the tokens per training sequence (1 for a model whose "
            "samples are not sequences)")
    usable = int(cl.memory_bytes * (1 - headroom))
    res = PlanResult(spec=spec, training=tr, cluster=cl, mfu=mfu, usable_bytes=usable, measured=measured)
    every: list[Candidate] = []
    groups, res.thinned = _degrees(spec, tr, cl)
    rcs = _recompute_options(spec, tr)
    for tp, pp, dp, micros in groups:
        per_dp = tr.global_batch // dp
        for zero in (range(4) if dp > 1 else (0,)):
            for rc in rcs:
                for off in ((False, True) if zero >= 1 else (False,)):
                    for b in micros:
                        m = per_dp // b
                        for v in _interleavings(spec, pp, m):
                            lay = Layout(dp=dp, tp=tp, pp=pp, zero=zero, recompute=rc, offload=off,
                                         micro_batch=b, virtual_stages=v)
                            mem = memory(spec, tr, lay, m, measured)
                            t = step_time(spec, tr, cl, lay, mfu)
                            over = max(0, mem.total_bytes - usable)
                            every.append(Candidate(layout=lay, memory=mem, timing=t, fits=over == 0,
                                                   over_bytes=over))
    res.evaluated = len(every)
    if not every:
        raise PlanInputError(
            f"no layout of {cl.gpus} GPUs divides the global batch of {tr.global_batch}: "
            "give a global batch divisible by the data-parallel degree (e.g. a multiple of "
            f"{cl.gpus})")
    fits = [c for c in every if c.fits]
    res.ranked = _rank(fits)
    res.rejected = _alternatives(res, every)
    res.why = why(res, res.ranked[0]) if fits else _why_none(res, every)
    return res


_Group = tuple[int, int, int, list[int]]
"""(TP, PP, DP, the micro-batch sizes to try)."""


def _degrees(spec: ModelSpec, tr: Training, cl: Cluster) -> tuple[list[_Group], str | None]:
    """The parallel degrees and micro-batch sizes to evaluate, and what was thinned to keep
    the layouts within :data:`MAX_LAYOUTS` (None: nothing). Thinning keeps a geometric
    ladder — first the micro-batch sizes, then the pipeline degrees, the ratio doubling until
    the count fits — so every scale stays represented and the search stays well under a
    second."""
    tps = [t for t in _divisors(cl.gpus) if t <= cl.gpus_per_node
           and (spec.heads is None or spec.heads % t == 0)
           and (spec.kv_heads is None or spec.kv_heads % t == 0)]
    if spec.hidden is None:
        tps = [1]
    full: list[tuple[int, list[int]]] = []
    for tp in tps:
        pps = [pp for pp in _divisors(cl.gpus // tp)
               if pp == 1 or (spec.layers and spec.hidden and spec.layers % pp == 0)]
        full.append((tp, pps))
    rcs = len(_recompute_options(spec, tr))

    def build(pp_ratio: float, b_ratio: float) -> tuple[list[_Group], int]:
        groups: list[_Group] = []
        n = 0
        for tp, pps in full:
            for pp in _ladder(pps, pp_ratio) if pp_ratio > 1 else pps:
                dp = cl.gpus // (tp * pp)
                if tr.global_batch % dp:
                    continue
                per_dp = tr.global_batch // dp
                micros = [b for b in _divisors(per_dp) if b <= MAX_MICRO_BATCH]
                if b_ratio > 1:
                    micros = _ladder(micros, b_ratio)
                groups.append((tp, pp, dp, micros))
                n += (7 if dp > 1 else 1) * rcs * sum(
                    len(_interleavings(spec, pp, per_dp // b)) for b in micros)
        return groups, n

    groups, n = build(1, 1)
    if n <= MAX_LAYOUTS:
        return groups, None
    whole_count = n
    pp_ratio, b_ratio = 1.0, 2.0
    while True:
        groups, n = build(pp_ratio, b_ratio)
        if n <= MAX_LAYOUTS or (pp_ratio > 1e6 and b_ratio > 1e6):
            break
        if pp_ratio == 1.0 and b_ratio == 2.0:
            pp_ratio = 2.0
        else:
            pp_ratio, b_ratio = pp_ratio * 2, b_ratio * 2
    return groups, (f"{whole_count:,} layouts in all: evaluated {n:,}, with micro-batch sizes "
                    f"at least {b_ratio:g}× apart" + (f" and pipeline degrees at least "
                                                      f"{pp_ratio:g}× apart" if pp_ratio > 1
                                                      else "")
                    + f" (at most {MAX_LAYOUTS:,} layouts per search)")


def _family(lay: Layout) -> str:
    if lay.tp > 1 and lay.pp > 1:
        return "tensor + pipeline parallel"
    if lay.tp > 1:
        return "tensor parallel"
    if lay.pp > 1:
        return "pipeline parallel"
    return {0: "DDP (replicated)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}[lay.zero]


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


def _alternatives(res: PlanResult, every: list[Candidate]) -> list[tuple[str, str]]:
    """For each family of layouts other than the chosen one's: its best, and why it lost."""
    best = res.best
    out: list[tuple[str, str]] = []
    seen = {_family(best.layout)} if best else set()
    by_family: dict[str, list[Candidate]] = {}
    for c in every:
        by_family.setdefault(_family(c.layout), []).append(c)
    for fam, cs in by_family.items():
        if fam in seen:
            continue
        ok = [c for c in cs if c.fits]
        if ok:
            c = _rank(ok)[0]
            assert best is not None
            slower = c.timing.step_s - best.timing.step_s
            t = c.timing
            bound = max((("data-parallel communication", t.dp_exposed_s),
                         ("tensor-parallel communication", t.tp_comm_s),
                         ("the pipeline bubble", t.compute_s * t.bubble_fraction /
                          max(1e-12, 1 - t.bubble_fraction)),
                         ("pipeline sends", t.pp_exposed_s)), key=lambda x: x[1])
            why = (f"{slower * 1e3:,.0f} ms slower per step ({c.timing.step_s:.3g} s vs "
                   f"{best.timing.step_s:.3g} s)"
                   + (f": {bound[0]} costs {bound[1] * 1e3:,.0f} ms" if bound[1] > 0 else ""))
        else:
            c = min(cs, key=lambda c: c.over_bytes)
            top = max(c.memory.terms, key=lambda t: t.bytes)
            why = (f"does not fit by {_gb(c.over_bytes)} even as {c.layout.name} "
                   f"({_gb(c.memory.total_bytes)} per GPU, of which {top.name} "
                   f"{_gb(top.bytes)}; {_gb(res.usable_bytes)} usable)")
        out.append((fam, why))
    return out


def why(res: PlanResult, c: Candidate) -> str:
    """One paragraph: what fits how, why these degrees and this ZeRO stage, the batch split,
    and the predicted step."""
    lay, t, mem = c.layout, c.timing, c.memory
    cl, tr = res.cluster, res.training
    acc = res.accumulation(lay)
    parts = [f"{lay.name} fits in {_gb(mem.total_bytes)} of the {_gb(res.usable_bytes)} "
             f"usable per GPU ({', '.join(f'{x.name} {_gb(x.bytes)}' for x in mem.terms if x.bytes)})."]
    if lay.tp > 1:
        parts.append(f"Tensor parallelism {lay.tp} stays within a node of {cl.gpus_per_node} "
                     f"GPUs (its {t.tp_comm_s * 1e3:,.0f} ms of all-reduces per step run over "
                     "the node's links and are not hidden).")
    if lay.pp > 1:
        parts.append(f"{lay.pp} pipeline stages of {(res.spec.layers or 0) // lay.pp} layers: "
                     f"{acc} micro-batches per step keep the bubble at "
                     f"{t.bubble_fraction:.1%}.")
    parts.append(_zero_why(res, c) + ".")
    if lay.recompute != "none":
        parts.append(f"{lay.recompute.capitalize()} activation recompute: without it the "
                     "activations do not fit, or a larger micro-batch it allows is faster.")
    if lay.offload:
        parts.append("The optimizer state lives on the host: nothing else fits.")
    parts.append(f"Micro-batch {lay.micro_batch} × {acc} accumulation × DP {lay.dp} = global "
                 f"batch {tr.global_batch}.")
    parts.append(f"Predicted step {t.step_s:.3g} s: compute {t.compute_s:.3g} s at MFU "
                 f"{res.mfu:.0%}" + (f", bubble {t.bubble_fraction:.1%}" if t.bubble_fraction
                                     else "")
                 + f", exposed communication {t.comm_exposed_s * 1e3:,.0f} ms.")
    return " ".join(parts)


def _zero_why(res: PlanResult, c: Candidate) -> str:
    """Why this ZeRO stage: the stage below it, same degrees, recompute and micro-batch, does
    not fit (by how much) or is predicted slower."""
    lay = c.layout
    what = {0: "DDP (model states replicated, the least communication)",
            1: "ZeRO-1 (optimizer state sharded)",
            2: "ZeRO-2 (optimizer state and gradients sharded)",
            3: "ZeRO-3 / FSDP (parameters sharded too)"}[lay.zero]
    if lay.zero == 0:
        return f"{what}: no sharding is needed"
    lower = dataclasses.replace(lay, zero=lay.zero - 1, offload=False)
    m = res.training.global_batch // (lay.dp * lay.micro_batch)
    mem = memory(res.spec, res.training, lower, m, res.measured)
    over = mem.total_bytes - res.usable_bytes
    if over > 0:
        return (f"{what}: the stage below needs {_gb(mem.total_bytes)} per GPU, "
                f"{_gb(over)} over the usable memory")
    t = step_time(res.spec, res.training, res.cluster, lower, res.mfu)
    return (f"{what}: the stage below fits but is predicted {t.step_s:.3g} s per step against "
            f"{c.timing.step_s:.3g} s")


def _why_none(res: PlanResult, every: list[Candidate]) -> str:
    c = min(every, key=lambda c: c.over_bytes)
    return (f"No layout of {res.cluster.gpus} × {res.cluster.gpu_name} fits: the closest, "
            f"{c.layout.name}, needs {_gb(c.memory.total_bytes)} per GPU, "
            f"{_gb(c.over_bytes)} over the {_gb(res.usable_bytes)} usable. More GPUs, GPUs "
            "with more memory, or a shorter sequence.")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobProjection:
    """The whole job at a candidate's predicted speed."""

    steps: int
    job_time_s: float
    cost: float | None
    """At the price per GPU-hour; None without one."""
    energy_kwh: float | None
    """At every GPU's board power limit for the whole job: an upper bound; None when the
    GPU's is not known."""


def project(res: PlanResult, c: Candidate, steps: int) -> JobProjection:
    """The job of ``steps`` optimizer steps at ``c``'s predicted step time.

    Args:
        res: the plan (its cluster's GPUs, price and power).
        c: the candidate layout.
        steps: optimizer steps of the job.

    Returns:
        A :class:`JobProjection`: job time (s), cost (price per GPU-hour × GPU-hours; None
        without a price) and energy (kWh; None without the GPU's power).

    Raises:
        PlanInputError: ``steps`` is not a whole number within its limit.
    """
    whole("steps", steps, what="optimizer steps of the job")
    cl = res.cluster
    t = c.timing.step_s * steps
    hours = t / 3600
    cost = hours * cl.gpus * cl.price_per_gpu_hour if cl.price_per_gpu_hour is not None \
        else None
    energy = hours * cl.gpus * cl.power_w / 1000 if cl.power_w is not None else None
    return JobProjection(steps=steps, job_time_s=t, cost=cost, energy_kwh=energy)
