"""Memory per GPU of a parallel layout, every term with the formula it used.

Model states follow ZeRO (Rajbhandari et al., SC20; restated in the Ultra-Scale Playbook): Ψ
parameters, 16-bit parameters and gradients (2 + 2 bytes) and k bytes of optimizer state per
parameter (mixed-precision Adam: fp32 master weights, momentum and variance, k = 12), sharded
over the data-parallel degree N_d by stage: ZeRO-1 the optimizer state, ZeRO-2 also the
gradients, ZeRO-3 / FSDP also the parameters. Tensor (t) and pipeline (p) parallelism split
every state t·p ways (embeddings are assumed split as evenly as the blocks).

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", arXiv 2205.05198, Table 2), per layer and micro-batch of b sequences of s
tokens, hidden h, a heads, 16-bit activations: ``s·b·h·(34 + 5·a·s/h)`` bytes; with TP
``s·b·h·(10 + 24/t + 5·a·s/(h·t))``; with TP and sequence parallelism ``s·b·h/t·(34 +
5·a·s/h)``; with selective recompute the ``5·a·s/h`` term (attention scores, softmax, dropout)
is recomputed, not stored; full recompute stores the layer input ``2·s·b·h`` (÷ t with SP). With
FlashAttention / SDPA the s² term is never stored (llm-analysis, ``flash_attn``), so selective
recompute then saves nothing more. A 1F1B pipeline's first stage holds min(p, m) micro-batches
in flight of its L/p layers (Ultra-Scale Playbook, pipeline parallelism).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from redline.plan.activations import MeasuredActivations
from redline.plan.limits import PlanInputError, whole
from redline.plan.spec import ModelSpec

RECOMPUTE = ("none", "selective", "full")
OPTIMIZERS = ("adam", "sgd-momentum", "sgd")
PRECISIONS = ("bf16", "fp16", "fp32")


@dataclass(frozen=True, slots=True, kw_only=True)
class Training:
    """The training shape: what every layout must reproduce."""

    global_batch: int
    """Sequences (samples) per optimizer step, over all data-parallel ranks."""
    seq: int | None = None
    """Tokens per sequence (None: the model's, or 1 for non-sequence models)."""
    precision: str = "bf16"
    """'bf16' / 'fp16' (mixed precision: 16-bit weights and gradients, fp32 master weights in
    the optimizer) or 'fp32'."""
    optimizer: str = "adam"
    """'adam' (AdamW too), 'sgd-momentum' or 'sgd'."""
    fp32_grad_accumulation: bool = False
    """Gradients accumulated in an fp32 buffer (4 bytes/parameter more, sharded under ZeRO-2/3:
    the playbook's 20Ψ form, and DeepSpeed's estimators)."""
    flash_attention: bool = True
    """Attention through FlashAttention / SDPA: no s² activations stored."""

    def __post_init__(self) -> None:
        whole("global_batch", self.global_batch, what="sequences per optimizer step")
        if self.seq is not None:
            whole("seq", self.seq, what="tokens per sequence")
        if self.precision not in PRECISIONS:
            raise PlanInputError(f"`precision` must be one of {', '.join(PRECISIONS)}, got "
                                 f"{self.precision!r}")
        if self.optimizer not in OPTIMIZERS:
            raise PlanInputError(f"`optimizer` must be one of {', '.join(OPTIMIZERS)}, got "
                                 f"{self.optimizer!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """One way to spread the job: degrees, ZeRO stage, recompute, offload, micro-batch."""

    dp: int
    tp: int = 1
    pp: int = 1
    zero: int = 0
    """0 (DDP), 1, 2, 3 (= FSDP full sharding)."""
    recompute: str = "none"
    offload: bool = False
    """Optimizer state (and its step) on the host: ZeRO-Offload."""
    micro_batch: int = 1
    sequence_parallel: bool = True
    """With TP > 1: Megatron's sequence parallelism (norms and dropout split over the TP
    ranks)."""
    virtual_stages: int = 1
    """With PP > 1: model chunks per GPU of the interleaved 1F1B schedule (Narayanan et al.,
    SC21): the bubble ÷ v, pipeline sends × v."""

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def name(self) -> str:
        z = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3/FSDP"}[self.zero]
        parts = [f"{z} dp{self.dp}"]
        if self.tp > 1:
            parts.append(f"tp{self.tp}{'+sp' if self.sequence_parallel else ''}")
        if self.pp > 1:
            parts.append(f"pp{self.pp}" + (f"×v{self.virtual_stages} interleaved"
                                            if self.virtual_stages > 1 else ""))
        if self.recompute != "none":
            parts.append(f"{self.recompute} recompute")
        if self.offload:
            parts.append("optimizer offload")
        parts.append(f"micro-batch {self.micro_batch}")
        return " · ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Term:
    """One term of the memory per GPU."""

    name: str
    bytes: int
    formula: str


@dataclass(slots=True, kw_only=True)
class Memory:
    """Memory per GPU of one layout, bytes, as a sum of named terms with their formulas."""

    terms: list[Term] = field(default_factory=list)
    host_bytes_per_gpu: int = 0
    """Optimizer state kept on the host for this GPU (offload)."""
    activations_known: bool = True

    @property
    def total_bytes(self) -> int:
        return sum(t.bytes for t in self.terms)

    def of(self, name: str) -> int:
        return sum(t.bytes for t in self.terms if t.name == name)


def bytes_per_parameter(tr: Training) -> tuple[int, int, int, str]:
    """(parameter, gradient, optimizer-state bytes per parameter, what k is)."""
    if tr.precision == "fp32":
        k = {"adam": 8, "sgd-momentum": 4, "sgd": 0}[tr.optimizer]
        return 4, 4, k, {"adam": "k = 8: Adam momentum 4 + variance 4",
                         "sgd-momentum": "k = 4: momentum", "sgd": "k = 0"}[tr.optimizer]
    k = {"adam": 12, "sgd-momentum": 8, "sgd": 4}[tr.optimizer]
    return 2, 2, k, {"adam": "k = 12: fp32 master 4 + momentum 4 + variance 4",
                     "sgd-momentum": "k = 8: fp32 master 4 + momentum 4",
                     "sgd": "k = 4: fp32 master weights"}[tr.optimizer]


def model_states(spec: ModelSpec, tr: Training, lay: Layout) -> Memory:
    """Parameters, gradients and optimizer state per GPU, and the FSDP gathered groups.

    Args:
        spec: the model (parameters; block size for ZeRO-3).
        tr: the training (precision, optimizer, fp32 gradient accumulation).
        lay: the layout (tensor/pipeline/data degrees, ZeRO stage, offload).

    Returns:
        The :class:`Memory` per GPU, bytes, term by term; optimizer state offloaded to the host
        counts in ``host_bytes_per_gpu``.
    """
    p, g, k, k_why = bytes_per_parameter(tr)
    mp = lay.tp * lay.pp
    psi = spec.params / mp
    mp_txt = f"Ψ/{mp}" if mp > 1 else "Ψ"
    n = lay.dp
    mem = Memory()

    def shard(by: bool) -> tuple[float, str]:
        return (n, f"/{n}") if by and n > 1 else (1, "")

    d, t = shard(lay.zero >= 3)
    mem.terms.append(Term(name="parameters", bytes=round(p * psi / d), formula=f"{p}·{mp_txt}{t}"))
    d, t = shard(lay.zero >= 2)
    mem.terms.append(Term(name="gradients", bytes=round(g * psi / d), formula=f"{g}·{mp_txt}{t}"))
    if tr.fp32_grad_accumulation and tr.precision != "fp32":
        mem.terms.append(Term(name="fp32 gradient accumulation", bytes=round(4 * psi / d),
                              formula=f"4·{mp_txt}{t}"))
    d, t = shard(lay.zero >= 1)
    opt = round(k * psi / d)
    if lay.offload:
        mem.host_bytes_per_gpu = opt
        mem.terms.append(Term(name="optimizer state", bytes=0,
                              formula=f"{k}·{mp_txt}{t} on the host (offload; {k_why})"))
    else:
        mem.terms.append(Term(name="optimizer state", bytes=opt, formula=f"{k}·{mp_txt}{t} ({k_why})"))
    if lay.zero >= 3 and n > 1 and not (spec.largest_layer_params or spec.layers):
        mem.terms.append(Term(name="gathered groups", bytes=0,
                              formula="unknown: one block's size is not known "
                              "(give the layers, a config or a model); not counted"))
    elif lay.zero >= 3 and n > 1:
        # FSDP2 unshards one group for compute and prefetches the next (the fully_shard
        # docstring's forward/backward prefetch): two blocks' 16-bit parameters, unsharded.
        blk = spec.block_params / lay.tp
        mem.terms.append(Term(name="gathered groups", bytes=round(2 * p * blk),
                              formula=f"2 groups × {p}·block ({spec.block_params:,} params"
                              f"{f'/{lay.tp}' if lay.tp > 1 else ''}): current + prefetched"))
    return mem


def activations_per_layer(spec: ModelSpec, tr: Training, lay: Layout) -> tuple[float, str]:
    """(bytes per layer per micro-batch, formula) for the layout's TP/SP/recompute."""
    assert spec.hidden and spec.heads
    s = tr.seq or spec.seq
    assert s
    b, h, a, t = lay.micro_batch, spec.hidden, spec.heads, lay.tp
    sbh = s * b * h
    scale = 2 if tr.precision == "fp32" else 1  # the paper counts 16-bit activations
    drop_s2 = tr.flash_attention or lay.recompute == "selective"
    why = ("FlashAttention: no s² term" if tr.flash_attention else
           "selective recompute: the s² term recomputed") if drop_s2 else ""
    if lay.recompute == "full":
        div = t if (t > 1 and lay.sequence_parallel) else 1
        return scale * 2 * sbh / div, f"2·s·b·h{f'/{t}' if div > 1 else ''} (full recompute: the layer input)"
    s2 = 0.0 if drop_s2 else 5 * a * s / h
    if t == 1:
        v = sbh * (34 + s2)
        f = "s·b·h·34" if drop_s2 else "s·b·h·(34 + 5·a·s/h)"
    elif lay.sequence_parallel:
        v = sbh / t * (34 + s2)
        f = "s·b·h/t·34" if drop_s2 else "s·b·h/t·(34 + 5·a·s/h)"
    else:
        v = sbh * (10 + 24 / t + s2 / t)
        f = "s·b·h·(10 + 24/t)" if drop_s2 else "s·b·h·(10 + 24/t + 5·a·s/(h·t))"
    return scale * v, f + (f"; {why}" if why else "") + (" ×2 (fp32)" if scale == 2 else "")


def memory(spec: ModelSpec, tr: Training, lay: Layout, microbatches: int,
           measured: MeasuredActivations | None = None) -> Memory:
    """Everything per GPU: model states, then activations of the layers this GPU holds (the
    first pipeline stage, which holds the most micro-batches in flight), and the logits.
    ``measured``: activations counted from the model (:mod:`redline.plan.activations`), used
    without recompute; the formula serves the recompute variants.

    Args:
        spec: the model.
        tr: the training (precision, sequence length).
        lay: the layout.
        microbatches: micro-batches per optimizer step (bounds those in flight in 1F1B).
        measured: activations counted from the model; None = the transformer formula.

    Returns:
        The :class:`Memory` per GPU, bytes, term by term with each formula; activations
        unknown (``activations_known`` False) for a non-transformer without ``measured``.
    """
    mem = model_states(spec, tr, lay)
    inflight: float = min(lay.pp, microbatches) if lay.pp > 1 else 1
    flight = f" × {inflight:g} micro-batches in flight (1F1B)" if inflight > 1 else ""
    if lay.pp > 1 and lay.virtual_stages > 1:
        # Korthikanti et al. 2022, §4.2.3: the interleaved schedule's first stage holds
        # (1 + (p − 1)/(p·v)) times the activations of the plain 1F1B one.
        extra = 1 + (lay.pp - 1) / (lay.pp * lay.virtual_stages)
        inflight *= extra
        flight += f" × (1 + (p−1)/(p·v)) = {extra:.3g} (interleaved)"
    if measured is not None and lay.recompute == "none":
        act = measured.at(lay.micro_batch) / lay.pp / lay.tp * inflight
        mem.terms.append(Term(
            name="activations", bytes=round(act),
            formula=f"{measured.bytes_per_sample:,.0f} B/sample × b + {measured.fixed_bytes:,.0f} B "
            f"({measured.source})" + (f" ÷ {lay.pp} stages" if lay.pp > 1 else "")
            + (f" ÷ t={lay.tp} (sequence parallel splits every activation)" if lay.tp > 1
               else "") + flight))
        return mem
    if not spec.transformer:
        mem.activations_known = False
        mem.terms.append(Term(name="activations", bytes=0,
                              formula="unknown: give the model (counted on the meta "
                              "device) or its shape (layers, hidden, heads, seq)"))
        return mem
    assert spec.layers
    per_layer, f = activations_per_layer(spec, tr, lay)
    layers = spec.layers / lay.pp
    act = per_layer * layers * inflight
    mem.terms.append(Term(name="activations", bytes=round(act), formula=f"{f} × {layers:g} layers{flight}"))
    if lay.recompute == "full":
        # Recomputing a layer rebuilds its whole working set once.
        work, wf = activations_per_layer(spec, tr, dataclasses.replace(lay, recompute="none"))
        mem.terms.append(Term(name="recompute working set", bytes=round(work), formula=f"one layer: {wf}"))
    if spec.vocab:
        s = tr.seq or spec.seq or 1
        mem.terms.append(Term(name="logits", bytes=round(4 * s * lay.micro_batch * spec.vocab / lay.tp),
                              formula=f"4·s·b·V{f'/{lay.tp}' if lay.tp > 1 else ''} (fp32 logits for "
                              "the loss, last stage)"))
    return mem
