"""A plain gloo FSDP2 loop (``fully_shard`` per block and on the root; no redline in it); with
--slow-rank R, rank R does 20 ms of its own work between steps (as a loop that logs or
evaluates on one rank does); with --micro K, K micro-batches per optimizer step, reducing
gradients after each unless --sync-last-only."""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

p = argparse.ArgumentParser()
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--micro", type=int, default=1)
p.add_argument("--sync-last-only", action="store_true")
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(128, 128), nn.ReLU()) for _ in range(4)],
                      nn.Linear(128, 1))
for block in model[:4]:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
for _ in range(args.steps):
    x, y = torch.randn(16, 128, generator=g), torch.randn(16, 1, generator=g)
    if rank == args.slow_rank:
        time.sleep(0.02)
    for k in range(args.micro):
        if args.sync_last_only:
            model.set_requires_gradient_sync(k == args.micro - 1)
        nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
