"""Gloo DDP jobs written the way training scripts are (the loop inside ``main()``, so the
model is gone by the time the script returns), each with the causes of some findings.

    torchrun --nproc_per_node 2 ddp_jobs.py knobs|skip_accumulate|slow_data

knobs: find_unused_parameters=True on a model that uses every parameter, 10 KB buckets (one
per layer), and 105 MB of parameters without gradient_as_bucket_view.
skip_accumulate: a layer the forward never uses under find_unused_parameters=True, and 4
micro-batches a step, each synced (no no_sync()); every rank alike.
slow_data: rank 1 reads each sample 3× slower than rank 0 (2 ms against 6 ms a sample,
8 samples a batch); 3 gradient buckets a step.
"""

import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

MODE = sys.argv[1]


class Samples(Dataset):
    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.randn(64), torch.randn(1)


class WithAux(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
        self.aux = nn.Linear(64, 64)  # another task's head: not in this forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def mlp(layers: int) -> nn.Sequential:
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(64, 64), nn.ReLU())],
                         nn.Linear(64, 1))


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    steps, micro, sleep_s = 20, 1, 0.0
    if MODE == "knobs":
        # 4096×6400 weights: 100 MiB of fp32 parameters, beside 8 small layers
        net = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 6400), nn.ReLU(),
                            nn.Linear(6400, 64), mlp(8))
        model = nn.parallel.DistributedDataParallel(net, find_unused_parameters=True,
                                                    bucket_cap_mb=0.01)
        steps = 5
    elif MODE == "skip_accumulate":
        model = nn.parallel.DistributedDataParallel(WithAux(), find_unused_parameters=True)
        micro = 4
    else:
        model = nn.parallel.DistributedDataParallel(mlp(6), bucket_cap_mb=0.02)
        sleep_s = 0.006 if rank == 1 else 0.002
        steps = 30
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Samples(sleep_s), batch_size=8)
    batches = iter(loader)
    for step in range(steps):
        for _ in range(micro):
            x, y = next(batches)
            loss = nn.functional.mse_loss(model(x), y) / micro
            loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
