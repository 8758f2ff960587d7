"""GPU-side logic exercised on CPU through stand-ins (design §5): CUDA events are replaced by
fake events with a controllable clock, NVML by a fake ``pynvml`` module, and host→device copies
by copies to the ``meta`` device. The real CUDA paths run in benchmarks/gpu_check.py."""

from __future__ import annotations

import time
import warnings
from typing import Any

import pytest
import torch
from torch import nn

from factories import FakeNvml
from redline.measure.cuda import SYNC_WARNING, CudaStepTimer, SyncCounter
from redline.measure.hooks import Instrumentation
from redline.measure.nvml import NvmlSampler
from redline.measure.timeline import StepTracker


class FakeEvent:
    """An event whose device timestamp is set when the fake device 'reaches' it."""

    clock = 0.0
    done_until = 0.0  # the fake device has executed everything recorded before this time

    def __init__(self) -> None:
        self.t: float | None = None

    def record(self) -> None:
        self.t = FakeEvent.clock

    def query(self) -> bool:
        return self.t is not None and self.t <= FakeEvent.done_until

    def synchronize(self) -> None:
        FakeEvent.done_until = max(FakeEvent.done_until, self.t or 0.0)

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.t is not None and end.t is not None
        return (end.t - self.t) * 1e3  # ms, like torch.cuda.Event


def test_cuda_timer_never_blocks_and_resolves_lazily() -> None:
    FakeEvent.clock, FakeEvent.done_until = 0.0, 0.0
    timer = CudaStepTimer(FakeEvent)
    for i in range(3):
        FakeEvent.clock = i * 1.0 + 0.2
        timer.work_begins()
        FakeEvent.clock = i * 1.0 + 0.2 + 0.5
        timer.work_begins()  # a second forward in the same step records nothing new
        timer.step_ends(i)
    assert timer.device_s == {}  # the device has not finished anything yet: nothing waited
    FakeEvent.done_until = 1.8
    timer.poll()
    assert timer.device_s == pytest.approx({0: 0.5, 1: 0.5})
    timer.drain()  # at exit only
    assert timer.device_s[2] == pytest.approx(0.5)


def test_device_time_excludes_data_fetches_between_micro_batches() -> None:
    """Accumulation: the host fetches a batch between micro-batches; the device is idle then,
    so a step's device time is the sum of its work segments, not first work → step end."""
    FakeEvent.clock, FakeEvent.done_until = 0.0, 0.0
    timer = CudaStepTimer(FakeEvent)
    for t_work, t_fetch in ((0.0, 0.2), (1.2, 1.5)):  # two micro-batches, 1 s of fetch between
        FakeEvent.clock = t_work
        timer.work_begins()
        FakeEvent.clock = t_fetch
        timer.work_pauses()
    timer.work_pauses()  # a second pause without work in between records nothing
    FakeEvent.clock = 1.6
    timer.work_begins()  # the optimizer step
    FakeEvent.clock = 1.7
    timer.step_ends(0)
    timer.drain()
    assert timer.device_s[0] == pytest.approx(0.2 + 0.3 + 0.1)


def test_instrumentation_pauses_device_work_at_each_fetch_and_resumes_at_backward() -> None:
    """The hooks open a segment at forward, backward and optimizer step and close it when the
    loop asks the DataLoader for a batch — also for a batch fetched between forward and
    backward, whose backward must still count."""
    from contextlib import ExitStack

    from torch.utils.data import DataLoader, TensorDataset

    calls: list[str] = []
    tracker = StepTracker(time.perf_counter)
    inst = Instrumentation(tracker, "cpu", on_work=lambda: calls.append("work"),
                           on_data=lambda: calls.append("data"))
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)
    with ExitStack() as stack:
        inst.install(stack)
        it = iter(loader)
        (x,) = next(it)
        loss = model(x).sum()
        (x_next,) = next(it)  # fetched mid-step
        loss.backward()
        loss = model(x_next).sum()
        loss.backward()
        opt.step()
    # fetch, forward, fetch (mid-step), backward, forward, backward, optimizer step
    assert calls == ["data", "work", "data", "work", "work", "work", "work"]


def test_step_without_device_work_has_no_device_time() -> None:
    timer = CudaStepTimer(FakeEvent)
    timer.step_ends(0)
    timer.drain()
    assert timer.device_s == {}


def test_nvml_sampler_summary_from_fake_driver() -> None:
    nv = FakeNvml()
    s = NvmlSampler(0, 0.05, nv)  # type: ignore[arg-type]
    assert nv.inited
    s.mark()
    s.sample()
    s.sample()
    out = s.summary()
    assert out.util_gpu_pct == 80 and out.util_memory_pct == 30
    assert out.power_w == 250.0
    assert out.memory_used_peak_bytes == 10 * 2**30
    assert out.clock_event_reasons == ["gpu_idle", "sw_power_cap"]
    assert out.energy_j == 5.0  # one counter delta between mark() and summary()
    assert out.gpm_sm_active_pct is None and "GPM" in (out.gpm_reason or "")


