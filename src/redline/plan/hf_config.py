"""A model's spec from a Hugging Face-style ``config.json``, read only (nothing is downloaded).

Decoder-only families (GPT-2, OPT, BERT, GPT-NeoX, Llama, Mistral, Qwen, Gemma: grouped-query
attention, gated MLPs, learned or rotary positions, tied or untied embeddings) and
encoder–decoder ones (T5 and its v1.1 / mT5 variants, BART: two stacks, the decoder's
cross-attention, ``d_kv`` × heads, relative-position biases, one shared embedding) are counted
block by block, as the models built from these configs by ``transformers`` count them (tests
compare within 1 %). Every value used is checked: a count must be a whole number within its
limit, key/value heads must divide the heads, and the sequence length must be known — from the
config's position table or given — because the activations and the FLOPs depend on it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from redline.plan.limits import LIMITS, PlanInputError, whole
from redline.plan.spec import ModelSpec

_KEYS = {
    "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers"),
    "heads": ("num_attention_heads", "n_head", "num_heads", "n_heads",
              "encoder_attention_heads"),
    "vocab": ("vocab_size",),
    "seq": ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"),
    "ffn_hidden": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "encoder_ffn_dim"),
    "kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim", "d_kv"),
    "decoder_layers": ("decoder_layers", "num_decoder_layers"),
    "decoder_heads": ("decoder_attention_heads",),
    "decoder_ffn": ("decoder_ffn_dim",),
    "buckets": ("relative_attention_num_buckets",),
}
"""Field → the config keys that hold it, first found wins."""

_LIMIT_OF = {"decoder_layers": "layers", "decoder_heads": "heads", "decoder_ffn": "ffn_hidden",
             "buckets": "seq"}

GATED_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3",
    "olmo", "olmo2", "cohere", "granite", "internlm2", "starcoder2_gated", "deepseek_v3"})
"""``model_type``s whose MLP is gated (SwiGLU / GeGLU: three matrices)."""

T5_TYPES = frozenset({"t5", "mt5", "umt5", "longt5", "switch_transformers"})
"""Encoder–decoder families without biases, with RMS norms and relative-position biases."""

MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Read:
    """The config's numbers, each checked, with the key it came from."""

    cfg: dict[str, Any]
    """The parsed JSON object."""
    name: str
    """The file, for messages."""
    values: dict[str, int]
    """Field → value, for the fields the config holds."""
    keys: dict[str, str]
    """Field → the key it was read from."""

    def get(self, field: str) -> int | None:
        return self.values.get(field)


def _load(path: str | os.PathLike[str]) -> tuple[dict[str, Any], str]:
    if not isinstance(path, str | os.PathLike):
        raise PlanInputError(f"`path` must be the path of a config.json (or of its folder), "
                             f"got a {type(path).__name__}")
    name = os.fspath(path)
    if os.path.isdir(name):
        inner = os.path.join(name, "config.json")
        if not os.path.isfile(inner):
            raise PlanInputError(
                f"`path` {name!r} is a folder and has no config.json: give the config file, "
                "or the folder a Hugging Face model was saved to (it holds config.json)")
        name = inner
    try:
        # utf-8-sig: a byte-order mark (as some editors save) is read past, not refused.
        with open(name, encoding="utf-8-sig") as f:
            cfg: Any = json.load(f)
    except FileNotFoundError:
        raise PlanInputError(f"`path`: no config at {name!r}: give a local config.json "
                             "(nothing is downloaded)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PlanInputError(f"`path`: {name} is not a JSON config ({e}): give the model's "
                             "config.json") from None
    except OSError as e:
        raise PlanInputError(f"`path`: {name} cannot be read ({e.strerror or e}): give a "
                             "readable config.json") from None
    if not isinstance(cfg, dict):
        raise PlanInputError(f"`path`: {name} holds a JSON {type(cfg).__name__}, expected an "
                             "object of the model's settings (config.json)")
    return cfg, name


def _read(cfg: dict[str, Any], name: str) -> _Read:
    values: dict[str, int] = {}
    keys: dict[str, str] = {}
    for field, options in _KEYS.items():
        key = next((k for k in options if cfg.get(k) is not None), None)
        if key is None:
            continue
        v = cfg[key]
        limit = LIMITS[_LIMIT_OF.get(field, field)].maximum
        whole_number = (not isinstance(v, bool) and isinstance(v, int | float)
                        and math.isfinite(v) and v == int(v))
        if not whole_number or not 1 <= v <= limit:
            raise PlanInputError(
                f"{name}: {key} is {_show(v)}, expected a whole number from 1 to "
                f"{limit:,.0f} ({LIMITS[_LIMIT_OF.get(field, field)].why}): correct the "
                "config")
        values[field], keys[field] = int(v), key
    return _Read(cfg=cfg, name=name, values=values, keys=keys)


def _show(v: object) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return repr(v) if isinstance(v, str) else str(v)


