"""Two gloo ranks under torchrun, DDP over a linear model; rank 1 sleeps forever after 6 steps
(rank 0 then waits in the next backward's all-reduce)."""

import time

import torch
import torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.parallel.DistributedDataParallel(nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
while True:
    if rank == 1 and step == 6:
        print("RANK 1 HANGS", flush=True)
        while True:
            time.sleep(1)
    nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
    opt.step()
    opt.zero_grad()
    step += 1
