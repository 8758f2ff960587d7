"""Loader autotune in a real loop against a simulated accelerator (a consumer that sleeps,
releasing the GIL as a GPU would; labelled simulated)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from redline.data import LoaderSettings, autotune_loader
from redline.workloads.vision import SyntheticJpegDataset, VisionConfig

pytestmark = pytest.mark.slow


def simulated_accelerator(seconds: float):
    def consume(batch: Any) -> None:
        time.sleep(seconds)  # the "device" computes; the host thread is free, as with a GPU

    return consume


def test_decode_heavy_data_gets_more_workers_than_trivial_data() -> None:
    jpegs = SyntheticJpegDataset(VisionConfig(num_images=16, length=4096, crop=64))

    def decode_loader(s: LoaderSettings) -> DataLoader:
        return DataLoader(jpegs, batch_size=8, **s.loader_kwargs())

    tensors = TensorDataset(torch.randn(4096, 3, 64, 64), torch.zeros(4096))

    def trivial_loader(s: LoaderSettings) -> DataLoader:
        return DataLoader(tensors, batch_size=8, **s.loader_kwargs())

    heavy = autotune_loader(decode_loader, simulated_accelerator(0.02), cpus=2,
                            batches_per_trial=12)
    light = autotune_loader(trivial_loader, simulated_accelerator(0.02), cpus=2,
                            batches_per_trial=12)
    # trivial batches: either already ≤ 2 % wait, or a worker measurably does not help
    assert light.settings.num_workers == 0, light.reason
    assert "no workers needed" in light.reason or "no gain" in light.reason
    assert heavy.settings.num_workers > light.settings.num_workers, heavy.reason
    assert heavy.best.samples_per_s > heavy.trials[0].samples_per_s * 1.05
    assert heavy.settings.persistent_workers and heavy.settings.torch_threads >= 1
    assert heavy.reason.startswith(("data wait fell", "1 workers", "2 workers", "3 workers",
                                    "4 workers", "the 2 usable CPUs", "reached"))
    assert heavy.consume_s_per_batch == pytest.approx(0.02, rel=0.5)


def test_settings_to_loader_kwargs() -> None:
    assert LoaderSettings().loader_kwargs() == {"num_workers": 0, "pin_memory": False}
    s = LoaderSettings(num_workers=3, prefetch_factor=4, pin_memory=True, persistent_workers=True)
    assert s.loader_kwargs() == {"num_workers": 3, "pin_memory": True, "prefetch_factor": 4,
                                 "persistent_workers": True}
