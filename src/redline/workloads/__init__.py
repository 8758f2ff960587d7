"""Built-in workloads (no download): ``vision``, ``lm``, ``vision-storage`` (storage-bound:
SIMULATED storage latency) and, sized for GPUs, ``vision-large`` and ``lm-large``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from redline.workloads.base import Workload, train
from redline.workloads.lm import LMConfig, build_lm, lm_large_config
from redline.workloads.vision import (
    VisionConfig,
    build_vision,
    vision_large_config,
    vision_storage_config,
)

WORKLOADS: dict[str, Callable[[torch.device], Workload]] = {
    "vision": lambda dev: build_vision(VisionConfig(), dev),
    "vision-large": lambda dev: build_vision(vision_large_config(), dev),
    "vision-storage": lambda dev: build_vision(vision_storage_config(), dev),
    "lm": lambda dev: build_lm(LMConfig(), dev),
    "lm-large": lambda dev: build_lm(lm_large_config(), dev, "lm-large"),
}
"""Name → builder of the naive default configuration."""

__all__ = ["WORKLOADS", "LMConfig", "VisionConfig", "Workload", "build_lm", "build_vision",
           "lm_large_config", "train", "vision_large_config", "vision_storage_config"]
