"""A small CPU training loop whose runs differ in one controlled way, for `redline compare`:
an extra host sync per step (``loss.item()`` and a large tensor's ``.tolist()``), a slower
per-sample transform in the dataset, another batch size, or only another seed (which must not
matter). Its embedding table is updated densely every step (Adam over 1M parameters): a cost
per step that a smaller batch does not shrink, as in recommendation models."""
import argparse
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=64)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--sync", action="store_true", help="read the loss and a large tensor back "
               "to Python every step")
p.add_argument("--slow-transform", action="store_true", help="a costlier per-sample transform")
p.add_argument("--steps", type=int, default=10_000)
p.add_argument("--barrier", default=None, help="a folder: wait there until --parties runs are "
               "ready, so runs started together train under the same host load")
p.add_argument("--parties", type=int, default=1)
args = p.parse_args()
torch.manual_seed(args.seed)
torch.set_num_threads(1)
WIDTH, ROWS = 64, 30_000
SLOW_CPU_S = 0.0006
"""CPU seconds a sample takes at least with --slow-transform (64 samples: +38 ms a step)."""


class Samples(Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, WIDTH)
        self.ids = torch.randint(0, ROWS, (n, 8))
        self.y = torch.randint(0, 10, (n,))
        self.mix = torch.randn(WIDTH, WIDTH) / WIDTH ** 0.5

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        start = time.thread_time()
        x = self.x[i]
        for _ in range(25 if args.slow_transform else 1):
            x = torch.tanh(self.mix @ x)
        # the slower transform costs at least SLOW_CPU_S of CPU a sample, whatever the CPU's
        # speed: 25 small matrix products alone take 0.1 ms on one host and 1 ms on another
        while args.slow_transform and time.thread_time() - start < SLOW_CPU_S:
            x = torch.tanh(self.mix @ x)
        return self.ids[i], x, self.y[i]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(ROWS, 32)
        self.head = nn.Sequential(nn.Linear(32 + WIDTH, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.table(ids).mean(1), x], 1))


model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
big = torch.randn(400_000)
if args.barrier is not None:
    os.makedirs(args.barrier, exist_ok=True)
    open(os.path.join(args.barrier, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(args.barrier)) < args.parties and time.monotonic() < deadline:
        time.sleep(0.01)
done = 0
while done < args.steps:
    for ids, x, y in DataLoader(Samples(4096), batch_size=args.batch, shuffle=True):
        loss = nn.functional.cross_entropy(model(ids, x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.sync:  # what a logging line does: the loss and a tensor back in Python
            logged = (loss.item(), big.tolist())
        done += 1
        if done >= args.steps:
            break
