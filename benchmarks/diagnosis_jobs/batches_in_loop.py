"""MLP on tabular rows kept as Python lists; each batch is sampled and built inside the loop."""

import random

import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn

STEPS = 60
BATCH_SIZE = 128
FEATURES = 48


def load_rows(n: int = 5_000) -> tuple[list[list[float]], list[int]]:
    rnd = random.Random(0)
    rows = [[rnd.gauss(0.0, 1.0) for _ in range(FEATURES)] for _ in range(n)]
    labels = [int(r[0] + r[1] > 0) for r in rows]
    return rows, labels


class TabularMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 128), nn.ReLU(), nn.Linear(128, 2))

    def forward(self, x):
        return self.net(x)


def main() -> None:
    torch.manual_seed(0)
    rows, labels = load_rows()
    means = [sum(col) / len(rows) for col in zip(*rows, strict=False)]
    model = TabularMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rnd = random.Random(1)
    with training("batches_in_loop"):
        for _ in range(STEPS):
            idx = rnd.sample(range(len(rows)), BATCH_SIZE)
            # centre each feature and clip outliers, row by row
            batch = [[min(max(v - m, -3.0), 3.0) for v, m in zip(rows[i], means, strict=False)] for i in idx]
            xb = torch.tensor(batch)
            yb = torch.tensor([labels[i] for i in idx])
            with step(model):
                loss = F.cross_entropy(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
