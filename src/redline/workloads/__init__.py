"""Built-in workloads (no download): ``vision`` and ``lm``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from redline.workloads.base import Workload, train
from redline.workloads.lm import LMConfig, build_lm
from redline.workloads.vision import VisionConfig, build_vision

WORKLOADS: dict[str, Callable[[torch.device], Workload]] = {
    "vision": lambda dev: build_vision(VisionConfig(), dev),
    "lm": lambda dev: build_lm(LMConfig(), dev),
}
"""Name → builder of the naive default configuration."""

__all__ = ["WORKLOADS", "LMConfig", "VisionConfig", "Workload", "build_lm", "build_vision",
           "train"]
