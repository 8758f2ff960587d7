"""MLP on feature vectors stored one file per sample on a slow (network-like) filesystem."""

import argparse
import os
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.utils.data import DataLoader, Dataset

READ_LATENCY_S = 0.002  # per-file latency of the remote store


class FileDataset(Dataset):
    def __init__(self, root: str, n: int = 1024, dim: int = 256) -> None:
        rng = np.random.default_rng(0)
        self.paths = []
        for i in range(n):
            path = os.path.join(root, f"sample_{i:05d}.npy")
            np.save(path, rng.standard_normal(dim, dtype=np.float32))
            self.paths.append(path)
        self.labels = rng.integers(0, 10, n)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        time.sleep(READ_LATENCY_S)
        x = np.load(self.paths[i])
        return torch.from_numpy(x), int(self.labels[i])


class MLP(nn.Module):
    def __init__(self, dim: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                 nn.Linear(512, 10))

    def forward(self, x):
        return self.net(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as root:
        loader = DataLoader(FileDataset(root), batch_size=args.batch_size, shuffle=True)
        model = MLP()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        done = 0
        with training("storage_latency"):
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
