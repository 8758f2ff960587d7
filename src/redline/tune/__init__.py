"""Tuning (issue 5, started): a simulated device-memory budget for CPU runs."""

from redline.tune.memory_budget import MemoryBudget

__all__ = ["MemoryBudget"]
