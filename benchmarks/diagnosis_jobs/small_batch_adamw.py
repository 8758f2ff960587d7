"""A ~10 M-parameter MLP trained with AdamW at batch size 2."""

import argparse

import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class BigMLP(nn.Module):
    def __init__(self, dim: int = 784, hidden: int = 2048) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(2048, 784), torch.randint(0, 10, (2048,))),
                        batch_size=args.batch_size, shuffle=True)
    model = BigMLP()
    print(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    done = 0
    with training("small_batch_adamw"):
        while done < args.steps:
            for x, y in loader:
                with step(model):
                    loss = F.cross_entropy(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                done += 1
                if done >= args.steps:
                    break
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
