"""Trains forever on a DataLoader with 2 workers, each writing its pid to the folder given."""

import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

PIDS = sys.argv[1]


class Slow(Dataset):
    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.005)
        return torch.randn(4), torch.randn(1)


def note_pid(_: int) -> None:
    with open(os.path.join(PIDS, str(os.getpid())), "w"):
        pass


if __name__ == "__main__":
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Slow(), batch_size=4, num_workers=2, worker_init_fn=note_pid)
    for i, (x, y) in enumerate(loader):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if i == 12:
            print("READY", flush=True)
