"""The model a plan is made for: its parameter count and, for transformer formulas, its shape.

Three sources: plain numbers; a Hugging Face-style ``config.json`` (the keys GPT-2, Llama,
Mistral, BERT and T5-style configs use); or the model itself, built on the meta device so a
70B model costs no memory (:func:`from_module`). Where the parameter count is not given it is
the GPT formula ``12·L·h²·(1 + 13/(12h) + (V + s)/(12·L·h))`` (Narayanan et al., SC21, §5.1).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from redline.plan.hardware import PlanInputError


@dataclass(frozen=True, slots=True)
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

    def __post_init__(self) -> None:
        if self.params < 1:
            raise PlanInputError(f"the parameter count must be >= 1, got {self.params}")
        for n in ("layers", "hidden", "heads", "seq", "vocab", "ffn_hidden",
                  "largest_layer_params"):
            v = getattr(self, n)
            if v is not None and v < 1:
                raise PlanInputError(f"--{n.replace('_', '-')} must be >= 1, got {v}")
        if self.hidden and self.heads and self.hidden % self.heads:
            raise PlanInputError(f"hidden size {self.hidden} is not divisible by {self.heads} "
                                 "heads")

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
    """A spec from numbers; without ``params``, the GPT formula from the shape."""
    formula = None
    if params is None:
        missing = [n for n, v in (("--layers", layers), ("--hidden", hidden),
                                  ("--vocab", vocab), ("--seq", seq)) if v is None]
        if missing:
            raise PlanInputError("give --params, or the shape to count them from (missing "
                                 f"{', '.join(missing)})")
        assert layers and hidden and vocab and seq
        params = gpt_params(layers, hidden, vocab, seq)
        formula = "12·L·h²·(1 + 13/(12h) + (V + s)/(12·L·h)) (Narayanan et al., SC21)"
    return ModelSpec(int(params), layers, hidden, heads, seq, vocab, ffn_hidden,
                     source="numbers", params_formula=formula)


_KEYS = {
    "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "vocab": ("vocab_size",),
    "seq": ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"),
    "ffn_hidden": ("intermediate_size", "n_inner", "ffn_dim", "d_ff"),
}


def from_config_json(path: str | os.PathLike[str], seq: int | None = None) -> ModelSpec:
    """A spec from a Hugging Face-style config.json (read only; nothing is downloaded). The
    parameter count: Llama-style (gated MLP) or GPT-style blocks from the shape, embeddings
    included (untied unless ``tie_word_embeddings``)."""
    try:
        with open(path, encoding="utf-8") as f:
            cfg: Any = json.load(f)
    except FileNotFoundError:
        raise PlanInputError(f"no config at {str(path)!r}: give a local config.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PlanInputError(f"{path} is not a JSON config ({e})") from None
    if not isinstance(cfg, dict):
        raise PlanInputError(f"{path} holds a JSON {type(cfg).__name__}, expected an object")
    got: dict[str, int | None] = {}
    for field, keys in _KEYS.items():
        v = next((cfg[k] for k in keys if isinstance(cfg.get(k), int)), None)
        got[field] = v
    missing = [f"{f} ({' / '.join(_KEYS[f])})" for f in ("hidden", "layers", "heads", "vocab")
               if got[f] is None]
    if missing:
        raise PlanInputError(f"{path} lacks {'; '.join(missing)}: expected a transformer "
                             "config with these keys, or give the numbers (--params, --layers, "
                             "--hidden, --heads, --vocab)")
    h, n_layers, v = got["hidden"], got["layers"], got["vocab"]
    assert h and n_layers and v
    s = seq or got["seq"]
    gated = "llama" in str(cfg.get("model_type", "")).lower() or \
        cfg.get("hidden_act") == "silu" or "mistral" in str(cfg.get("model_type", "")).lower()
    ffn = got["ffn_hidden"] or 4 * h
    assert got["heads"]
    kv = cfg.get("num_key_value_heads")
    kv_heads = kv if isinstance(kv, int) and kv > 0 else got["heads"]
    head_dim = h // got["heads"]
    attn = h * h * 2 + 2 * h * head_dim * kv_heads  # q, o; k, v (grouped-query attention)
    mlp = (3 if gated else 2) * h * ffn
    block = attn + mlp + 4 * h  # norms (and biases, roughly)
    tied = bool(cfg.get("tie_word_embeddings", not gated))
    # Learned position embeddings (GPT-2, OPT, BERT); rotary ones (Llama, Mistral) have none.
    positions = (got["seq"] or 0) * h if not gated and "rope_theta" not in cfg else 0
    params = n_layers * block + v * h * (1 if tied else 2) + positions
    formula = (f"L·(attention {attn:,} + {'gated ' if gated else ''}MLP {mlp:,} + norms) + "
               f"embeddings V·h{'' if tied else ' ×2 (untied output)'}"
               f"{' + positions s·h' if positions else ''} from {os.path.basename(path)}")
    return ModelSpec(params, n_layers, h, got["heads"], s, v, ffn, largest_layer_params=block,
                     source=f"config {path}", params_formula=formula)


def from_module(model: Any, seq: int | None = None) -> ModelSpec:
    """A spec counted from a model (build it on the meta device: ``with torch.device("meta"):
    model = Net()``): trainable parameters (shared ones once) and the largest block's."""
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
    return ModelSpec(total, seq=seq, largest_layer_params=largest,
                     source=f"{type(model).__qualname__} (counted)")
