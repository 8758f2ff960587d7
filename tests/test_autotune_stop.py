"""The loader autotune's stop rule and its accounting of worker start-up.

The rule itself is tested on scripted trials (each setting's rate, spread and start-up given,
so a loaded runner cannot move a decision); the measurement behind it on datasets whose
samples sleep (SIMULATED storage latency: no CPU), with margins of 2× or more."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

import redline.data.autotune as autotune
from redline.data import LoaderSettings, autotune_loader
from redline.data.loader_timing import Trial

BATCH = 8
CONSUME_S = 0.010
"""Scripted consumer: 10 ms a batch of 8, so no setting passes 800 samples/s."""
SAMPLES = 4096
"""The scripted loader's epoch: 512 batches of 8 (the default payback horizon)."""


def _loader(s: LoaderSettings) -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.zeros(SAMPLES, 2)), batch_size=BATCH,
                      **s.loader_kwargs())


def _script(monkeypatch: pytest.MonkeyPatch,
            rates: dict[int, tuple[float, float, float]],
            ready_fetch_s: float | None = None, timed_epochs: int = 0,
            round_s: float | None = None,
            busy: dict[int, float] | None = None) -> list[LoaderSettings]:
    """Trials by worker count: (samples/s, spread, start-up s); the main process (0 workers)
    waits 90 % of a 100 ms step (a fetch of 90 ms a batch: Little's law asks for 9 workers,
    12 with the headroom); ``timed_epochs``: the whole epochs the worker trials time (0:
    inside one), ``round_s`` the workers' round they timed at an epoch start, ``busy`` the
    cores busy by worker count (0.2 where not given: a fetch that waits). Returns the settings
    tried, in order."""
    tried: list[LoaderSettings] = []

    def fake_measure(make_loader: Callable[[LoaderSettings], DataLoader[Any]],
                     consume: Callable[[Any], None], s: LoaderSettings, threads: int = 1,
                     batches: int = 24, skip: int | None = None,
                     whole_epochs: bool | None = None,
                     window_s: float | None = None, time_refill: bool = False) -> Trial:
        tried.append(s)
        rate, spread, startup = rates[s.num_workers]
        if s.num_workers and s.prefetch_factor == 4:
            rate *= 1.01  # a deeper queue: no measurable gain
        wait = max(0.0, 1 - rate / 800)
        return Trial(settings=s, torch_threads=threads, samples_per_s=rate, data_wait_fraction=wait,
                     cpu_cores_busy=(busy or {}).get(s.num_workers, 0.2),
                     seconds=startup + 1.0, timed_batches=48,
                     spread_fraction=spread, startup_s=startup,
                     ready_fetch_s=ready_fetch_s if s.num_workers else None,
                     whole_epochs=timed_epochs if s.num_workers else 0,
                     round_s=round_s if s.num_workers else None)

    def fake_consume_time(make_loader: Callable[[LoaderSettings], DataLoader[Any]],
                          consume: Callable[[Any], None], repeats: int = 5
                          ) -> tuple[float, Any]:
        return CONSUME_S, next(iter(make_loader(LoaderSettings())))

    monkeypatch.setattr(autotune, "measure", fake_measure)
    monkeypatch.setattr(autotune, "consume_time", fake_consume_time)
    rates.setdefault(0, (80.0, 0.0, 0.09))
    return tried


def _workers(tried: list[LoaderSettings]) -> list[int]:
    return [s.num_workers for s in tried]


