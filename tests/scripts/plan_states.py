"""Run under torchrun (gloo, CPU): after one Adam step, each rank's live bytes of parameters,
gradients and optimizer state under DDP and under FSDP2 (fully_shard per block and on the
root), next to what redline.plan predicts for the same layout (fp32 Adam: 4 + 4 + 8 bytes per
parameter, replicated or sharded over the ranks)."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from redline.plan import Layout, Training, from_module, model_states


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(96, 96), nn.GELU()) for _ in range(4)],
                         nn.Linear(96, 8))


def live_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> int:
    seen: dict[int, int] = {}
    tensors = []
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        tensors.append(local)
        if p.grad is not None:
            g = p.grad
            tensors.append(g.to_local() if hasattr(g, "to_local") else g)
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                tensors.append(v.to_local() if hasattr(v, "to_local") else v)
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr() or id(s)] = s.nbytes()
    return sum(seen.values())


def step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    x = torch.randn(4, 96)
    nn.functional.mse_loss(model(x), torch.zeros(4, 8)).backward()
    opt.step()


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = from_module(net())
    tr = Training(global_batch=4 * world, precision="fp32", optimizer="adam")
    out = {"world": world}
    # DDP: the gradients are the buckets' views, so DDP keeps no second copy of them.
    ddp = DDP(net(), gradient_as_bucket_view=True)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    step(ddp, opt)
    pred = model_states(spec, tr, Layout(dp=world, zero=0))
    out["ddp"] = {"measured": live_bytes(ddp, opt), "predicted": pred.total_bytes}
    model = net()
    for block in model[:4]:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step(model, opt)
    pred = model_states(spec, tr, Layout(dp=world, zero=3))
    states = pred.total_bytes - pred.of("gathered groups")  # resharded after the step
    out["fsdp"] = {"measured": live_bytes(model, opt), "predicted": states}
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
