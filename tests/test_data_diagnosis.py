"""Data starvation is found, split right (storage vs CPU), and not raised on compute-bound runs."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import redline
from redline.workloads.vision import SyntheticJpegDataset, VisionConfig


class SleepyDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Every fetch waits 3 ms without using the CPU, like a read from slow storage."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.003)
        return torch.full((3, 8, 8), float(i % 7)), torch.tensor(i % 10)


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


class DecodeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 48 * 48, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def _run(loader: DataLoader, model: nn.Module, steps: int = 14) -> redline.Report:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with redline.watch(warmup_steps=2, count_flops=False) as w:
        it = iter(loader)
        for _ in range(steps):
            x, y = next(it)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return w.report(show=False)


def _ids(rep: redline.Report) -> set[str]:
    return {f.id for f in rep.findings}


def _decode_dataset() -> SyntheticJpegDataset:
    return SyntheticJpegDataset(VisionConfig(num_images=16, length=10_000, crop=48))


def test_sleeping_fetch_is_storage_fetch_in_process() -> None:
    rep = _run(DataLoader(SleepyDataset(), batch_size=8), TinyNet())
    ids = _ids(rep)
    assert "data_starvation" in ids
    assert "storage_fetch" in ids and "cpu_preprocessing" not in ids
    ds = next(f for f in rep.findings if f.id == "data_starvation")
    assert float(ds.evidence["data_wait_fraction"]) > 0.5  # type: ignore[arg-type]
    assert ds.ceiling_speedup is not None and ds.ceiling_speedup > 2


def test_decoding_fetch_is_cpu_preprocessing_in_process() -> None:
    rep = _run(DataLoader(_decode_dataset(), batch_size=8), DecodeNet())
    ids = _ids(rep)
    assert "data_starvation" in ids
    assert "cpu_preprocessing" in ids and "storage_fetch" not in ids
    fix = next(f for f in rep.findings if f.id == "data_starvation").fix
    assert "num_workers=" in fix


@pytest.mark.slow
def test_sleeping_workers_are_storage_fetch() -> None:
    loader = DataLoader(SleepyDataset(), batch_size=16, num_workers=2)
    rep = _run(loader, TinyNet(), steps=12)
    assert rep.measurements.config.loader is not None
    assert rep.measurements.config.loader.num_workers == 2
    ids = _ids(rep)
    assert {"data_starvation", "storage_fetch"} <= ids
    assert "cpu_preprocessing" not in ids


@pytest.mark.slow
def test_decoding_workers_are_cpu_preprocessing() -> None:
    loader = DataLoader(_decode_dataset(), batch_size=16, num_workers=2)
    rep = _run(loader, DecodeNet(), steps=12)
    ids = _ids(rep)
    assert {"data_starvation", "cpu_preprocessing"} <= ids
    h = rep.measurements.host
    assert h.workers_cpu_cores is not None and h.workers_cpu_cores > 0.5


class OneStall(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Every fetch is instant but one, which stalls 0.3 s (a GC pause, a preempted read)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.x, self.y = torch.randn(4096, 1024), torch.randint(0, 10, (4096,))

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == self.at:
            time.sleep(0.3)
        return self.x[i], self.y[i]


def test_one_stalled_fetch_is_a_note_not_starvation() -> None:
    torch.manual_seed(0)
    # compute-bound as in test_compute_bound_run_is_not_flagged (wait ~1 % without the stall)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 10))
    # batch 32: sample 32 * 10 is fetched by the 11th step, well after the 2 warm-up steps
    rep = _run(DataLoader(OneStall(at=32 * 10), batch_size=32), model, steps=20)
    m = rep.measurements
    dw = m.share("data_wait")
    assert dw is not None and dw.fraction_without_slowest is not None
    assert dw.fraction > 0.05  # the stall is in the breakdown: it did cost that time
    assert dw.fraction_without_slowest < 0.05
    assert not _ids(rep) & {"data_starvation", "cpu_preprocessing", "storage_fetch"}
    note = next(n for n in m.notes if n.startswith("One fetch made most of the data wait"))
    assert "step 10" in note and "not starvation" in note


def test_steady_waits_are_not_mistaken_for_a_stall() -> None:
    rep = _run(DataLoader(SleepyDataset(), batch_size=8), TinyNet())
    dw = rep.measurements.share("data_wait")
    assert dw is not None and dw.fraction_without_slowest is not None
    assert dw.fraction_without_slowest > 0.5
    assert not [n for n in rep.measurements.notes if n.startswith("One fetch")]


def test_compute_bound_run_is_not_flagged() -> None:
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(4096, 1024), torch.randint(0, 10, (4096,)))
    # The in-process fetch of 32 rows costs ~0.5 ms of Python (indexing + collate); with hidden
    # 2048 that was 3-5 % of the step on a 2-core runner, on the 5 % rule's edge (CI failed once).
    # Hidden 4096 makes the step ~3x longer, so the wait stays near 1 %: clearly compute-bound.
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 10))
    # 30 steps: one preempted fetch on a shared machine must not read as starvation.
    rep = _run(DataLoader(ds, batch_size=32), model, steps=30)
    ids = _ids(rep)
    assert not ids & {"data_starvation", "cpu_preprocessing", "storage_fetch"}
    assert rep.measurements.fraction("data_wait") < 0.03
    assert rep.measurements.fraction("forward") + rep.measurements.fraction("backward") > 0.5
