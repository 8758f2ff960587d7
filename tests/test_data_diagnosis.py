"""Data starvation end to end: the watch measures what the split needs (CPU time against wall
time of the fetches, per process and worker) and the findings follow from it.

Which side of the split a given measurement lands on is decided by the rules, tested from
controlled inputs in tests/test_rules.py; here the measured quantities are compared between a
fetch that sleeps and one that decodes, side by side, so another process competing for the
CPUs (which stretches wall time for both) cannot flip the outcome."""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import redline
from redline.workloads.vision import SyntheticJpegDataset, VisionConfig


class SleepyDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Every fetch waits 10 ms without using the CPU, like a read from slow storage: 80 ms a
    batch of 8, far above the step's compute even when other processes slow it down."""

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.01)
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


def test_sleeping_fetch_waits_off_cpu_and_is_not_called_storage() -> None:
    rep = _run(DataLoader(SleepyDataset(), batch_size=8), TinyNet())
    ids = _ids(rep)
    assert "data_starvation" in ids
    assert "fetch_wait" in ids and "cpu_preprocessing" not in ids  # sleeping uses no CPU
    assert "storage_fetch" not in ids  # nothing was read: no evidence of storage
    ds = next(f for f in rep.findings if f.id == "data_starvation")
    f = rep.measurements.fraction("data_wait")
    assert ds.evidence["data_wait_fraction"] == round(f, 4) and f > 0.3
    assert ds.ceiling_speedup == pytest.approx(1 / (1 - f))


def test_decoding_fetch_burns_cpu_where_sleeping_does_not() -> None:
    """num_workers=0: the split reads the training thread's CPU time inside the fetches."""
    sleepy = _run(DataLoader(SleepyDataset(), batch_size=8), TinyNet()).measurements
    decode = _run(DataLoader(_decode_dataset(), batch_size=8), DecodeNet())
    dec = decode.measurements
    assert "data_starvation" in _ids(decode)
    assert "num_workers=" in next(f for f in decode.findings if f.id == "data_starvation").fix
    slept, burnt = sleepy.host.data_fetch_cpu_fraction, dec.host.data_fetch_cpu_fraction
    assert slept is not None and burnt is not None
    assert slept < 0.2 and burnt > 5 * slept
    assert burnt <= 1.0  # one thread: its CPU time within its wall time


