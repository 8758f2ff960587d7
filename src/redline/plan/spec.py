"""The model a plan is made for: its parameter count and, for transformer formulas, its shape.

Three sources: plain numbers (:func:`from_numbers`, a given count checked against the shape);
a Hugging Face-style ``config.json`` (:mod:`redline.plan.hf_config`); or the model itself,
built on the meta device so a 70B model costs no memory (:func:`from_module`). Where the
parameter count is not given it is the GPT formula ``12·L·h²·(1 + 13/(12h) + (V + s)/(12·L·h))``
(Narayanan et al., SC21, §5.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redline.plan.limits import PlanInputError, whole

_FIELD_WORDS = {
    "layers": "transformer layers", "hidden": "hidden size", "heads": "attention heads",
    "seq": "tokens per sequence", "vocab": "vocabulary size", "ffn_hidden": "MLP inner width",
    "largest_layer_params": "parameters of the largest block", "kv_heads": "key/value heads",
    "head_dim": "width of one attention head",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """What the formulas need of a model (None: not known; a formula that needs it says so)."""

    params: int
    """Ψ: trainable parameters."""
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    seq: int | None = None
    """Training sequence length (tokens per sample)."""
    vocab: int | None = None
    ffn_hidden: int | None = None
    """The MLP's inner width (4h in GPT; 8h/3 with SwiGLU)."""
    largest_layer_params: int | None = None
    """Parameters of the largest module that is gathered whole under ZeRO-3/FSDP (one block)."""
    source: str = "numbers"
    params_formula: str | None = None
    """How ``params`` was obtained when it was not given or counted."""
    kv_heads: int | None = None
    """Key/value heads of grouped-query attention (None: one per attention head). They must
    divide ``heads``, and tensor parallelism must divide them."""
    head_dim: int | None = None
    """Width of one attention head when the config states it (T5's ``d_kv``, ``head_dim``);
    None: ``hidden ÷ heads``, which must then divide."""

    def __post_init__(self) -> None:
        whole("params", self.params, what="trainable parameters")
        for n, what in _FIELD_WORDS.items():
            v = getattr(self, n)
            if v is not None:
                whole(n, v, what=what)
        if self.hidden and self.heads and self.head_dim is None and self.hidden % self.heads:
            raise PlanInputError(
                f"hidden size {self.hidden} is not divisible by {self.heads} heads (`hidden`, "
                "`heads`): each head gets hidden ÷ heads dimensions; give a head count that "
                "divides the hidden size")
        if self.heads and self.kv_heads and self.heads % self.kv_heads:
            raise PlanInputError(
                f"{self.kv_heads} key/value heads do not divide {self.heads} attention heads "
                "(`kv_heads`, `heads`): grouped-query attention shares each key/value head "
                "among the same number of query heads; give a divisor of the heads")

    @property
    def transformer(self) -> bool:
        """Whether the shape the activation and TP formulas need is known."""
        return None not in (self.layers, self.hidden, self.heads, self.seq)

    @property
    def block_params(self) -> int:
        """One block's parameters (the unit ZeRO-3/FSDP gathers): given, else Ψ ÷ L, else Ψ."""
        if self.largest_layer_params:
            return self.largest_layer_params
        return self.params // self.layers if self.layers else self.params


