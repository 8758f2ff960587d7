"""The decode cache in the tuning path: a setup's declared split (deterministic part cached,
random part per access) tried as a knob, the fill timed and charged to the planned run; the
vision workload's split gives the samples the uncached dataset gives; a plan that keeps the
cache applied to a plain loop."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from redline.data import CachedDataset, CacheSplit
from redline.data.cache_split import Reindexed, cached_dataset, fill
from redline.tune import TrainSetup, apply_plan
from redline.tune.config import TuneConfig
from redline.tune.knobs.decode_cache import DECODE_CACHE, DECODE_CACHE_RECORD
from redline.tune.path import TunePath, baseline_plan
from redline.tune.tuned import TunePlanMismatchError
from redline.workloads.vision import SyntheticJpegDataset, VisionConfig
from test_tune_path import speeds

ITEMS = 16
DECODE_S = 0.02


class _Raw(Dataset[int]):
    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, k: int) -> int:
        return k


def _decode(k: int) -> torch.Tensor:
    time.sleep(DECODE_S)  # the costly, deterministic part
    return torch.full((8,), float(k))


def _jitter(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x + 0.01 * torch.randn(8), x[:1]


class _Made(Dataset[Any]):
    """What the user's loader reads: the random part of the deterministic part, every time."""

    def __len__(self) -> int:
        return ITEMS

    def __getitem__(self, i: int) -> Any:
        return _jitter(_decode(i))


def _factory(cached: bool = False) -> Any:
    def factory() -> TrainSetup:
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
        ds: Any = (CachedDataset(_Raw(), _decode, _jitter, store=CACHE_DIR[0]) if cached
                   else _Made())
        return TrainSetup(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                          loader=DataLoader(ds, batch_size=4, shuffle=True),
                          loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
                          cache_split=CacheSplit(source=_Raw(), deterministic=_decode, random=_jitter))
    return factory


CACHE_DIR: list[str] = []


def _path(tmp_path: Path, run_steps: int, cached: bool = False) -> tuple[TunePath, Any]:
    CACHE_DIR[:] = [str(tmp_path / "user-cache")]
    cfg = TuneConfig(run_steps=run_steps, rounds=1, steps_per_trial=2, warmup_steps=1,
                     reuse=False, store_dir=str(tmp_path))
    # cached pipeline: 0.05 s a step against 0.08 s
    p = TunePath(_factory(cached), cfg, lambda s: None,
                 speeds(lambda plan: 0.05 if plan.decode_cache else 0.08))
    return p, baseline_plan(p.key, p.micro, p.effective, p.user_loader)


def test_the_cache_is_kept_when_the_run_pays_for_its_fill(tmp_path: Path) -> None:
    p, base = _path(tmp_path, run_steps=10_000)
    try:
        plan = DECODE_CACHE.run(p, base)
        store = p.cache_store
        assert store is not None and Path(store).is_dir()
    finally:
        p.close()
    assert not Path(store).exists()  # the trials' store goes with the tuning
    (d,) = plan.decisions
    assert d.knob == DECODE_CACHE_RECORD.label and d.kept and plan.decode_cache
    assert d.details["items"] == ITEMS and d.details["fill_workers"] == 0
    fill_s = d.details["fill_s"]
    assert isinstance(fill_s, float) and ITEMS * DECODE_S * 0.9 <= fill_s < 5
    assert "over 10,000 steps: 500 s cached (incl." in d.reason and "vs 800 s" in d.reason


def test_the_cache_is_not_kept_when_the_fill_costs_more_than_the_run_saves(
        tmp_path: Path) -> None:
    # 5 steps: 0.4 s uncached, 0.25 s cached plus a ≥ 0.32 s fill
    p, base = _path(tmp_path, run_steps=5)
    try:
        plan = DECODE_CACHE.run(p, base)
    finally:
        p.close()
    (d,) = plan.decisions
    assert not d.kept and not plan.decode_cache
    assert d.samples_per_s_after == pytest.approx(80.0)  # faster per step, all the same
    assert "over 5 steps:" in d.reason and "s filling) vs 0 s" in d.reason


def test_a_dataset_already_cached_is_not_cached_again(tmp_path: Path) -> None:
    p, base = _path(tmp_path, run_steps=10_000, cached=True)
    plan = DECODE_CACHE.run(p, base)
    (d,) = plan.decisions
    assert not d.kept and "already is a CachedDataset" in d.reason
    assert p.cache_store is None


def test_vision_samples_through_the_cache_are_the_samples_without_it(tmp_path: Path) -> None:
    ds = SyntheticJpegDataset(VisionConfig(num_images=4, length=12, crop=32))
    split = ds.cache_split()
    cached = cached_dataset(split, len(ds), str(tmp_path / "c"))
    assert isinstance(cached, Reindexed) and len(cached) == 12
    fill_s, items = fill(cached)
    assert items == 4 and fill_s > 0
    for i in (0, 5, 11):  # image i mod 4, labelled by its image
        random.seed(i)
        x, y = ds[i]
        random.seed(i)
        cx, cy = cached[i]
        assert y == cy == (i % 4) % 10
        assert torch.equal(x, cx)
    assert cached.dataset.stats().hits >= 3  # served from the store, not decoded again
    # the DataLoader's batched read maps each sample to its image, in one store round trip
    assert [y for _, y in cached.__getitems__([0, 5, 11])] == [0, 1, 3]


def test_a_split_whose_source_differs_in_length_needs_an_index(tmp_path: Path) -> None:
    ds = SyntheticJpegDataset(VisionConfig(num_images=4, length=12, crop=32))
    split = CacheSplit(source=ds.source, deterministic=ds.cache_split().deterministic, random=ds.augment)
    with pytest.raises(ValueError, match="give CacheSplit an index"):
        cached_dataset(split, len(ds), str(tmp_path / "c"))
    with pytest.raises(TypeError, match="map-style dataset"):
        CacheSplit(source=iter([1, 2]), deterministic=len)


def test_a_plan_with_the_cache_needs_the_split_to_be_applied(tmp_path: Path) -> None:
    import dataclasses

    p, base = _path(tmp_path, run_steps=10_000)
    p.close()
    plan = dataclasses.replace(base, decode_cache=True,
                               decode_cache_store=str(tmp_path / "store"))
    s = _factory()()
    with pytest.raises(TunePlanMismatchError, match="no cache split was given"):
        apply_plan(plan, s.model, s.optimizer, s.loader, s.loss_fn)
    tuned = apply_plan(plan, s.model, s.optimizer, s.loader, s.loss_fn,
                       cache_split=s.cache_split)
    assert isinstance(tuned.dataloader.dataset, CachedDataset)
    losses = [float(tuned.step(b)) for b in tuned.loader]
    assert len(losses) == ITEMS // 4 and all(torch.isfinite(torch.tensor(losses)))
    assert tuned.dataloader.dataset.stats().misses == ITEMS  # filled on first access


class _Records(torch.utils.data.IterableDataset[int]):
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(4))

    def __len__(self) -> int:
        return 4


@pytest.mark.parametrize("source,said", [
    (SyntheticJpegDataset, "the class SyntheticJpegDataset"), ("/data/train", "str"),
    (_Records(), "_Records"), (iter(range(3)), "range_iterator")])
def test_a_split_s_source_must_be_a_map_style_dataset_instance(source: Any, said: str) -> None:
    """A class, a path and an IterableDataset (which torch's Dataset base gives a
    __getitem__ that raises) are refused where the split is made, not at its fill."""
    with pytest.raises(TypeError, match=f"must be a map-style dataset .*, got {said}$"):
        CacheSplit(source=source, deterministic=lambda x: x)
