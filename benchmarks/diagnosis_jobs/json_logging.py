"""Tiny transformer language model; logs a JSON line of loss and per-parameter statistics each step."""

import argparse
import json
import os
import tempfile

import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB = 512
SEQ = 32


class TinyTransformer(nn.Module):
    def __init__(self, d: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.zeros(SEQ, d))
        layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=128, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.out = nn.Linear(d, VOCAB)

    def forward(self, tokens):
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.out(self.encoder(self.emb(tokens) + self.pos, mask=mask, is_causal=True))


def param_stats(model: nn.Module) -> dict:
    stats = {}
    for name, p in model.named_parameters():
        w = p.detach().flatten()
        g = p.grad.detach().flatten()
        stats[name] = {
            "mean": w.mean().item(), "std": w.std().item(), "min": w.min().item(),
            "max": w.max().item(), "norm": w.norm().item(), "grad_norm": g.norm().item(),
            "grad_max": g.abs().max().item(),
            "quantiles": torch.quantile(w, torch.tensor([0.01, 0.25, 0.5, 0.75, 0.99])).tolist(),
            "hist": torch.histc(w, bins=32).tolist(),
            "update_ratio": (g.norm() / (w.norm() + 1e-12)).item(),
        }
    return stats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    data = torch.randint(0, VOCAB, (2048, SEQ + 1))
    loader = DataLoader(TensorDataset(data), batch_size=args.batch_size, shuffle=True)
    model = TinyTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    log_path = os.path.join(tempfile.mkdtemp(), "train_log.jsonl")
    done = 0
    with open(log_path, "w") as log, training("json_logging"):
        while done < args.steps:
            for (seq,) in loader:
                with step(model):
                    logits = model(seq[:, :-1])
                    loss = F.cross_entropy(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    record = {"step": done, "loss": loss.item(), "lr": opt.param_groups[0]["lr"],
                              "params": param_stats(model)}
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                done += 1
                if done >= args.steps:
                    break
    print(f"final loss {loss.item():.3f}, log at {log_path}")


if __name__ == "__main__":
    main()
