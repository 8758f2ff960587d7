"""Compute-bound MLP classifier on in-memory features with a plain DataLoader."""

import argparse

import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class MLP(nn.Module):
    def __init__(self, dim: int = 512, hidden: int = 1024) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 20))

    def forward(self, x):
        return self.net(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(16_384, 512)
    y = torch.randint(0, 20, (16_384,))
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    done = 0
    with training("clean_mlp"):
        while done < args.steps:
            for xb, yb in loader:
                with step(model):
                    loss = F.cross_entropy(model(xb), yb)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                done += 1
                if done >= args.steps:
                    break
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
