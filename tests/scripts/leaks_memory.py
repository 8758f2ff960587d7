"""A training loop that keeps a tensor from every step in a list (a leak), or with
``--leak-mib 0`` keeps nothing (the flat control); ``--until N`` stops keeping after step N
(memory that rises and then plateaus, as an allocator's cache does)."""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--leak-mib", type=float, default=1.0)
p.add_argument("--until", type=int, default=None)
p.add_argument("--sleep-s", type=float, default=0.01)
args = p.parse_args()
ds = TensorDataset(torch.randn(args.steps * 8, 16), torch.randint(0, 3, (args.steps * 8,)))
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
kept: list[torch.Tensor] = []
for step, (x, y) in enumerate(DataLoader(ds, batch_size=8)):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if args.leak_mib and (args.until is None or step < args.until):
        kept.append(torch.ones(int(args.leak_mib * 2**20 / 4)))  # written: resident
    time.sleep(args.sleep_s)
print(f"kept {len(kept)} tensors")