def from_config_json(path: str | os.PathLike[str], seq: int | None = None) -> ModelSpec:
    """A spec from a Hugging Face-style config.json, or a folder holding one.

    Args:
        path: the config file, or a folder with ``config.json`` in it (as ``save_pretrained``
            writes it).
        seq: tokens per training sequence; required where the config has no position table
            (T5, or a config without ``max_position_embeddings``), and at most the table's
            size where the positions are learned (GPT-2, OPT, BERT, BART).

    Returns:
        The spec, its parameter count with the formula it used.

    Raises:
        PlanInputError: the file cannot be read or is not a transformer config, a value is
            not a whole number within its limit, the heads do not divide, the sequence length
            is unknown or longer than the learned positions, or the model is a mixture of
            experts (not counted from a config).
    """
    cfg, name = _load(path)
    r = _read(cfg, name)
    text = cfg.get("text_config")
    missing = [f"{f} ({' / '.join(_KEYS[f])})" for f in ("hidden", "layers", "heads", "vocab")
               if r.get(f) is None]
    if missing:
        nested = (" — the language model's settings are under text_config: give that object "
                  "as its own config" if isinstance(text, dict) else "")
        raise PlanInputError(f"{name} lacks {'; '.join(missing)}{nested}: expected a "
                             "transformer config with these keys, or give the numbers "
                             "(`params`, `layers`, `hidden`, `heads`, `vocab`)")
    for k in MOE_KEYS:
        experts = cfg.get(k)
        if isinstance(experts, int) and experts > 1:
            raise PlanInputError(
                f"{name} is a mixture of experts ({k} {experts}): its parameters and FLOPs "
                "per token are not counted from a config here; give the model as code (a "
                "script with a setup factory)")
    if seq is not None:
        seq = whole("seq", seq, what="tokens per sequence")
    model_type = str(cfg.get("model_type", "")).lower()
    encdec = cfg.get("is_encoder_decoder") is True or r.get("decoder_layers") is not None \
        or model_type in T5_TYPES
    count = _encoder_decoder(r, model_type) if encdec else _decoder_only(r, model_type)
    table = r.get("seq")
    if table is None and seq is None:
        raise PlanInputError(
            f"{name} gives no sequence length (none of {', '.join(_KEYS['seq'])}"
            f"{'; T5 uses relative positions' if model_type in T5_TYPES else ''}): the "
            "activations and the FLOPs per sample depend on it; give `seq` (tokens per "
            "training sequence)")
    if count.learned_positions and seq is not None and table is not None and seq > table:
        raise PlanInputError(
            f"`seq` {seq:,} is longer than the model's {table:,} learned positions "
            f"({r.keys['seq']} in {os.path.basename(name)}): a learned position table has no "
            "row past its end; give `seq` <= its size")
    s = seq or table
    assert s is not None
    hidden, heads = r.values["hidden"], r.values["heads"]
    return ModelSpec(params=count.params, layers=count.layers, hidden=hidden, heads=heads, seq=s,
                     vocab=r.values["vocab"],
                     ffn_hidden=count.ffn, largest_layer_params=count.largest_block,
                     source=f"config {name}", params_formula=count.formula,
                     kv_heads=count.kv_heads, head_dim=r.get("head_dim"))


@dataclass(frozen=True, slots=True, kw_only=True)
class _Count:
    """What the config's formula found."""

    params: int
    """Trainable parameters."""
    layers: int
    """Blocks, both stacks of an encoder–decoder together."""
    ffn: int
    """The MLP's inner width (the encoder's)."""
    largest_block: int
    """Parameters of the largest block (the unit ZeRO-3/FSDP gathers)."""
    kv_heads: int | None
    """Key/value heads, where fewer than the heads."""
    learned_positions: bool
    """Whether positions are a learned table (a sequence cannot exceed it)."""
    formula: str
    """How ``params`` was counted, for the report."""


def _head_dim(r: _Read, heads: int) -> int:
    hd = r.get("head_dim")
    if hd is not None:
        return hd
    h = r.values["hidden"]
    if h % heads:
        raise PlanInputError(
            f"{r.name}: hidden size {h} is not divisible by {heads} heads ({r.keys['hidden']}, "
            f"{r.keys['heads']}) and no head_dim is given: correct the config")
    return h // heads


def _kv_heads(r: _Read, heads: int) -> int:
    kv = r.get("kv_heads")
    if kv is None:
        if "num_key_value_heads" in r.cfg and r.cfg["num_key_value_heads"] is not None:
            raise PlanInputError(f"{r.name}: num_key_value_heads is "
                                 f"{_show(r.cfg['num_key_value_heads'])}, expected a divisor "
                                 "of num_attention_heads")
        return heads
    if heads % kv:
        raise PlanInputError(
            f"{r.name}: num_key_value_heads {kv} does not divide num_attention_heads {heads}: "
            "grouped-query attention shares each key/value head among the same number of "
            f"query heads; correct the config (divisors of {heads}: "
            f"{', '.join(str(d) for d in range(1, heads + 1) if heads % d == 0)})")
    return kv


