"""Planning the parallelism before renting the GPUs: memory per GPU term by term, time per step
with the communication math, ranked layouts (DP, ZeRO-1/2/3 / FSDP, TP, PP, recompute,
offload) and the chosen one as a command and code.

Torch is needed only to count a model given as code (:func:`from_module`,
:func:`activation_bytes`, :func:`from_factory`).
"""

from __future__ import annotations

from redline.plan.activations import MeasuredActivations, activation_bytes
from redline.plan.emit import deepspeed_config, pytorch_snippet, torchrun_command
from redline.plan.hardware import GPU_KINDS, Cluster, GpuKind, cluster, gpu_kind
from redline.plan.hf_config import from_config_json
from redline.plan.limits import PlanInputError
from redline.plan.memory import Layout, Memory, Term, Training, memory, model_states
from redline.plan.search import Candidate, JobProjection, PlanResult, project, search
from redline.plan.spec import ModelSpec, from_module, from_numbers
from redline.plan.timing import DEFAULT_MFU, Timing, step_time

__all__ = [
    "DEFAULT_MFU", "GPU_KINDS", "Candidate", "Cluster", "GpuKind", "JobProjection", "Layout",
    "MeasuredActivations", "Memory", "ModelSpec", "PlanInputError", "PlanResult", "Term",
    "Timing", "Training", "activation_bytes", "cluster", "deepspeed_config", "from_config_json",
    "from_module", "from_numbers", "gpu_kind", "memory", "model_states", "project",
    "pytorch_snippet", "search", "step_time", "torchrun_command",
]
