"""GRU sequence classifier with per-sample bookkeeping records and a gc.collect() each step."""

import argparse
import gc

import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class GRUClassifier(nn.Module):
    def __init__(self, features: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 5)

    def forward(self, x):
        _, h = self.gru(x)
        return self.head(h[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(4096, 24, 16)
    y = torch.randint(0, 5, (4096,))
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)
    model = GRUClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    history: list[dict] = []
    done = 0
    with training("gc_bookkeeping"):
        while done < args.steps:
            for xb, yb in loader:
                with step(model):
                    losses = F.cross_entropy(model(xb), yb, reduction="none")
                    loss = losses.mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    # keep a record per sample for later analysis, and free memory eagerly
                    for j, value in enumerate(losses.tolist()):
                        history.append({"step": done, "index": j, "loss": value,
                                        "tags": [f"s{done}", f"b{j}"], "extra": {"ok": value < 2.0}})
                    gc.collect()
                done += 1
                if done >= args.steps:
                    break
    print(f"final loss {loss.item():.3f}, {len(history)} records")


if __name__ == "__main__":
    main()
