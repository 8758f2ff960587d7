"""MLP trainer that starts background helper processes (a hash-precomputing cache warmer)."""

import argparse
import hashlib
import multiprocessing as mp

import torch
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def warm_cache(worker: int) -> None:
    # precomputes content hashes of the shard index forever; CPU-bound
    digest = str(worker).encode()
    while True:
        for _ in range(10_000):
            digest = hashlib.sha256(digest).digest()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                                 nn.Linear(1024, 10))

    def forward(self, x):
        return self.net(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    helpers = [mp.Process(target=warm_cache, args=(w,), daemon=True) for w in range(2)]
    for h in helpers:
        h.start()
    loader = DataLoader(TensorDataset(torch.randn(8192, 256), torch.randint(0, 10, (8192,))),
                        batch_size=args.batch_size, shuffle=True)
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    done = 0
    try:
        with training("child_cpu_burner"):
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
    finally:
        for h in helpers:
            h.terminate()
    print(f"final loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
