"""A `redline tune` factory over the built-in `lm` workload, for the device run
(benchmarks/gpu_session.sh): the whole path including torch.compile, on whatever device is here.

    redline tune benchmarks/tune_lm_setup.py --run-steps 100000
"""

from __future__ import annotations

import torch

from redline.demo import workload_factory
from redline.tune import TrainSetup


def redline_setup() -> TrainSetup:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return workload_factory("lm", device)()
