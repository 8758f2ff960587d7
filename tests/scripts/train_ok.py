"""A plain training script nobody wrote for redline: argparse, a DataLoader, an optimizer."""
import argparse
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--exit-code", type=int, default=0)
args = p.parse_args()
print(f"argv={sys.argv[1:]} name={__name__}")
ds = TensorDataset(torch.randn(256, 16), torch.randint(0, 3, (256,)))
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = 0
for _ in range(args.epochs):
    for x, y in DataLoader(ds, batch_size=16):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
print(f"trained {steps} steps")
sys.exit(args.exit_code)