def test_sync_counter_counts_sync_warnings_and_forwards_others() -> None:
    seen: list[str] = []
    c = SyncCounter()
    c._prev_show = lambda msg, *a, **k: seen.append(str(msg))
    c._show(UserWarning(f"xyz {SYNC_WARNING}"), UserWarning, "f.py", 1)
    c._show(UserWarning("something else"), UserWarning, "f.py", 2)
    assert c.count == 1 and sum(c.sites.values()) == 1
    assert seen == ["something else"]


def test_host_to_device_copies_are_timed() -> None:
    """Copies to a non-CPU device (here 'meta', standing in for CUDA) are seen and timed;
    CPU→CPU casts through .to() are not counted as copies."""
    tracker = StepTracker(lambda: 0.0)
    inst = Instrumentation(tracker, "meta")
    from contextlib import ExitStack

    with ExitStack() as stack:
        inst.install(stack)
        x = torch.randn(64, 64)
        x.to("meta")
        x.to(torch.float64)  # cast on CPU: not a copy
        x.to("meta", non_blocking=True)
    assert inst.h2d.copies == 2
    assert inst.h2d.bytes == 2 * 64 * 64 * 4
    assert inst.h2d.pageable_bytes == inst.h2d.bytes  # nothing was pinned
    assert "to" not in vars(torch.Tensor)


def test_autocast_on_a_device_the_any_autocast_query_misses_is_seen() -> None:
    """torch's one-call "any autocast on?" answers False for an autocast on MPS: the forwards
    of an MPS job under autocast are still counted as such (autocast set here as
    ``torch.autocast("mps", ...)`` sets it; the job's tensors stay on the CPU)."""
    import redline

    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with redline.watch(device="mps", warmup_steps=1, count_flops=False,
                       stack_sample_interval_s=None) as w:
        for _ in range(5):
            torch.set_autocast_enabled("mps", True)
            torch.set_autocast_dtype("mps", torch.float16)
            try:
                loss = model(torch.randn(4, 8)).sum()
            finally:
                torch.set_autocast_enabled("mps", False)
            loss.backward()
            opt.step()
            opt.zero_grad()
    assert w.inst is not None and dict(w.inst.precision.autocast or {}) == {"fp16": 5}


def test_autocast_is_seen_on_forward() -> None:
    import redline

    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with redline.watch(warmup_steps=1, count_flops=False) as w:
            for _ in range(5):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(torch.randn(4, 8)).float().sum()
                loss.backward()
                opt.step()
    rep = w.report(show=False)
    assert rep.measurements.precision.effective == "bf16-autocast"
    assert rep.measurements.precision.autocast_forward_fraction == 1.0
    assert "no_mixed_precision" not in {f.id for f in rep.findings}


def test_compiled_model_under_watch_has_no_graph_breaks_from_redline() -> None:
    """Dynamo cannot trace the hooks' thread and clock reads; they must step aside while it
    traces, or every submodule breaks the graph (and the compiled step runs slower)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    import redline

    torch._dynamo.reset()
    counters.clear()
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    compiled = torch.compile(model, backend="eager")  # Dynamo only: graph breaks, no codegen
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    def ours() -> list[Any]:
        return [f for f in warnings.filters if f[1] is not None and "global hooks" in f[1].pattern]

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with redline.watch(warmup_steps=1, count_flops=False) as w:
            for _ in range(5):
                compiled(torch.randn(4, 8).to(torch.float32)).sum().backward()
                opt.step()
                opt.zero_grad()
        assert not [x for x in seen if "global hooks" in str(x.message)]  # not alarmed by us
        assert ours() == []  # the filter went with the watch
    assert dict(counters["graph_break"]) == {}
    assert w.report(show=False).measurements.timing.steps_measured >= 3
    torch._dynamo.reset()


def _watch_six_steps(call: Any, model: nn.Module) -> Any:
    """Six SGD steps of ``call`` (the model, compiled one way or another) under a watch with
    one warm-up step; the measurements."""
    import redline

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with redline.watch(warmup_steps=1, count_flops=False) as w:
            for _ in range(6):
                call(torch.randn(4, 8)).sum().backward()
                opt.step()
                opt.zero_grad()
    return w.report(show=False).measurements


def test_compiled_model_is_not_recompiled_when_warm_up_ends() -> None:
    """After warm-up the watch trades its global module hooks for a wrapper on the root's
    forward; Dynamo guards on both, so for a compiled model that cost a second compile (a
    second full compile time on a GPU). With a compiled module seen, the hooks stay."""
    import torch._dynamo


    torch._dynamo.reset()
    graphs = []

    def backend(gm: torch.fx.GraphModule, example: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    compiled = torch.compile(model, backend=backend)
    m = _watch_six_steps(compiled, model)
    assert len(graphs) == 1
    assert m.timing.steps_measured >= 4
    assert m.fraction("forward") > 0  # the root forward is still timed, by the global hooks
    torch._dynamo.reset()


def test_model_compiled_in_place_is_timed_from_outside() -> None:
    """``model.compile()`` makes Module.__call__ run a compiled ``_call_impl``: the global
    hooks then run inside Dynamo's frames and step aside, and the forward went unseen (its
    time counted as 'other', its device work outside the step's segments). The watch wraps
    the compiled callable from outside, and puts it back on exit."""
    import torch._dynamo


    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    model.compile(backend="eager")
    compiled_impl = vars(model)["_compiled_call_impl"]
    m = _watch_six_steps(model, model)
    assert m.timing.steps_measured >= 4
    assert m.fraction("forward") > 0.05
    assert m.counts["forward"] >= 5
    assert m.precision.param_dtype == "fp32"
    assert vars(model)["_compiled_call_impl"] is compiled_impl
    torch._dynamo.reset()


def test_optimizer_scan_survives_dead_weak_proxies() -> None:
    """The one-time scan for optimizers walks gc objects; a dead weakref.proxy among them
    (torch.compile leaves some) must not crash the user's first backward."""
    import weakref

    import redline

    class Thing:
        pass

    t = Thing()
    dead = weakref.proxy(t)
    del t
    holder = [dead]
    model = nn.Linear(4, 1)
    with redline.watch(warmup_steps=1, count_flops=False):
        opt = None
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            if opt is None:
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.step()
    assert len(holder) == 1