def _decoder_only(r: _Read, model_type: str) -> _Count:
    cfg = r.cfg
    h, n_layers, v = r.values["hidden"], r.values["layers"], r.values["vocab"]
    heads = r.values["heads"]
    hd = _head_dim(r, heads)
    kv = _kv_heads(r, heads)
    act = str(cfg.get("hidden_act") or cfg.get("hidden_activation") or "").lower()
    gated = model_type in GATED_TYPES or act in ("silu", "swiglu")
    ffn = r.get("ffn_hidden") or 4 * h
    inner = heads * hd
    attn = 2 * h * inner + 2 * h * hd * kv  # q, o; k, v (grouped-query attention)
    mlp = (3 if gated else 2) * h * ffn
    if gated:
        # RMS norms (weights only); biases on q, k, v where the config says so (Qwen2).
        extra = 2 * h + ((inner + 2 * hd * kv) if cfg.get("attention_bias") is True
                         or model_type == "qwen2" else 0)
    else:
        # Two LayerNorms (weight and bias) and the biases of q, k, v, o and the MLP (GPT-2,
        # OPT, BERT, GPT-NeoX).
        extra = 4 * h + inner + 2 * hd * kv + h + ffn + h
    block = attn + mlp + extra
    tied = bool(cfg.get("tie_word_embeddings", not gated))
    rotary = gated or any(k in cfg for k in ("rope_theta", "rotary_pct", "rotary_emb_base",
                                             "rope_scaling")) \
        or cfg.get("position_embedding_type") == "rotary"
    table = r.get("seq")
    # Learned positions (GPT-2, BERT; OPT keeps 2 rows more); rotary ones have none.
    positions = 0 if rotary or table is None else \
        (table + (2 if model_type == "opt" else 0)) * h
    final_norm = (1 if gated else 2) * h
    params = n_layers * block + v * h * (1 if tied else 2) + positions + final_norm
    formula = (f"L·(attention {attn:,} + {'gated ' if gated else ''}MLP {mlp:,} + norms and "
               f"biases {extra:,}) + embeddings V·h{'' if tied else ' ×2 (untied output)'}"
               f"{' + positions s·h' if positions else ''} from {os.path.basename(r.name)}")
    return _Count(params=params, layers=n_layers, ffn=ffn, largest_block=block,
                  kv_heads=kv if kv != heads else None,
                  learned_positions=bool(positions), formula=formula)


def _encoder_decoder(r: _Read, model_type: str) -> _Count:
    cfg = r.cfg
    d, v = r.values["hidden"], r.values["vocab"]
    enc_layers = r.values["layers"]
    dec_layers = r.get("decoder_layers") or enc_layers
    heads = r.values["heads"]
    dec_heads = r.get("decoder_heads") or heads
    hd = _head_dim(r, heads)
    dec_hd = r.get("head_dim") or _head_dim(r, dec_heads)
    ffn = r.get("ffn_hidden") or 4 * d
    dec_ffn = r.get("decoder_ffn") or ffn
    t5 = model_type in T5_TYPES or "d_kv" in cfg
    gated = str(cfg.get("feed_forward_proj", "")).startswith("gated")
    bias = 0 if t5 else 1
    norm = d if t5 else 2 * d  # RMS weight (T5) or LayerNorm weight and bias

    def attention(n_heads: int, width: int) -> int:
        inner = n_heads * width
        return 4 * d * inner + bias * (3 * inner + d)

    def mlp(f: int) -> int:
        return (3 if gated else 2) * d * f + bias * (f + d)

    enc_block = attention(heads, hd) + mlp(ffn) + 2 * norm
    dec_block = 2 * attention(dec_heads, dec_hd) + mlp(dec_ffn) + 3 * norm  # + cross-attention
    stacks = enc_layers * enc_block + dec_layers * dec_block
    table = r.get("seq")
    learned = not t5 and table is not None
    if t5:
        # One relative-position bias table per stack (in its first layer) and a final norm.
        buckets = r.get("buckets") or 32
        extra = buckets * heads + buckets * dec_heads + 2 * norm
        what = "relative-position biases and final norms"
    else:
        # BART: learned positions (2 rows of offset) and an embedding LayerNorm per stack.
        extra = (2 * ((table or 0) + 2) * d if learned else 0) + 2 * norm
        what = "learned positions and embedding norms"
    tied = bool(cfg.get("tie_word_embeddings", True))
    params = stacks + v * d * (1 if tied else 2) + extra
    formula = (f"encoder {enc_layers}·{enc_block:,} + decoder {dec_layers}·{dec_block:,} "
               f"(self- and cross-attention) + shared embedding V·d"
               f"{'' if tied else ' ×2 (untied output)'} + {what} from "
               f"{os.path.basename(r.name)}; activations and FLOPs take source and target "
               "as one sequence length each")
    return _Count(params=params, layers=enc_layers + dec_layers, ffn=ffn,
                  largest_block=max(enc_block, dec_block), kv_heads=None,
                  learned_positions=learned, formula=formula)