class _Fetch(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each sample costs 0.1 ms: spent on the CPU (``burn``) or asleep."""

    def __init__(self, burn: bool) -> None:
        self.burn = burn

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        end = time.perf_counter() + 1e-4
        if self.burn:
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(1e-4)
        return torch.zeros(3, 8, 8), torch.tensor(0)


def test_after_the_first_fetches_one_in_eight_is_read_and_the_shares_hold() -> None:
    """The fetch's CPU time and run delay are read around the first 64 fetches, then around one
    in eight at random, weighted by eight: the CPU share stays what every fetch would give."""
    from redline.measure.data_hooks import FETCH_READ_ONE_IN, FETCHES_READ_IN_FULL

    shares = {}
    for burn in (True, False):
        model = TinyNet()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with redline.watch(warmup_steps=2, count_flops=False) as w:
            for x, y in itertools.islice(DataLoader(_Fetch(burn), batch_size=4), 600):
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        host = w.report(show=False).measurements.host
        cpu_share, delay = host.data_fetch_cpu_fraction, host.data_fetch_run_delay_fraction
        # a burning fetch's time is CPU, or waiting for a CPU on a loaded host (its run delay);
        # a sleeping one's is neither (its run delay, after each wake-up, is not its work)
        shares[burn] = None if cpu_share is None else cpu_share + ((delay or 0.0) if burn else 0.0)
        # one fetch a step; the loader's iter() is in the first step
        late = w.steps[FETCHES_READ_IN_FULL + 1:]
        read = [r for r in late if r.data_read_s > 0]
        # ~1 in 8 of the later fetches, at random (binomial: 67 expected of 535, sd 7.7)
        assert 30 < len(read) < 110, len(read)
        for r in read:  # each fetch read stands for eight
            assert r.data_read_s == pytest.approx(FETCH_READ_ONE_IN * r.phases[0], rel=0.05)
        assert all(r.data_read_s > 0 for r in w.steps[1:FETCHES_READ_IN_FULL])
    assert shares[True] is not None and shares[False] is not None
    assert shares[True] > 0.7 and shares[False] < 0.4


@pytest.mark.slow
def test_decoding_workers_burn_cpu_where_sleeping_workers_do_not() -> None:
    """num_workers=2: the split reads the workers' CPU time."""
    sleepy = _run(DataLoader(SleepyDataset(), batch_size=16, num_workers=2), TinyNet(), steps=12)
    decode = _run(DataLoader(_decode_dataset(), batch_size=16, num_workers=2), DecodeNet(),
                  steps=12)
    for rep in (sleepy, decode):
        loader = rep.measurements.config.loader
        assert loader is not None and loader.num_workers == 2
        assert rep.measurements.host.workers_seen >= 2
    assert {"data_starvation", "fetch_wait"} <= _ids(sleepy)
    assert not {"cpu_preprocessing", "storage_fetch"} & _ids(sleepy)
    assert "data_starvation" in _ids(decode)
    slept = sleepy.measurements.host.workers_cpu_cores
    burnt = decode.measurements.host.workers_cpu_cores
    assert slept is not None and burnt is not None and burnt > 5 * max(slept, 0.02)


class SlowStorage(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Every sample reads 64 KiB of a file and waits 10 ms (SIMULATED storage latency) before
    the read returns, as a remote or spinning disk makes a fetch wait."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.01)
        with open(self.path, "rb") as f:
            f.seek((i % 16) * 65536)
            raw = f.read(65536)
        return torch.tensor(list(raw[:192]), dtype=torch.float32).view(3, 8, 8), torch.tensor(i % 10)


def test_a_fetch_that_waits_while_reading_is_storage_fetch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "shard.bin"
    data.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    rep = _run(DataLoader(SlowStorage(str(data)), batch_size=8), TinyNet())
    ids = _ids(rep)
    assert "storage_fetch" in ids and "fetch_wait" not in ids, ids
    f = next(f for f in rep.findings if f.id == "storage_fetch")
    assert (f.evidence["read_calls_mb_per_s"] or 0) >= 0.1


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


def test_one_stalled_fetch_is_measured_as_the_slowest_step() -> None:
    """The breakdown names the step that stalled and what it cost; whether that is a stall or
    starvation is the stall check's decision (tests/test_rules.py), consistent here with the
    robust share the run measured."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 10))
    # batch 32: sample 32 * 10 is fetched by the 11th step, well after the 2 warm-up steps
    rep = _run(DataLoader(OneStall(at=32 * 10), batch_size=32), model, steps=20)
    m = rep.measurements
    dw = m.share("data_wait")
    assert dw is not None and dw.fraction_without_slowest is not None
    assert dw.slowest_step == 10 and dw.slowest_step_s is not None and dw.slowest_step_s >= 0.3
    assert dw.fraction_without_slowest < dw.fraction
    stalled = dw.fraction >= 0.05 > dw.fraction_without_slowest
    notes = [n for n in m.notes if n.startswith("One fetch made most of the data wait")]
    assert bool(notes) is stalled
    assert ("data_starvation" in _ids(rep)) is (dw.fraction_without_slowest >= 0.05)


def test_steady_waits_are_not_mistaken_for_a_stall() -> None:
    rep = _run(DataLoader(SleepyDataset(), batch_size=8), TinyNet())
    dw = rep.measurements.share("data_wait")
    assert dw is not None and dw.fraction_without_slowest is not None
    assert dw.fraction_without_slowest > 0.3
    assert not [n for n in rep.measurements.notes if n.startswith("One fetch")]


def test_compute_bound_run_waits_little_for_data() -> None:
    """An in-memory dataset feeding a large MLP: the step is forward and backward; any data
    finding would have to come from a wait the run measured (the threshold's decision is tested
    from controlled inputs in tests/test_rules.py)."""
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(4096, 1024), torch.randint(0, 10, (4096,)))
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                          nn.Linear(4096, 10))
    rep = _run(DataLoader(ds, batch_size=32), model, steps=30)
    m = rep.measurements
    compute = m.fraction("forward") + m.fraction("backward")
    assert compute > 0.5 and m.fraction("data_wait") < compute / 5
    dw = m.share("data_wait")
    assert dw is not None and dw.fraction_without_slowest is not None
    assert ("data_starvation" in _ids(rep)) is (
        m.fraction("data_wait") >= 0.05 and dw.fraction_without_slowest >= 0.05)


@pytest.mark.slow
def test_a_competing_process_is_contention_not_storage() -> None:
    """Controlled contention: the training loop and a busy process pinned to the same one CPU.
    The fetch decodes (CPU work); with the competitor it also waits for the CPU, and that wait
    is measured as run delay and named as other processes' load, side by side with the same
    loop alone on its CPU."""
    import os
    import signal
    import subprocess
    import sys

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs Linux CPU affinity")
    before = os.sched_getaffinity(0)
    cpu = min(before)
    threads = torch.get_num_threads()
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    try:
        alone = _run(DataLoader(_decode_dataset(), batch_size=8), DecodeNet()).measurements
        # Not a child of this process (the shell that starts it exits at once): another
        # program's load, as a second job on the machine would be.
        out = subprocess.run(
            ["sh", "-c", f"taskset -c {cpu} {sys.executable} -c 'while True: pass' "
             ">/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True)
        rival = int(out.stdout.strip())
        try:
            time.sleep(0.3)
            shared = _run(DataLoader(_decode_dataset(), batch_size=8), DecodeNet())
        finally:
            os.kill(rival, signal.SIGKILL)
    finally:
        os.sched_setaffinity(0, before)
        torch.set_num_threads(threads)
    h = shared.measurements.host
    assert alone.host.data_fetch_run_delay_fraction is not None
    assert h.data_fetch_run_delay_fraction is not None
    assert h.data_fetch_run_delay_fraction > 0.25
    assert h.data_fetch_run_delay_fraction > 3 * alone.host.data_fetch_run_delay_fraction
    assert h.other_processes_cpu_cores is not None and h.other_processes_cpu_cores > 0.3
    # the whole loop, not only its fetches: the training thread shares its one CPU
    assert h.main_thread_run_delay_fraction is not None
    assert alone.host.main_thread_run_delay_fraction is not None
    assert h.main_thread_run_delay_fraction > 0.25
    assert h.main_thread_run_delay_fraction > 3 * alone.host.main_thread_run_delay_fraction
    # one finding over the whole step (the loop's own delay covers the fetch's), naming it
    f = next(f for f in shared.findings if f.id == "cpu_contention")
    assert "training thread waits for a CPU" in f.title
    assert f"pid {rival} " in str(f.evidence["competing_processes"])
    assert not {"storage_fetch", "fetch_wait"} & _ids(shared)
