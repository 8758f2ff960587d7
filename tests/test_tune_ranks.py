"""The job's view of a trial from its ranks' views, and DDP re-wrapped with the plan's bucket
settings (a one-process gloo group: DDP's own code, on CPU)."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from redline.core.loader import LoaderSettings
from redline.data.autotune import Trial, merge_rank_trials
from redline.tune.ddp import DdpSettings, bucket_candidate, cannot_rewrap, rewrap
from redline.tune.precision import NumericsCheck, worst_check
from redline.tune.result import TrialMetrics, merge_ranks


def _m(tp: float, step: float, wait: float, peak: int, energy: float | None, times: list[float],
       esrc: str = "RAPL CPU packages over 8 steps") -> TrialMetrics:
    return TrialMetrics(label="after", throughput_samples_per_s=tp, step_time_s=step,
                        data_wait_fraction=wait, device_busy_fraction=None, mfu=None,
                        peak_memory_bytes=peak, peak_memory_source="counted",
                        energy_j_per_step=energy, energy_source=esrc, steps=8,
                        wall_s=2.0, step_times_s=times)


def test_the_job_row_adds_throughput_and_waits_for_the_slowest_rank() -> None:
    rows = [("a", _m(100.0, 0.32, 0.05, 1000, 40.0, [0.3, 0.4, 0.3])),
            ("a", _m(90.0, 0.35, 0.20, 1500, 41.0, [0.35, 0.3, 0.5, 0.9])),
            ("b", _m(95.0, 0.33, 0.01, 1200, 30.0, [0.2, 0.2, 0.2]))]
    j = merge_ranks(rows)
    assert j.throughput_samples_per_s == 285.0
    assert j.step_time_s == 0.35 and j.data_wait_fraction == 0.20
    assert j.peak_memory_bytes == 1500 and "largest of 3 ranks" in j.peak_memory_source
    assert j.step_times_s == [0.35, 0.4, 0.5]  # per step, the slowest rank; common length
    # RAPL counts a host's packages, which its ranks share: once per host.
    assert j.energy_j_per_step == 70.0 and "summed over 2 hosts" in j.energy_source
    nvml = [(h, _m(1.0, 1.0, 0.0, 1, 5.0, [1.0], esrc="NVML total-energy counter"))
            for h in "aab"]
    assert merge_ranks(nvml).energy_j_per_step == 15.0  # per device: every rank's
    unknown = [rows[0], ("b", _m(95.0, 0.33, 0.01, 1200, None, [0.2], esrc="RAPL"))]
    assert merge_ranks(unknown).energy_j_per_step is None  # one rank unknown: the job unknown


def test_the_loader_trial_of_the_job_is_its_laggiest_rank() -> None:
    s = LoaderSettings(num_workers=2)
    fast = Trial(settings=s, torch_threads=1, samples_per_s=100.0, data_wait_fraction=0.01,
                 cpu_cores_busy=0.5, seconds=3.0, timed_batches=16)
    slow = Trial(settings=s, torch_threads=1, samples_per_s=80.0, data_wait_fraction=0.3,
                 cpu_cores_busy=0.9, seconds=4.0, timed_batches=12)
    t = merge_rank_trials([fast, slow])
    assert (t.samples_per_s, t.data_wait_fraction, t.cpu_cores_busy, t.seconds,
            t.timed_batches) == (180.0, 0.3, 0.9, 4.0, 12)


def _check(passed: bool, rel: float, reason: str) -> NumericsCheck:
    return NumericsCheck(precision="bf16", steps=4, loss_fp32=[], loss_candidate=[],
                         grad_norm_fp32=[], grad_norm_candidate=[], overflow_steps=0,
                         max_loss_rel=rel, max_grad_norm_rel=0.0, passed=passed, reason=reason)


def test_a_precision_passes_only_if_it_passes_on_every_rank() -> None:
    c = worst_check([_check(True, 0.01, "ok"), _check(False, 0.5, "loss drifts 50%")])
    assert not c.passed and c.reason == "rank 1: loss drifts 50%"
    ok = worst_check([_check(True, 0.01, "ok"), _check(True, 0.02, "fine")])
    assert ok.passed and ok.reason == "fine (every one of 2 ranks passed; rank 1 deviated most)"


@pytest.fixture
def gloo() -> Iterator[None]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_rewrap_keeps_the_users_settings_and_trains_the_same(gloo: None) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    ref = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
    ref.load_state_dict(net.state_dict())
    user = DDP(net, find_unused_parameters=True, bucket_cap_mb=25)
    mb, why = bucket_candidate(user) or (0.0, "")
    grads = sum(p.numel() * 4 for p in net.parameters())
    assert mb == pytest.approx(grads / 4 / 2**20) and "fit one 25 MiB bucket" in why
    new = rewrap(user, DdpSettings(bucket_cap_mb=mb, gradient_as_bucket_view=True))
    assert isinstance(new, DDP) and new is not user and new.module is net
    assert new.bucket_bytes_cap == int(mb * 2**20) and new.gradient_as_bucket_view
    assert new.find_unused_parameters  # the user's own setting, carried over
    assert rewrap(user, DdpSettings()) is user  # nothing to change: the user's model
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    nn.functional.cross_entropy(new(x), y).backward()
    nn.functional.cross_entropy(ref(x), y).backward()
    for a, b in zip(net.parameters(), ref.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_a_model_with_a_comm_hook_is_not_rewrapped(gloo: None) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    m = DDP(nn.Linear(4, 4))
    m.register_comm_hook(None, default_hooks.allreduce_hook)
    assert "communication hook is registered" in (cannot_rewrap(m) or "")
    with pytest.raises(ValueError, match="communication hook"):
        rewrap(m, DdpSettings(bucket_cap_mb=1.0))


def test_the_tuned_loop_rewraps_a_ddp_model_with_the_plans_buckets(gloo: None) -> None:
    """The DDP knob's apply stage: the loop trains the user's DDP model re-wrapped with the
    plan's bucket settings, and a plan without DDP settings leaves it as built."""
    from torch.utils.data import DataLoader, TensorDataset

    from factories import plan_key
    from redline.tune.knobs import TunePlan
    from redline.tune.knobs.ddp import DDP as DDP_KNOB
    from redline.tune.knobs.ddp import DdpFields
    from redline.tune.runtime import TunedLoop

    assert DDP_KNOB.records and DDP_KNOB.plan_fields is DdpFields
    net = nn.Linear(8, 2)
    user = DDP(net)
    loader = DataLoader(TensorDataset(torch.randn(16, 8), torch.randint(0, 2, (16,))),
                        batch_size=8)

    def loss(model: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    settings = DdpSettings(bucket_cap_mb=1.0, gradient_as_bucket_view=True)
    plan = TunePlan(key=plan_key(), effective_batch=8, micro_batch=8, ddp=settings)
    with TunedLoop(plan, user, torch.optim.SGD(net.parameters(), lr=0.1), loader, loss,
                   torch.device("cpu")) as loop:
        assert isinstance(loop.model, DDP) and loop.model is not user
        assert loop.model.bucket_bytes_cap == 2**20 and loop.model.gradient_as_bucket_view
        assert torch.isfinite(loop.step(next(iter(loop.loader))))
    plain = dataclasses.replace(plan, ddp=DdpSettings())
    with TunedLoop(plain, user, torch.optim.SGD(net.parameters(), lr=0.1), loader, loss,
                   torch.device("cpu")) as loop:
        assert loop.model is user
