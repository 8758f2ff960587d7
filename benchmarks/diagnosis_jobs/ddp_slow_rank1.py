"""2-rank DDP (gloo) MLP regression reading samples from a store; rank 1's reads are slower."""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _peer import step, training
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class RemoteSamples(Dataset):
    """Samples fetched one by one from a remote store; each read waits for its latency."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, latency_s: float) -> None:
        self.x, self.y, self.latency_s = x, y, latency_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(self.latency_s)
        return self.x[i], self.y[i]


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
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)  # two ranks share the host's cores
    torch.manual_seed(0)
    x = torch.randn(8192, 128)
    y = x[:, :4].sum(1)
    # rank 1's node reads from a slower replica: 3x the per-sample latency
    ds = RemoteSamples(x, y, latency_s=0.001 * (3 if rank == 1 else 1))
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=DistributedSampler(ds, seed=0))
    model = DDP(MLP())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    done = 0
    with training(f"ddp_slow_rank1_rank{rank}"):
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
