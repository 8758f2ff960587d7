"""The chosen layout as something to run: the torchrun command, a PyTorch snippet (DDP, or
FSDP2 ``fully_shard`` on a device mesh with tensor/pipeline parallel degrees, activation
checkpointing and the mixed-precision policy), and, where ZeRO is chosen, the equivalent
DeepSpeed config."""

from __future__ import annotations

from typing import Any

from redline.plan.hardware import Cluster
from redline.plan.memory import Layout, Training


def torchrun_command(cl: Cluster, script: str = "train.py") -> str:
    """The torchrun command line that starts the job on ``cl``.

    Args:
        cl: the cluster (one node: ``--standalone``; several: a c10d rendezvous at
            ``$MASTER_ADDR:29500``).
        script: the training script.

    Returns:
        The command, one line.
    """
    if cl.nodes == 1:
        return f"torchrun --standalone --nproc_per_node={cl.gpus} {script}"
    return (f"torchrun --nnodes={cl.nodes} --nproc_per_node={cl.gpus_per_node} "
            f"--rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:29500 --rdzv-id=$JOB_ID "
            f"{script}")


def deepspeed_config(tr: Training, lay: Layout) -> dict[str, Any] | None:
    """DeepSpeed's config for the same data-parallel layout (None without ZeRO).

    Args:
        tr: the training (global batch, precision).
        lay: the layout (ZeRO stage, offload, micro-batch, recompute).

    Returns:
        The config as a JSON-ready dict (batch sizes, accumulation steps, ZeRO, precision,
        activation checkpointing); None when the layout uses no ZeRO stage.
    """
    if lay.zero == 0:
        return None
    zero: dict[str, Any] = {"stage": lay.zero, "overlap_comm": True,
                            "contiguous_gradients": True}
    if lay.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    cfg: dict[str, Any] = {
        "train_batch_size": tr.global_batch,
        "train_micro_batch_size_per_gpu": lay.micro_batch,
        "gradient_accumulation_steps": tr.global_batch // (lay.dp * lay.micro_batch),
        "zero_optimization": zero,
    }
    if tr.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif tr.precision == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0}
    if lay.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": lay.tp > 1,
                                           "contiguous_memory_optimization": False}
    return cfg


def pytorch_snippet(tr: Training, lay: Layout) -> str:
    """The model wrapping for this layout, in torch ≥ 2.4 APIs; ``Block`` stands for the
    model's repeated block class and ``model.blocks`` for their container.

    Args:
        tr: the training (global batch, precision).
        lay: the layout (data, tensor and pipeline degrees, ZeRO stage, recompute).

    Returns:
        Python source lines (device mesh, tensor/pipeline parallelism, activation
        checkpointing, DDP or FSDP2 wrapping), joined by newlines.
    """
    acc = tr.global_batch // (lay.dp * lay.micro_batch)
    lines = ["import torch", "import torch.distributed as dist",
             "from torch.distributed.device_mesh import init_device_mesh", "",
             'dist.init_process_group("nccl")',
             "torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"]))"]
    dims = [("pp", lay.pp), ("dp", lay.dp), ("tp", lay.tp)]
    used = [(n, d) for n, d in dims if d > 1] or [("dp", 1)]
    lines.append(f"mesh = init_device_mesh(\"cuda\", {tuple(d for _, d in used)}, "
                 f"mesh_dim_names={tuple(n for n, _ in used)})")
    if lay.tp > 1:
        lines += [
            "from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,",
            "                                               SequenceParallel, parallelize_module)",
            "for block in model.blocks:  # Megatron's split: column- then row-parallel",
            "    parallelize_module(block, mesh[\"tp\"], {",
            "        \"attn.qkv\": ColwiseParallel(), \"attn.proj\": RowwiseParallel(),",
            "        \"mlp.fc1\": ColwiseParallel(), \"mlp.fc2\": RowwiseParallel(),"
            + ("\n        \"norm1\": SequenceParallel(), \"norm2\": SequenceParallel()," if
               lay.sequence_parallel else ""),
            "    })"]
    if lay.pp > 1:
        lines += [
            "from torch.distributed.pipelining import PipelineStage, Schedule1F1B",
            f"# split model.blocks into {lay.pp} stages of equal layers; this rank keeps",
            "# stage mesh[\"pp\"].get_local_rank() and drops the others' blocks",
            "stage = PipelineStage(stage_module, mesh[\"pp\"].get_local_rank(), "
            f"{lay.pp}, torch.device(\"cuda\"), group=mesh[\"pp\"].get_group())",
            f"schedule = Schedule1F1B(stage, n_microbatches={acc}, loss_fn=loss_fn)"]
    if lay.recompute != "none":
        lines += [
            "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (",
            "    apply_activation_checkpointing)",
            "apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))"
            + ("  # full recompute" if lay.recompute == "full" else
               "  # selective: wrap only the attention core")]
    dtype = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}.get(tr.precision)
    dp_mesh = 'mesh["dp"]' if lay.dp > 1 and len(used) > 1 else "mesh"
    if lay.zero == 0:
        lines += ["from torch.nn.parallel import DistributedDataParallel as DDP",
                  f"model = DDP(model, process_group={dp_mesh}.get_group())"
                  if len(used) > 1 else "model = DDP(model)"]
        if dtype:
            lines.append(f"# mixed precision: torch.autocast(\"cuda\", dtype={dtype}) around "
                         "the forward")
    else:
        reshard = "True" if lay.zero == 3 else "False"
        lines += ["from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard"]
        if dtype:
            lines.append(f"mp = MixedPrecisionPolicy(param_dtype={dtype}, "
                         "reduce_dtype=torch.float32)")
        kw = f"mesh={dp_mesh}, reshard_after_forward={reshard}" + (", mp_policy=mp" if dtype
                                                                     else "")
        lines += ["for block in model.blocks:", f"    fully_shard(block, {kw})",
                  f"fully_shard(model, {kw})"]
        if lay.zero in (1, 2):
            lines.append(f"# ZeRO-{lay.zero}: FSDP2 with reshard_after_forward=False keeps the "
                         "parameters gathered between forward and backward (≈ ZeRO-2); the "
                         "DeepSpeed config below is the exact stage")
        if lay.offload:
            lines.append("# optimizer offload: fully_shard(..., offload_policy="
                         "CPUOffloadPolicy()) or DeepSpeed's offload_optimizer")
    lines += [f"# micro-batch {lay.micro_batch} per GPU, {acc} accumulation steps "
              f"(model.set_requires_gradient_sync(is_last) / no_sync on all but the last)"]
    return "\n".join(["import os", *lines])
