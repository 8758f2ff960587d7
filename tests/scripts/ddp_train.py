"""A plain gloo DDP loop (no redline in it); with --slow-rank R, rank R loads data 30 ms slower
per batch."""

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--crash-rank", type=int, default=-1)
p.add_argument("--crash-at", type=int, default=-1)
p.add_argument("--log-loss", action="store_true",
               help="all-reduce the loss every step, as loops that log a global loss do")
p.add_argument("--killed", action="store_true",
               help="the crashing rank dies by SIGKILL (no chance to report) instead of exiting")
p.add_argument("--skip-layer", action="store_true",
               help="the model holds a layer its forward never uses (find_unused_parameters)")
args = p.parse_args()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
        self.aux = nn.Linear(64, 64)  # used by another task's head; not in this forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Batches(Dataset):
    def __init__(self, slow: bool) -> None:
        self.slow = slow

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.slow:
            time.sleep(0.03 / 8)
        return torch.randn(64), torch.randn(1)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(
    Net() if args.skip_layer else nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)),
    find_unused_parameters=args.skip_layer)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Batches(rank == args.slow_rank), batch_size=8)
for i, (x, y) in enumerate(loader):
    if i == args.steps:
        break
    if rank == args.crash_rank and i == args.crash_at:
        if args.killed:
            os.kill(os.getpid(), signal.SIGKILL)
        raise SystemExit(3)
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if args.log_loss:
        dist.all_reduce(loss.detach())
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
