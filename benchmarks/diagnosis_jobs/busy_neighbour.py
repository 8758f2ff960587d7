"""GRU forecaster on windows of a synthetic multivariate series, data in memory."""

import argparse

import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Windows(Dataset):
    def __init__(self, length: int = 20_000, window: int = 32, features: int = 8) -> None:
        t = torch.arange(length, dtype=torch.float32)
        self.series = torch.stack([torch.sin(t / (5 + k)) for k in range(features)], 1)
        self.series += 0.05 * torch.randn_like(self.series)
        self.window = window

    def __len__(self) -> int:
        return len(self.series) - self.window - 1

    def __getitem__(self, i: int):
        return self.series[i:i + self.window], self.series[i + self.window]


class Forecaster(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 128) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, features)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out[:, -1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Windows(), batch_size=args.batch_size, shuffle=True)
    model = Forecaster()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    done = 0
    with training("busy_neighbour"):
        while done < args.steps:
            for x, y in loader:
                with step(model):
                    loss = F.mse_loss(model(x), y)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                done += 1
                if done >= args.steps:
                    break
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
