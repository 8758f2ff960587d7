"""A 2-rank gloo DDP job measured by redline.watch() in repeated windows; rank 1 is slowed in
its data loading, in its backward, or not at all. Rank 0 writes each window's merged report.

    torchrun --nproc_per_node 2 ddp_straggler.py data|backward|balanced REPS OUT_DIR
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import redline
from redline.report.json_io import to_dict

SCENARIO, REPS, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
SLOW_S = 0.03


class Batches(Dataset):
    def __init__(self, slow: bool) -> None:
        self.slow = slow

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.slow:
            time.sleep(SLOW_S / 8)  # a batch of 8 samples: 30 ms slower to load
        return torch.randn(64), torch.randn(1)


class Burn(torch.autograd.Function):
    """Identity forward; its backward does 30 ms of extra matrix work (rank 1 only)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        a = torch.randn(128, 128)
        end = time.perf_counter() + SLOW_S
        while time.perf_counter() < end:
            a = torch.tanh(a @ a)
        return g


class Net(nn.Module):
    def __init__(self, burn: bool) -> None:
        super().__init__()
        self.burn = burn
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.burn:
            h = Burn.apply(h)
        return self.b(torch.relu(h))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Net(SCENARIO == "backward" and rank == 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Batches(SCENARIO == "data" and rank == 1), batch_size=8)
    it = iter(loader)
    for rep in range(REPS):
        with redline.watch(warmup_steps=2, count_flops=False) as w:
            for _ in range(32):
                x, y = next(it)
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
        rep_ = w.report(show=False)
        if rank == 0:
            with open(os.path.join(OUT, f"rep{rep}.json"), "w") as f:
                json.dump(to_dict(rep_), f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
