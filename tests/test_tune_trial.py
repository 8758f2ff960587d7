"""One tuning trial: what it times (the step alone or end to end), over which window, and what
it leaves behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from factories import plan_key as _key
from redline.core.loader import LoaderSettings
from redline.tune.knobs import TunePlan


class _SlowData(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each sample costs 4 ms to 'load'."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        import time

        time.sleep(0.004)
        return torch.full((8,), float(i)), torch.tensor(i % 2)


def test_step_only_trials_time_the_step_without_the_input() -> None:
    """Compute knobs are judged on the step alone: the same plan measured end to end waits on
    the slow dataset; step-only it does not, and both count samples."""
    from torch.utils.data import DataLoader

    from redline.tune.setup import TrainSetup
    from redline.tune.trial import measure

    def factory() -> TrainSetup:
        torch.manual_seed(0)
        m = nn.Linear(8, 2)
        return TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                          loader=DataLoader(_SlowData(), batch_size=4),
                          loss_fn=lambda mm, b: nn.functional.cross_entropy(mm(b[0]), b[1]),
                          accumulation_steps=2)

    plan = TunePlan(key=_key(), effective_batch=8, micro_batch=4)
    e2e = measure(factory, plan, "e2e", steps=3, warmup=1)
    alone = measure(factory, plan, "alone", steps=3, warmup=1, step_only=True)
    assert e2e.data_wait_fraction is not None and e2e.data_wait_fraction > 0.5
    assert alone.data_wait_fraction is not None and alone.data_wait_fraction < 0.2
    assert e2e.throughput_samples_per_s and alone.throughput_samples_per_s
    assert alone.throughput_samples_per_s > e2e.throughput_samples_per_s
    assert alone.steps == e2e.steps == 3


def test_traced_trial_keeps_its_measured_steps_and_says_why_busy_is_unknown(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial with ``trace=True`` records its profiler steps on top of the measured ones
    (excluded from the statistics), removes its trace folder, and on a CPU says why the
    kernel-union busy is unknown instead of guessing."""
    import tempfile

    from torch.utils.data import DataLoader, TensorDataset

    from redline.tune.setup import TrainSetup
    from redline.tune.trial import measure

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def factory() -> TrainSetup:
        torch.manual_seed(0)
        m = nn.Linear(8, 2)
        data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        return TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                          loader=DataLoader(data, batch_size=4),
                          loss_fn=lambda mm, b: nn.functional.cross_entropy(mm(b[0]), b[1]))

    plan = TunePlan(key=_key(), effective_batch=4, micro_batch=4)
    traced = measure(factory, plan, "traced", steps=4, warmup=1, trace=True)
    plain = measure(factory, plan, "plain", steps=4, warmup=1)
    assert traced.steps == plain.steps == 4
    assert traced.device_busy_kernels_fraction is None
    assert traced.device_busy_kernels_source.startswith("unknown: CPU-only trace")
    assert plain.device_busy_kernels_source == "not traced for this trial"
    assert not list(tmp_path.glob("redline-tune-trace-*"))  # the trace folder is gone

    calls = [0]

    def failing() -> TrainSetup:
        s = factory()

        def loss(mm: nn.Module, b: Any) -> torch.Tensor:
            calls[0] += 1
            if calls[0] == 4:
                raise RuntimeError("the user's loss failed")
            return nn.functional.cross_entropy(mm(b[0]), b[1])

        s.loss_fn = loss
        return s

    with pytest.raises(RuntimeError, match="loss failed"):
        measure(failing, plan, "failing", steps=4, warmup=1, trace=True)
    assert not list(tmp_path.glob("redline-tune-trace-*"))  # gone when the trial fails too


def test_device_only_trace_gives_the_kernel_union_busy(tmp_path: Path) -> None:
    """``redline tune`` traces CUDA activity only (no host operators, so a host-bound loop
    is not slowed by the profiler): no ProfilerStep marks, no cpu_op. The kernel union is read
    over every kernel then. Kernels of the fixture: [10,30] [35,55] [40,70] [90,100] [110,130]
    [160,180] [260,270] → busy 20+35+10+20+20+10 = 115 µs of a 260 µs window."""
    from redline.trace import analyze_paths
    from trace_fixtures import synthetic_events, write_trace

    device_only = [e for e in synthetic_events()
                   if e["cat"] in ("kernel", "gpu_memcpy", "cuda_runtime", "ac2g")]
    (r,) = analyze_paths([write_trace(tmp_path / "t.json.gz", device_only)]).ranks
    assert r.temporal is not None
    assert r.temporal.window_us == pytest.approx(260.0)
    assert 1 - r.temporal.pct(r.temporal.idle_us) / 100 == pytest.approx(115 / 260)


class _SlowFetch(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Each sample takes 10 ms to fetch (sleeping, as storage does): a batch of 4 is 40 ms per
    worker, so 2 workers make 200 samples/s."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        import time

        time.sleep(0.01)
        return torch.ones(8), torch.tensor(i % 2)


def test_end_to_end_trials_are_not_served_from_a_full_queue() -> None:
    """The first steps of a trial are slow (lazy init, allocator, cuDNN); the workers fill
    their queues meanwhile, and steps timed right after them run at the step's own speed, not
    the workers'. The measured window starts
    at a fresh epoch and spans three queue-lengths, or whole epochs when they are short."""
    import time

    from torch.utils.data import DataLoader

    from redline.tune.setup import TrainSetup
    from redline.tune.trial import measure, measured_window

    def factory(n: int) -> Any:
        def make() -> TrainSetup:
            torch.manual_seed(0)
            m = nn.Linear(8, 2)
            calls = [0]

            def loss(mm: nn.Module, b: Any) -> torch.Tensor:
                calls[0] += 1
                if calls[0] <= 2:
                    time.sleep(0.4)  # slow first steps: the workers fill their queues
                return nn.functional.cross_entropy(mm(b[0]), b[1])

            return TrainSetup(model=m, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                              loader=DataLoader(_SlowFetch(n), batch_size=4), loss_fn=loss)
        return make

    plan = TunePlan(key=_key(), effective_batch=4, micro_batch=4,
                    loader=LoaderSettings(num_workers=2, prefetch_factor=2,
                                          persistent_workers=True))
    assert measured_window(plan, 1000, 6) == (12, True)  # 3 × (2 workers × prefetch 2)
    assert measured_window(plan, 16, 6) == (16, True)  # a short epoch: timed whole
    no_workers = TunePlan(key=_key(), effective_batch=4, micro_batch=4)
    assert measured_window(no_workers, 16, 6) == (6, False)
    # warm-up 3: the two slow steps, then the step in which the new epoch begins
    long = measure(factory(4000), plan, "long epochs", steps=6, warmup=3)
    assert long.steps == 12
    assert long.throughput_samples_per_s == pytest.approx(200, rel=0.3)
    short = measure(factory(64), plan, "16-batch epochs", steps=6, warmup=3)
    assert short.steps == 16
    # one epoch start per 16 batches: 8 rounds of 40 ms, the first waited for → ~200 samples/s
    assert short.throughput_samples_per_s == pytest.approx(200, rel=0.3)
