"""Run under torchrun (2 processes, gloo): accumulate() under DDP syncs gradients once per
effective batch and leaves every rank with the full batch's gradient."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from redline.tune.accumulate import accumulate


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    ref = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    ref.load_state_dict(net.state_dict())
    g = torch.Generator().manual_seed(1)
    x_all, y_all = torch.randn(world * 20, 8, generator=g), torch.randint(0, 3, (world * 20,), generator=g)
    x, y = x_all[rank * 20:(rank + 1) * 20], y_all[rank * 20:(rank + 1) * 20]
    model = DDP(net)
    calls = []

    def hook(state, bucket):  # count all-reduces
        calls.append(1)
        fut = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    model.register_comm_hook(None, hook)

    def loss_fn(m, b):
        return nn.functional.cross_entropy(m(b[0]), b[1])

    accumulate(model, (x, y), 6, loss_fn)  # micro-batches 6, 6, 6, 2
    # Reference: the mean loss over all ranks' samples, one pass, no DDP.
    nn.functional.cross_entropy(ref(x_all), y_all).backward()
    err = max((a.grad - b.grad).abs().max().item()
              for a, b in zip(net.parameters(), ref.parameters(), strict=True))
    out = {"rank": rank, "allreduce_calls": len(calls), "max_abs_err": err}
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    # Both ranks done with every collective before either tears gloo down: tearing down while
    # the peer still talks aborts the process ("terminate called without an active exception").
    dist.barrier()
    del model
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