def gpt_params(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """Narayanan et al. (SC21) §5.1: 12·L·h²·(1 + 13/(12h) + (V + s)/(12·L·h))."""
    return round(12 * layers * hidden**2 * (1 + 13 / (12 * hidden)
                                             + (vocab + seq) / (12 * layers * hidden)))


def from_numbers(*, params: float | None = None, layers: int | None = None,
                 hidden: int | None = None, heads: int | None = None, seq: int | None = None,
                 vocab: int | None = None, ffn_hidden: int | None = None) -> ModelSpec:
    """A spec from numbers; without ``params``, the GPT formula from the shape.

    Args:
        params: trainable parameters; checked against the shape where ``layers`` and
            ``hidden`` are given (:func:`shape_range`).
        layers: transformer blocks; None = unknown.
        hidden: the hidden size (model width); None = unknown.
        heads: attention heads; None = unknown.
        seq: tokens per training sequence; None = unknown.
        vocab: vocabulary size (tokens); None = unknown.
        ffn_hidden: the feed-forward layer's inner width; None = unknown.

    Without ``params``, ``layers``, ``hidden``, ``vocab`` and ``seq`` are required.

    Returns:
        The spec.

    Raises:
        PlanInputError: a value not finite, not whole, out of its limit, or ``params``
            outside what the shape can hold.
    """
    formula = None
    for n, v in (("layers", layers), ("hidden", hidden), ("heads", heads), ("seq", seq),
                 ("vocab", vocab), ("ffn_hidden", ffn_hidden)):
        if v is not None:
            whole(n, v, what=_FIELD_WORDS[n])
    if params is None:
        missing = [f"`{n}`" for n, v in (("layers", layers), ("hidden", hidden),
                                         ("vocab", vocab), ("seq", seq)) if v is None]
        if missing:
            raise PlanInputError("give `params`, or the shape to count them from (missing "
                                 f"{', '.join(missing)})")
        assert layers and hidden and vocab and seq
        count = gpt_params(layers, hidden, vocab, seq)
        formula = "12·L·h²·(1 + 13/(12h) + (V + s)/(12·L·h)) (Narayanan et al., SC21)"
    else:
        count = whole("params", params, what="trainable parameters")
        if layers and hidden:
            _check_against_shape(count, layers, hidden, vocab, seq, ffn_hidden)
    return ModelSpec(params=count, layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab,
                     ffn_hidden=ffn_hidden,
                     source="numbers", params_formula=formula)


SHAPE_MARGIN = 0.10
"""Slack on both ends of :func:`shape_range` (norms, biases, odd embeddings)."""


def shape_range(layers: int, hidden: int, vocab: int | None = None, seq: int | None = None,
                ffn_hidden: int | None = None) -> tuple[int, int]:
    """The fewest and the most parameters a dense transformer of this shape can have.

    Attention holds 2h² (query and output; grouped-query attention with one key/value head
    adds almost nothing) to 4h² (multi-head); the MLP 2·h·f (two matrices) to 3·h·f (gated,
    SwiGLU), its width f from ``ffn_hidden`` or, unknown, 2h to 8h (Gemma's gated 8h is the
    widest published). Embeddings add V·h (tied) to 2·V·h (untied) and s·h (learned
    positions). Each end moves by :data:`SHAPE_MARGIN`.

    Returns:
        (lowest, highest) parameter counts.
    """
    f_lo, f_hi = (ffn_hidden, ffn_hidden) if ffn_hidden else (2 * hidden, 8 * hidden)
    lo = layers * (2 * hidden**2 + 2 * hidden * f_lo) + (vocab or 0) * hidden
    hi = (layers * (4 * hidden**2 + 3 * hidden * f_hi + 13 * hidden)
          + 2 * (vocab or 0) * hidden + (seq or 0) * hidden)
    if not vocab:
        # Without the vocabulary the embeddings are unknown: allow an embedding as large as
        # the largest vocabulary published (about 256,000 tokens), untied.
        hi += 2 * 256_000 * hidden
    return round(lo * (1 - SHAPE_MARGIN)), round(hi * (1 + SHAPE_MARGIN))


def _check_against_shape(params: int, layers: int, hidden: int, vocab: int | None,
                         seq: int | None, ffn_hidden: int | None) -> None:
    lo, hi = shape_range(layers, hidden, vocab, seq, ffn_hidden)
    if lo <= params <= hi:
        return
    shape = ", ".join(f"`{n}` {v:,}" for n, v in (("layers", layers), ("hidden", hidden),
                                                  ("vocab", vocab), ("seq", seq),
                                                  ("ffn_hidden", ffn_hidden)) if v)
    gpt = (f"; the GPT formula counts {gpt_params(layers, hidden, vocab, seq):,} for it"
           if vocab and seq else "")
    raise PlanInputError(
        f"`params` {params:,} contradicts the shape ({shape}): a dense transformer of that "
        f"shape has {lo:,} to {hi:,} parameters{gpt}. Give the count that matches the shape, "
        "or leave `params` out to count it from the shape (a mixture-of-experts model is not "
        "planned from numbers: give it as code)")


def from_module(model: Any, seq: int | None = None) -> ModelSpec:
    """A spec counted from a model (build it on the meta device: ``with torch.device("meta"):
    model = Net()``): trainable parameters (shared ones once) and the largest block's.

    Args:
        model: a ``torch.nn.Module`` (meta device or real).
        seq: tokens per training sequence; None = unknown (not a sequence model, or given
            later to the training).

    Returns:
        The :class:`ModelSpec`: trainable parameters, the largest repeated block's parameters
        (the unit FSDP gathers), ``seq``, and the model's class as source.

    Raises:
        PlanInputError: ``model`` is not a ``torch.nn.Module`` or has no trainable parameter.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise PlanInputError(f"expected a torch.nn.Module, got {type(model).__qualname__}")
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    if not total:
        raise PlanInputError(f"{type(model).__qualname__} has no trainable parameters")
    # The unit FSDP wraps and gathers whole: the largest member of a repeated container (a
    # ModuleList / Sequential of blocks), else the largest module without children.
    def size(m: torch.nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    blocks = [c for m in model.modules()
              if isinstance(m, torch.nn.ModuleList | torch.nn.Sequential) and len(m) >= 2
              for c in m.children()]
    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    largest = max((size(c) for c in (blocks or leaves)), default=total) or total
    return ModelSpec(params=total, seq=seq, largest_layer_params=largest,
                     source=f"{type(model).__qualname__} (counted)")
