"""A `redline tune` factory over the built-in `vision-large` workload (ResNet-50 on 224-pixel
crops of JPEGs decoded per sample, the naive loop), for the device run
(benchmarks/gpu_session.sh): the same path `redline demo --workload vision-large` tunes, with
`redline tune`'s options (`--rounds`, `--steps`) to fit a short device call.

    redline tune benchmarks/tune_vision_large_setup.py --no-compile --allow-batch-change
"""

from __future__ import annotations

import torch

from redline.demo import workload_factory
from redline.tune import TrainSetup


def redline_setup() -> TrainSetup:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return workload_factory("vision-large", device)()
