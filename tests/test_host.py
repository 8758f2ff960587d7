"""Host facts (CPU budget, cgroup quota), dataset inspection, loader info and workers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import redline
from redline.measure.loader import batch_nbytes, batch_samples, find_python_containers
from redline.measure.system import cpu_budget


def test_cgroup_v2_quota_lowers_the_budget(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    b = cpu_budget(tmp_path)
    assert b.cpus == 1.5  # this machine has >= 2 CPUs in its affinity mask
    assert "quota=1.5" in b.source


def test_cgroup_unlimited(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert "affinity" in cpu_budget(tmp_path).source


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cpu_budget(tmp_path).cpus == 0.5


class ListDataset(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.paths = [f"/data/img_{i:08d}.jpg" for i in range(n)]
        self.labels = torch.zeros(n)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> int:
        return len(self.paths[i])


def test_python_containers_found_numpy_like_ignored() -> None:
    found = find_python_containers(ListDataset(200_000))
    assert [c.path for c in found] == ["dataset.paths"]
    assert found[0].items == 200_000 and found[0].est_bytes > 200_000 * 50
    assert find_python_containers(ListDataset(10)) == []


def test_batch_helpers_on_nested_batches() -> None:
    from collections import namedtuple
    from dataclasses import dataclass

    P = namedtuple("P", "x y")

    @dataclass
    class B:
        img: torch.Tensor
        meta: dict

    b = {"a": [P(torch.zeros(5, 3), torch.zeros(5))], "b": torch.zeros(5, 2)}
    assert batch_samples(b) == 5
    assert batch_nbytes(b) == (15 + 5 + 10) * 4
    d = B(torch.zeros(7, 2, dtype=torch.uint8), {"id": torch.zeros(7, dtype=torch.int64)})
    assert batch_samples(d) == 7 and batch_nbytes(d) == 14 + 56
    assert batch_samples(["text"]) is None
    # the usual shapes (read without recursion) and what falls back to it
    assert batch_samples((torch.zeros(8, 32), torch.zeros(8))) == 8
    assert batch_samples({"ids": torch.zeros(6, 4)}) == 6
    assert batch_samples(("text", torch.zeros(3))) == 3
    assert batch_samples({"name": "x", "x": torch.zeros(4)}) == 4
    assert batch_samples((torch.tensor(1.0), torch.zeros(9))) is None  # a 0-d first tensor
    assert batch_samples([]) is None and batch_samples({}) is None


@pytest.mark.slow
def test_worker_respawn_and_copy_on_access_measured_for_real() -> None:
    ds = ListDataset(120_000)
    loader = DataLoader(ds, batch_size=4000, num_workers=2)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with redline.watch(warmup_steps=1, count_flops=False) as w:
        for _ in range(3):  # three epochs, non-persistent workers: spawned three times
            for y in loader:
                model(y.float().view(-1, 1)).sum().backward()
                opt.step()
    rep = w.report(show=False)
    (li,) = rep.measurements.loaders
    assert li.iterators == 3 and li.worker_starts == 3
    assert li.worker_startup_mean_s is not None and li.worker_startup_mean_s > 0
    ids = {f.id for f in rep.findings}
    assert "copy_on_access_dataset" in ids
    assert "worker_respawn" in ids


@pytest.mark.slow
def test_persistent_workers_start_once() -> None:
    loader = DataLoader(TensorDataset(torch.randn(64, 2)), batch_size=16, num_workers=1,
                        persistent_workers=True)
    with redline.watch(warmup_steps=0, count_flops=False) as w:
        for _ in range(3):
            for _ in loader:
                pass
    (li,) = w.report(show=False).measurements.loaders
    assert li.iterators == 3 and li.worker_starts == 1
