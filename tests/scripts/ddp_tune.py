"""A DDP training setup for `redline tune` under torchrun (gloo, CPU), written as users write
them: the process group initialized once, the model wrapped in DistributedDataParallel, each
rank loading its shard through a DistributedSampler, gradient accumulation of 4."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from redline.tune import TrainSetup


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def redline_setup() -> TrainSetup:
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    calls = os.environ.get("TUNE_CALLS_DIR")
    if calls:  # one line per setup built: ranks that took one path built as many
        path = os.path.join(calls, f"rank{dist.get_rank()}.txt")
        with open(path, "a") as f:
            f.write("setup\n")
        with open(path) as f:
            built = len(f.readlines())
        if dist.get_rank() == 1 and built == int(os.environ.get("TUNE_FAIL_AT", "0")):
            raise FileNotFoundError("/data/shard-1.tar is missing")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                        nn.Linear(128, 4))
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(1024, 32, generator=g), torch.randint(0, 4, (1024,), generator=g))
    loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds, seed=0), drop_last=True)
    model = DDP(net)
    limit = os.environ.get("TUNE_MEMORY_LIMIT")
    return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                      loader=loader, loss_fn=_loss, accumulation_steps=4, run_steps=1000,
                      memory_limit_bytes=int(limit) if limit else None)


if __name__ == "__main__":
    raise SystemExit("redline tune imports this file; it is not run")
