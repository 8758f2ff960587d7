"""Run under torchrun (2 processes, gloo): accumulate() on an FSDP2 model (fully_shard per block
and on the root) reduces gradients once per effective batch — set_requires_gradient_sync(False)
on every micro-batch but the last — and leaves each rank's shard of the full batch's gradient."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from redline.tune.accumulate import accumulate


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.Tanh()),
                        nn.Sequential(nn.Linear(16, 16), nn.Tanh()), nn.Linear(16, 3))
    ref = nn.Sequential(nn.Sequential(nn.Linear(8, 16), nn.Tanh()),
                        nn.Sequential(nn.Linear(16, 16), nn.Tanh()), nn.Linear(16, 3))
    ref.load_state_dict(net.state_dict())
    for block in net[:2]:
        fully_shard(block)
    fully_shard(net)
    g = torch.Generator().manual_seed(1)
    x_all = torch.randn(world * 20, 8, generator=g)
    y_all = torch.randint(0, 3, (world * 20,), generator=g)
    x, y = x_all[rank * 20:(rank + 1) * 20], y_all[rank * 20:(rank + 1) * 20]
    reductions = []
    names = [n for n in ("all_reduce", "reduce_scatter_tensor", "reduce_scatter_single")
             if hasattr(dist, n)]
    originals = {n: getattr(dist, n) for n in names}

    def counting(name):  # every gradient reduction FSDP2 issues goes through one of these
        def call(*a, **k):
            reductions.append(name)
            return originals[name](*a, **k)
        return call

    for n in names:
        setattr(dist, n, counting(n))
    loss_fn = lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])  # noqa: E731
    accumulate(net, (x, y), 6, loss_fn)  # micro-batches 6, 6, 6, 2
    for n in names:
        setattr(dist, n, originals[n])
    nn.functional.cross_entropy(ref(x_all), y_all).backward()
    err = 0.0
    for p, q in zip(net.parameters(), ref.parameters(), strict=True):
        full = p.grad.full_tensor()
        err = max(err, (full - q.grad).abs().max().item())
    out = {"rank": rank, "reductions": len(reductions), "max_abs_err": err}
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
