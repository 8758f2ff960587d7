"""``lm``: a small GPT-style language model on synthetic tokens, hand-written attention.

Tokens come from a fixed random bigram chain, so there is something to learn and nothing to
download. Attention is written out (QKᵀ → mask → softmax → ·V) as many research scripts do;
that is what the trace analysis flags as ``unfused_attention``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from redline.core.loader import LoaderSettings
from redline.workloads.base import Workload


@dataclass(kw_only=True, slots=True)
class LMConfig:
    """Knobs of the lm workload; the defaults are the naive configuration."""

    vocab: int = 512
    seq_len: int = 128
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    sequences: int = 1024
    batch_size: int = 8
    loader: LoaderSettings = field(default_factory=LoaderSettings)
    """The DataLoader's settings (naive: no workers, nothing pinned)."""
    accumulation_steps: int = 4
    """Micro-batches per optimizer step: the naive script accumulates small micro-batches
    (written for a small GPU), so its effective batch is batch_size × 4."""
    lr: float = 3e-4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be >= 1, got {self.accumulation_steps}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads "
                             f"({self.n_heads})")
        if self.batch_size < 1 or self.seq_len < 2:
            raise ValueError("batch_size must be >= 1 and seq_len >= 2")


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        out: torch.Tensor = self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return out


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class TinyGPT(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(1, cfg.seq_len, cfg.d_model))
        self.blocks = nn.Sequential(*[Block(cfg.d_model, cfg.n_heads)
                                      for _ in range(cfg.n_layers)])
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[:, : idx.shape[1]]
        out: torch.Tensor = self.head(self.ln(self.blocks(x)))
        return out


def synthetic_tokens(cfg: LMConfig) -> torch.Tensor:
    """[sequences, seq_len + 1] tokens from a random bigram chain (4 likely successors each)."""
    g = torch.Generator().manual_seed(cfg.seed)
    succ = torch.randint(0, cfg.vocab, (cfg.vocab, 4), generator=g)
    toks = torch.empty(cfg.sequences, cfg.seq_len + 1, dtype=torch.long)
    toks[:, 0] = torch.randint(0, cfg.vocab, (cfg.sequences,), generator=g)
    for t in range(1, cfg.seq_len + 1):
        pick = torch.randint(0, 4, (cfg.sequences,), generator=g)
        toks[:, t] = succ[toks[:, t - 1], pick]
    return toks


def _loss(model: nn.Module, batch: Any, device: torch.device) -> torch.Tensor:
    (toks,) = batch
    toks = toks.to(device, non_blocking=True)
    logits = model(toks[:, :-1])
    loss: torch.Tensor = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     toks[:, 1:].reshape(-1))
    return loss


def build_lm(cfg: LMConfig | None = None, device: torch.device | None = None,
             name: str = "lm") -> Workload:
    """The synthetic language-model workload: a small GPT on token ids from a random bigram
    chain, trained with AdamW, in the plain loop of :func:`train`.

    Args:
        cfg: the model, data and loop settings; None = :class:`LMConfig`'s defaults (``lm``).
        device: where the model trains; None = the CPU.
        name: the workload's name in reports.

    Returns:
        The :class:`Workload`: model (on ``device``), DataLoader, optimizer and loss.
    """
    cfg = cfg or LMConfig()
    device = device or torch.device("cpu")
    torch.manual_seed(cfg.seed)
    loader = DataLoader(TensorDataset(synthetic_tokens(cfg)), batch_size=cfg.batch_size,
                        shuffle=True, drop_last=True, **cfg.loader.loader_kwargs())
    model = TinyGPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    return Workload(name=name, model=model, loader=loader, optimizer=opt, loss_fn=_loss, device=device,
                    accumulation_steps=cfg.accumulation_steps)


def lm_large_config() -> LMConfig:
    """The ``lm-large`` preset: GPT-2 small's shape (12 layers, d_model 768, 12 heads; Radford
    et al., 2019) on 512-token sequences, with the same naive loop as ``lm`` (hand-written
    attention, 8 × 4 micro-batches, fp32, AdamW without fused kernels); sized for a GPU: about
    9 TFLOP per optimizer step (6 · 91 M parameters · 16,384 tokens, plus attention), where
    ``lm`` has 0.01. Its input is token ids (no decode), so unlike ``vision-large`` a fast GPU
    is not starved by the CPUs once the step is tuned.

    Returns:
        The preset's :class:`LMConfig` (vocabulary 8,192, 512 tokens, 4,096 sequences).
    """
    return LMConfig(vocab=8192, seq_len=512, d_model=768, n_layers=12, n_heads=12,
                    sequences=4096)
