"""2-rank DDP (gloo) MLP regression wrapped with find_unused_parameters=True; torchrun --nproc-per-node 2."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                 nn.Linear(512, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)  # two ranks share the host's cores
    torch.manual_seed(0)
    x = torch.randn(8192, 128)
    y = x[:, :4].sum(1)
    ds = TensorDataset(x, y)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=DistributedSampler(ds, seed=0))
    model = DDP(MLP(), find_unused_parameters=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    done = 0
    with training(f"ddp_unused_rank{rank}"):
        while done < args.steps:
            for xb, yb in loader:
                with step(model):
                    loss = F.mse_loss(model(xb), yb)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                done += 1
                if done >= args.steps:
                    break
    if rank == 0:
        print(f"final loss {loss.item():.3f} on {os.environ.get('WORLD_SIZE')} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
