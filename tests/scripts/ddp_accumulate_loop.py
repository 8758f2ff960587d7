"""A gloo DDP loop with gradient accumulation over 4 micro-batches, with or without no_sync()."""

import contextlib
import sys

import torch
import torch.distributed as dist
from torch import nn

no_sync = "--no-sync" in sys.argv
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(30):
    for micro in range(4):
        last = micro == 3
        ctx = model.no_sync() if no_sync and not last else contextlib.nullcontext()
        with ctx:
            x, y = torch.randn(8, 64), torch.randn(8, 1)
            (nn.functional.mse_loss(model(x), y) / 4).backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
