"""Planning the parallelism before renting the GPUs: memory per GPU term by term, time per step
with the communication math, ranked layouts (DP, ZeRO-1/2/3 / FSDP, TP, PP, recompute,
offload) and the chosen one as a command and code.

Torch is needed only to count a model given as code (:func:`from_module`,
:func:`activation_bytes`, :func:`from_factory`).

The names are loaded on first use (PEP 562), so importing one submodule (``redline plan``'s
parser reads :mod:`redline.plan.memory`'s choices; ``redline trace`` builds that parser too)
does not load the search, the emitters and the config reader. Two functions are named like
the modules that define them, :func:`memory` and :func:`search`: ``redline.plan.memory`` is
the function (as ``from redline.plan import memory`` gives), whatever was imported before;
the modules stay importable as modules (``import redline.plan.search``, ``from
redline.plan.search import PlanResult``) through ``sys.modules``.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_MODULES = {
    "activations": ["MeasuredActivations", "activation_bytes"],
    "emit": ["deepspeed_config", "pytorch_snippet", "torchrun_command"],
    "hardware": ["GPU_KINDS", "Cluster", "GpuKind", "cluster", "gpu_kind"],
    "hf_config": ["from_config_json"],
    "limits": ["PlanInputError"],
    "memory": ["Layout", "Memory", "Term", "Training", "memory", "model_states"],
    "search": ["Candidate", "JobProjection", "PlanResult", "project", "search"],
    "spec": ["ModelSpec", "from_module", "from_numbers"],
    "timing": ["DEFAULT_MFU", "Timing", "step_time"],
}
_LAZY = {name: f"redline.plan.{module}" for module, names in _MODULES.items() for name in names}
_NAMED_LIKE_MODULES = frozenset(_LAZY) & frozenset(_MODULES)
"""Exported functions that share their module's name (``memory``, ``search``)."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # resolved once; later lookups do not come here
        return value
    raise AttributeError(f"module 'redline.plan' has no attribute {name!r}")


class _Package(types.ModuleType):
    """The import system binds each loaded submodule as an attribute of its package; for the
    two modules named like their function that would shadow the function, so the binding is
    left out (the module is still in ``sys.modules``, where imports find it)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _NAMED_LIKE_MODULES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