def test_little_s_law_sets_the_first_workers_and_a_gain_within_the_spread_stops(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 12 workers ±10 %; 18 give 8 % more: within the spread, so the search stops there
    tried = _script(monkeypatch, {12: (500.0, 0.10, 0.3), 18: (540.0, 0.03, 0.4),
                                  27: (600.0, 0.0, 0.5)})
    plan = autotune_loader(_loader, lambda b: None, cpus=2)
    assert _workers(tried) == [0, 12, 18]  # 9 workers by Little's law × 1.25; no prefetch 4
    assert plan.settings.num_workers == 12
    assert "no gain ≥ 10%" in plan.reason and "windows' spread" in plan.reason


def test_a_gain_beyond_the_spread_adds_workers_until_one_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the same 8 % gain with spreads of 2 % counts (≥ 5 %); 27 workers then add 1 %
    tried = _script(monkeypatch, {12: (500.0, 0.02, 0.3), 18: (540.0, 0.02, 0.4),
                                  27: (545.0, 0.02, 0.5)})
    plan = autotune_loader(_loader, lambda b: None, cpus=2)
    assert _workers(tried) == [0, 12, 18, 27]
    assert plan.settings.num_workers == 18
    assert "27 workers gave 545 samples/s vs 540 with 18: no gain ≥ 5%" in plan.reason


def test_the_consumer_s_rate_within_the_noise_ends_the_search_without_a_trial(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 12 workers reach 780 of the consumer's 800 samples/s: no setting can gain 5 %
    tried = _script(monkeypatch, {12: (780.0, 0.01, 0.3)})
    plan = autotune_loader(_loader, lambda b: None, cpus=2)
    assert _workers(tried) == [0, 12]
    assert plan.consumer_samples_per_s == pytest.approx(800)
    assert "of the consumer's 800 with data ready" in plan.reason


def test_over_whole_epochs_the_refill_bounds_what_more_workers_can_gain(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Trials timed over whole epochs pay a refill each epoch: one batch's fetch (90 ms, the
    main process's) before 512 batches of 10 ms, which no worker count shortens, so the
    consumer gives at most 800 × 5.12 / 5.21 = 786 samples/s. 12 workers at 760 ±5 % are
    within the noise of that, though not of the 800 with data ready: 18 are not tried."""
    tried = _script(monkeypatch, {12: (760.0, 0.05, 0.3), 18: (790.0, 0.01, 0.4)},
                    timed_epochs=1)
    plan = autotune_loader(_loader, lambda b: None, cpus=2)
    assert _workers(tried) == [0, 12]
    assert plan.settings.num_workers == 12
    assert "of the 786 the consumer can take over whole epochs of 512 batches" in plan.reason
    # timed inside an epoch, the same rates leave room: 18 workers are tried
    tried = _script(monkeypatch, {12: (760.0, 0.05, 0.3), 18: (790.0, 0.01, 0.4)})
    autotune_loader(_loader, lambda b: None, cpus=2)
    assert _workers(tried)[:3] == [0, 12, 18]


def test_workers_that_can_make_more_than_the_consumer_takes_end_the_search(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial times an epoch start after its windows: the slowest of 12 workers made its first
    batch in 90 ms, all fetching at once, so they can make 12 batches per 90 ms; over whole
    epochs, an epoch of 512 in 0.09 × ⌈512 / 12⌉ = 3.87 s: 1,058 samples/s, more than the
    consumer takes over such epochs (800 × 5.12 / 5.21 = 786): neither 18 workers nor a
    deeper queue is tried."""
    tried = _script(monkeypatch, {12: (500.0, 0.02, 0.3), 18: (540.0, 0.02, 0.4)},
                    timed_epochs=1, round_s=0.09)
    plan = autotune_loader(_loader, lambda b: None, cpus=2)
    assert _workers(tried) == [0, 12] and plan.settings.num_workers == 12
    assert "12 workers can make 1,058 samples/s (Little's law: 12 batches per 0.09 s, the " \
        "slowest fetch of a round" in plan.reason
    assert "more than the 786 the consumer can take over whole epochs, each with its " \
        "refill: more workers cannot gain" in plan.reason
    # receiving a ready batch takes 1.5 ms besides the 10 ms consumer: over whole epochs the
    # training process takes at most 4,096 / (512 × 11.5 ms + 90 ms) = 685 samples/s, the
    # least bound, which the 1,058 the workers make passes
    tried = _script(monkeypatch, {12: (600.0, 0.02, 0.3)}, ready_fetch_s=0.0015,
                    timed_epochs=1, round_s=0.09)
    plan = autotune_loader(_loader, lambda b: None, cpus=2)
    assert _workers(tried) == [0, 12]
    assert "more than the 685 the training process can take over whole epochs" in plan.reason
    # storage that slows under 12 fetches at once, or a slowest fetch of the round, of 300 ms:
    # they make 318 samples/s, no more than the loop took, so they may be what limits
    tried = _script(monkeypatch, {12: (500.0, 0.02, 0.3), 18: (540.0, 0.02, 0.4),
                                  27: (545.0, 0.02, 0.5)}, timed_epochs=1, round_s=0.3)
    autotune_loader(_loader, lambda b: None, cpus=2)
    assert _workers(tried)[:3] == [0, 12, 18]
    # timed inside an epoch: a round of 30 ms (samples the page cache still held) is shorter
    # than the main process's first read of them (90 ms): W is the larger, 12 batches per
    # 90 ms in steady state, 12 × 8 / 0.09 = 1,067 samples/s
    tried = _script(monkeypatch, {12: (500.0, 0.02, 0.3), 18: (540.0, 0.02, 0.4)},
                    round_s=0.03)
    plan = autotune_loader(_loader, lambda b: None, cpus=2)
    assert _workers(tried) == [0, 12]
    assert "12 workers can make 1,067 samples/s (Little's law: 12 batches per 0.09 s" \
        in plan.reason and "the 800 the consumer can take with data ready" in plan.reason
    assert "a deeper queue, which hides uneven fetch times, is not tried" in plan.reason
    # a round of 117 ms: 821 samples/s, above the consumer's 800 by less than the 5 % noise
    # margin. W is the slowest fetch of a whole round, so the workers beat it in steady
    # state: they make more than the loop takes, and more of them are not tried
    tried = _script(monkeypatch, {12: (500.0, 0.02, 0.3), 18: (540.0, 0.02, 0.4)},
                    round_s=0.117)
    plan = autotune_loader(_loader, lambda b: None, cpus=2)
    assert _workers(tried) == [0, 12]
    assert "12 workers can make 821 samples/s" in plan.reason
    # a round of 120 ms: 800 samples/s, no more than the consumer takes. The loop took 500,
    # far less than the workers make, yet more batches in flight may gain where fetch times
    # are uneven: 18 workers are tried
    tried = _script(monkeypatch, {12: (500.0, 0.02, 0.3), 18: (540.0, 0.02, 0.4),
                                  27: (545.0, 0.02, 0.5)}, round_s=0.12)
    autotune_loader(_loader, lambda b: None, cpus=2)
    assert _workers(tried)[:3] == [0, 12, 18]


@pytest.mark.slow
def test_a_trial_inside_an_epoch_times_an_epoch_start_after_its_windows() -> None:
    """2 persistent workers, batches of 8 samples sleeping 10 ms (80 ms a batch): the epoch
    start after the windows is timed from the new iterator's first request, after the reset
    waited for what was in flight (2 × 2 batches: another 160 ms, not in it), to its first
    batch and to its second (the other worker's, made at the same time)."""
    from redline.data.loader_timing import measure

    class Slow(Dataset[torch.Tensor]):
        def __len__(self) -> int:
            return 4096

        def __getitem__(self, i: int) -> torch.Tensor:
            time.sleep(0.010)
            return torch.zeros(4)

    ds = Slow()

    def make(s: LoaderSettings) -> DataLoader[Any]:
        return DataLoader(ds, batch_size=BATCH, **s.loader_kwargs())

    s = LoaderSettings(num_workers=2, prefetch_factor=2, persistent_workers=True)
    trial = measure(make, _consumer(0.001), s, batches=6, whole_epochs=False, window_s=0.1,
                    time_refill=True)
    assert trial.whole_epochs == 0 and trial.refill_s is not None
    assert 0.075 <= trial.refill_s < 0.2, trial.refill_s
    # both workers' first batches, fetched at once: a round is one fetch, not two
    assert trial.round_s is not None and trial.refill_s <= trial.round_s < 0.2, trial.round_s
    # not asked for, or without persistent workers (a new iterator starts new ones): none
    assert measure(make, _consumer(0.001), s, batches=6, whole_epochs=False,
                   window_s=0.1).refill_s is None
    fresh = LoaderSettings(num_workers=2, prefetch_factor=2, persistent_workers=False)
    untimed = measure(make, _consumer(0.001), fresh, batches=6, whole_epochs=False,
                      window_s=0.1, time_refill=True)
    assert untimed.refill_s is None and untimed.round_s is None


def test_a_training_process_that_cannot_take_more_ends_the_search(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # receiving a ready batch costs 1.5 ms besides the 10 ms consumer: the process takes at
    # most 8 / 11.5 ms = 696 samples/s, and 12 workers deliver 680 of them
    tried = _script(monkeypatch, {12: (680.0, 0.01, 0.3)}, ready_fetch_s=0.0015)
    plan = autotune_loader(_loader, lambda b: None, cpus=2)
    assert _workers(tried) == [0, 12]
    assert "of the 696 the training process can take (10.0 ms consuming + 1.5 ms" in plan.reason
    # without that cost known, 18 workers are tried
    tried = _script(monkeypatch, {12: (680.0, 0.01, 0.3), 18: (690.0, 0.01, 0.4)})
    autotune_loader(_loader, lambda b: None, cpus=2)
    assert _workers(tried) == [0, 12, 18]


def test_more_workers_that_do_not_repay_their_start_up_are_not_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 18 workers are 20 % faster but start 9.5 s later; over one epoch (4,096 samples) the
    # faster rate saves 4,096 × (1/500 − 1/600) = 1.4 s: not repaid
    rates = {12: (500.0, 0.02, 0.5), 18: (600.0, 0.02, 10.0)}
    tried = _script(monkeypatch, dict(rates))
    plan = autotune_loader(_loader, lambda b: None, cpus=2)
    assert plan.payback_samples == SAMPLES
    assert 18 in _workers(tried) and plan.settings.num_workers == 12
    assert "start 9.50 s later, more than that gain saves over 4,096 samples" in plan.reason
    # over a million samples it saves 333 s: kept
    tried = _script(monkeypatch, dict(rates) | {27: (610.0, 0.02, 11.0)})
    plan = autotune_loader(_loader, lambda b: None, cpus=2, payback_samples=10**6)
    assert plan.settings.num_workers == 18


def test_workers_whose_start_up_even_the_consumer_s_rate_could_not_repay_are_not_tried(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 12 workers took 12.09 s to start (1 s each beyond the first batch's 90 ms fetch): 6 more
    # would start ~6 s later, while even the consumer's 800 samples/s would save only
    # 4,096 × (1/500 − 1/800) = 3.1 s over the epoch
    tried = _script(monkeypatch, {12: (500.0, 0.02, 12.09)})
    plan = autotune_loader(_loader, lambda b: None, cpus=2)
    assert 18 not in _workers(tried) and plan.settings.num_workers == 12
    assert "18 workers would start about 6.00 s later than 12" in plan.reason
    # the start-up the search paid is reported: every trial's, within its whole time
    assert plan.startup_s == pytest.approx(sum(t.startup_s for t in plan.trials))
    assert f"{plan.startup_s:.1f} s of it starting loaders" in plan.reason


def test_a_trial_past_the_search_s_budget_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # after the main process's trial, 12 workers × prefetch 2 would time about 130 batches at
    # 10 batches a second: far past a 1 s budget
    tried = _script(monkeypatch, {12: (500.0, 0.02, 0.3)})
    plan = autotune_loader(_loader, lambda b: None, cpus=2, budget_s=1.0)
    assert _workers(tried) == [0] and plan.settings.num_workers == 0
    assert "past the search's budget" in plan.reason


# -- measured: datasets that sleep -------------------------------------------------------


class _Sleeps(Dataset[torch.Tensor]):
    """Each sample sleeps 5 ms (SIMULATED storage: no CPU); a batch of 8 takes 40 ms."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.005)
        return torch.zeros(4)


class _SlowSpawn(DataLoader):  # type: ignore[type-arg]
    """Workers that take 0.2 s each to start (SIMULATED: a worker that loads a large index
    or opens connections before its first sample): the iterator is handed over after them."""

    def __iter__(self) -> _BaseDataLoaderIter:
        it = super().__iter__()
        time.sleep(0.2 * self.num_workers)
        return it


def _sleeping(loader: type[DataLoader] = DataLoader  # type: ignore[type-arg]
              ) -> Callable[[LoaderSettings], DataLoader[Any]]:
    ds = _Sleeps()
    return lambda s: loader(ds, batch_size=BATCH, **s.loader_kwargs())


def _consumer(seconds: float) -> Callable[[Any], None]:
    def consume(batch: Any) -> None:
        time.sleep(seconds)  # SIMULATED accelerator: the host thread is free

    return consume


@pytest.mark.slow
def test_a_fetch_that_waits_goes_straight_to_little_s_workers() -> None:
    """40 ms a batch against a 20 ms consumer: 2 workers by Little's law, 3 with headroom,
    which keep the consumer fed; the search stops there (the consumer's rate or the wait
    target), without the walk 1, 2, 4, ... nor a deeper prefetch."""
    plan = autotune_loader(_sleeping(), _consumer(0.020), cpus=2)
    workers = [t.settings.num_workers for t in plan.trials]
    assert workers[0] == 0 and 2 <= workers[1] <= 6, plan.reason  # a slow runner's sleeps
    assert len(plan.trials) <= 3, plan.reason
    ceiling = plan.consumer_samples_per_s
    assert ceiling is not None and plan.best.samples_per_s > 0.8 * ceiling
    assert plan.best.samples_per_s > 1.5 * plan.trials[0].samples_per_s
    assert 0 < plan.startup_s < plan.tuning_s


@pytest.mark.slow
def test_measured_start_up_decides_whether_workers_pay() -> None:
    """Workers that take 0.2 s each to start: 10 of them (Little's law for 40 ms batches and
    a 5 ms consumer, with headroom) start ≥ 2 s later than the main process. Over 100
    samples, their rate (≤ 1,600 samples/s vs ~180) saves under 0.6 s: not repaid, the main
    process stays; over the epoch (4,096 samples, ≥ 18 s saved) they are kept."""
    make = _sleeping(_SlowSpawn)
    short = autotune_loader(make, _consumer(0.005), cpus=2, payback_samples=100)
    tried = short.trials[1]
    assert tried.settings.num_workers >= 8 and tried.startup_s >= 0.2 * 8, short.reason
    assert short.settings.num_workers == 0, short.reason
    assert "later, more than that gain saves over 100 samples" in short.reason
    assert short.startup_s >= tried.startup_s
    epoch = autotune_loader(make, _consumer(0.005), cpus=2)
    assert epoch.payback_samples == SAMPLES
    assert epoch.settings.num_workers >= 8, epoch.reason


@pytest.mark.parametrize(("one_worker", "chosen"), [(700.0, 1), (640.0, 2)])
def test_a_computing_fetch_also_tries_one_worker_fewer_and_keeps_it_when_as_fast(
        monkeypatch: pytest.MonkeyPatch, one_worker: float, chosen: int) -> None:
    """The main process computed its fetch (half of its wall time, with a core busy for all of
    it, while its consumer slept on a device), Little's law with headroom asked for 2 workers
    and the CPUs are then saturated: one worker, which shares the cores less with the training
    process, is tried once and kept at an equal or better rate."""
    tried = _script(monkeypatch, {0: (400.0, 0.0, 0.09), 1: (one_worker, 0.02, 0.1),
                                  2: (690.0, 0.02, 0.1)},
                    busy={0: 0.5, 1: 1.0, 2: 1.9})
    plan = autotune_loader(_loader, lambda b: None, cpus=2.0)
    assert _workers(tried) == [0, 2, 1]
    assert plan.settings.num_workers == chosen
    assert ("as fast with fewer" in plan.reason) == (chosen == 1)


def test_a_waiting_fetch_is_not_tried_with_fewer_workers_than_little_s_law_asks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tried = _script(monkeypatch, {12: (700.0, 0.02, 0.3), 18: (705.0, 0.02, 0.4)})
    autotune_loader(_loader, lambda b: None, cpus=2.0)
    assert 11 not in _workers(tried)