def test_timer_places_each_step_on_the_device_clock() -> None:
    FakeEvent.clock, FakeEvent.done_until = 5.0, 0.0
    timer = CudaStepTimer(FakeEvent)
    for i in range(2):
        FakeEvent.clock = 5.0 + i
        timer.work_begins()
        FakeEvent.clock = 5.0 + i + 0.25
        timer.step_ends(i)
    timer.drain()
    assert timer.device_window[0] == pytest.approx((0.0, 0.25))
    assert timer.device_window[1] == pytest.approx((1.0, 1.25))
    # no event outlives drain(): freed later in a forked worker, a CUDA event aborts it
    assert not any(isinstance(v, FakeEvent) for v in vars(timer).values())
    timer.reset()
    assert timer.device_window == {}


def test_span_and_throughput_use_the_device_clock_when_the_host_runs_ahead() -> None:
    """A device-bound loop queues kernels without waiting: 10 ms of host time per step while
    the device takes 100 ms. Host-clock ratios read span 1000 % and 10× the throughput; on
    the device's clock the span is 100 % and the throughput what the device delivered."""
    from redline.measure.stats import span_fraction, step_times, wall_seconds
    from redline.measure.timeline import StepRecord

    def rec(i: int, host_s: float, dev: tuple[float, float] | None, busy: float | None
            ) -> StepRecord:
        return StepRecord(index=i, start_s=i * host_s, end_s=(i + 1) * host_s, phases=[0.0] * 6, samples=32,
                          device_s=busy, device_window_s=dev)

    ahead = [rec(i, 0.01, (i * 0.1, i * 0.1 + 0.1), 0.1) for i in range(5)]
    assert wall_seconds(ahead) == pytest.approx(0.5)
    # per step, the device's periods (what the rank test compares), not 10 ms enqueues
    assert step_times(ahead) == pytest.approx([0.1] * 5)
    uneven = [rec(0, 0.01, (0.0, 0.1), 0.1), rec(1, 0.01, (0.1, 0.3), 0.2),
              rec(2, 0.01, (0.3, 0.35), 0.05)]
    assert step_times(uneven) == pytest.approx([0.1, 0.2, 0.05])
    assert span_fraction(ahead) == pytest.approx(1.0)
    # data-bound: the host waits 200 ms per step, the device works 50 ms of it
    starved = [rec(i, 0.2, (i * 0.2 + 0.15, i * 0.2 + 0.2), 0.05) for i in range(5)]
    assert wall_seconds(starved) == pytest.approx(1.0)
    assert step_times(starved) == pytest.approx([0.2] * 5)  # the host's, it ran longer
    assert span_fraction(starved) == pytest.approx(0.25)
    # two runs of steps (an excluded step between): each counted on its own longer clock
    split = [*ahead[:2], rec(7, 0.3, (0.7, 0.8), 0.1)]
    assert wall_seconds(split) == pytest.approx(0.2 + 0.3)
    # no device windows (CPU): the host clock
    cpu = [rec(i, 0.02, None, None) for i in range(3)]
    assert wall_seconds(cpu) == pytest.approx(0.06) and span_fraction([]) is None
