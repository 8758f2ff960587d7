"""Tuning: the systematic path (data pipeline → batch size with gradient accumulation →
mixed precision → kernels), its plan, and the helper that applies a plan to a plain loop."""

from redline.tune.accumulate import accumulate, micro_sizes, split_batch
from redline.tune.batch_finder import BatchDoesNotFitError, BatchSearch, find_batch_size
from redline.tune.memory_budget import MemoryBudget
from redline.tune.path import TuneConfig, TuneResult, tune
from redline.tune.plan import (
    PlanMismatchError,
    PlanStore,
    TunePlan,
    load_plan,
    save_plan,
)
from redline.tune.precision import NonFiniteLossError, NumericsTolerance, check_numerics
from redline.tune.runtime import TunedLoop, apply_plan, train_step
from redline.tune.setup import SetupError, TrainSetup, load_factory

__all__ = [
    "BatchDoesNotFitError", "BatchSearch", "MemoryBudget", "NonFiniteLossError",
    "NumericsTolerance", "PlanMismatchError", "PlanStore", "SetupError", "TrainSetup",
    "TuneConfig", "TunePlan", "TuneResult", "TunedLoop", "accumulate", "apply_plan",
    "check_numerics", "find_batch_size", "load_factory", "load_plan", "micro_sizes",
    "save_plan", "split_batch", "train_step", "tune",
]
