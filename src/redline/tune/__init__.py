"""Tuning: the systematic path (data pipeline → batch size with gradient accumulation →
mixed precision → kernels), its plan, and the helper that applies a plan to a plain loop.

The names below are imported lazily, so ``redline.tune.config`` (what the command line reads
its defaults from) loads without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redline.tune.accumulate import accumulate, micro_sizes, split_batch, train_step
    from redline.tune.batch_finder import BatchDoesNotFitError, BatchSearch, find_batch_size
    from redline.tune.config import NumericsTolerance, TuneConfig
    from redline.tune.decision import Decision, KnobRecord
    from redline.tune.knobs import TunePlan
    from redline.tune.memory_budget import MemoryBudget
    from redline.tune.plan_store import PlanStore, load_plan, save_plan
    from redline.tune.precision import NonFiniteLossError, check_numerics
    from redline.tune.result import Projection, TuneResult
    from redline.tune.run import tune
    from redline.tune.runtime import TunedLoop, apply_plan
    from redline.tune.setup import SetupError, TrainSetup, load_factory
    from redline.tune.tuned import TunePlanError, TunePlanMismatchError

_LAZY = {
    "accumulate": "accumulate", "micro_sizes": "accumulate", "split_batch": "accumulate",
    "BatchDoesNotFitError": "batch_finder", "BatchSearch": "batch_finder",
    "find_batch_size": "batch_finder",
    "NumericsTolerance": "config", "TuneConfig": "config",
    "Decision": "decision", "KnobRecord": "decision",
    "MemoryBudget": "memory_budget",
    "tune": "run",
    "TunePlanError": "tuned", "TunePlanMismatchError": "tuned", "PlanStore": "plan_store",
    "TunePlan": "knobs",
    "load_plan": "plan_store", "save_plan": "plan_store",
    "NonFiniteLossError": "precision", "check_numerics": "precision",
    "Projection": "result", "TuneResult": "result",
    "TunedLoop": "runtime", "apply_plan": "runtime", "train_step": "accumulate",
    "SetupError": "setup", "TrainSetup": "setup", "load_factory": "setup",
}

__all__ = [
    "BatchDoesNotFitError", "BatchSearch", "Decision", "KnobRecord", "MemoryBudget",
    "NonFiniteLossError", "NumericsTolerance", "PlanStore", "Projection", "SetupError",
    "TrainSetup", "TuneConfig", "TunePlan", "TunePlanError", "TunePlanMismatchError", "TuneResult",
    "TunedLoop",
    "accumulate", "apply_plan", "check_numerics", "find_batch_size", "load_factory", "load_plan",
    "micro_sizes", "save_plan", "split_batch", "train_step", "tune",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"redline.tune.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'redline.tune' has no attribute {name!r}")
