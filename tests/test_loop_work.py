"""The time outside every phase, named by the user's lines: the stack sampler, GC timing, the
host-work findings and periodic stalls, on real loops under a watch."""

from __future__ import annotations

import gc
import itertools
import json
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import redline
from factories import measurements
from redline.core.findings import Finding
from redline.core.measurements import CodeSite, LoopWork, PeriodicStall
from redline.diagnose import diagnose
from redline.measure.loop_work import periodic_stall
from redline.measure.stacks import CodeSampler, GcPauses
from redline.measure.step_record import PHASES, StepRecord
from redline.measure.timeline import StepTracker

HERE = os.path.relpath(__file__)
"""How the report names this file (relative to the working folder)."""


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
                y: torch.Tensor) -> torch.Tensor:
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def _run(body: Any, steps: int = 40, **cfg: Any) -> tuple[redline.Report, Any]:
    model, opt = _model()
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    with redline.watch(warmup_steps=2, count_flops=False, **cfg) as w:
        for step in range(steps):
            loss = _train_step(model, opt, x, y)
            body(step, model, opt, loss)
    return w.report(show=False), w


def _found(report: redline.Report, fid: str) -> Finding:
    hits = [f for f in report.findings if f.id == fid]
    assert hits, f"no {fid}: {[(f.id, f.title) for f in report.findings]}"
    return hits[0]


def _ids(report: redline.Report) -> set[str]:
    return {f.id for f in report.findings}


def test_checkpoint_saves_are_named_with_their_line_and_period(tmp_path: Path) -> None:
    big = torch.randn(1500, 1500)  # 9 MB, written every 4th step

    def body(step: int, model: nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        if step % 4 == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "ema": big}, tmp_path / "ck.pt")

    report, _ = _run(body, steps=42)
    f = _found(report, "checkpoint_in_loop")
    assert f.evidence["step_fraction"] >= 0.05  # type: ignore[operator]
    assert str(f.evidence["site_1"]).startswith(f"{HERE}:")
    assert "torch.save(" in str(f.evidence["site_1_code"])
    assert "Save less often" in f.fix
    assert f.ceiling_speedup is not None and f.ceiling_speedup > 1.0
    assert "host_work_in_loop" not in _ids(report)


def test_per_step_logging_with_item_calls_is_logging_in_loop(tmp_path: Path) -> None:
    log = (tmp_path / "log.jsonl").open("a")

    def body(step: int, model: nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        for _ in range(60):
            stats = {n: [p.mean().item(), p.std().item(), p.abs().max().item()]
                     for n, p in model.named_parameters()}
            log.write(json.dumps({"step": step, "loss": loss.item(), "params": stats}) + "\n")

    report, _ = _run(body)
    log.close()
    f = _found(report, "logging_in_loop")
    assert str(f.evidence["site_1"]).startswith(f"{HERE}:")
    assert ".item()" in f.fix


def test_gc_collect_every_step_is_timed_exactly_and_its_line_named() -> None:
    junk = [[{} for _ in range(20)] for _ in range(2000)]  # objects for every full collection

    def body(step: int, model: nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        gc.collect()

    report, w = _run(body, steps=25)
    del junk
    f = _found(report, "gc_pauses")
    lw = report.measurements.loop
    assert lw is not None and lw.gc_collections[2] >= 20  # one per measured step
    assert f.evidence["gc_pause_fraction"] >= 0.3  # type: ignore[operator]
    assert "gc.collect()" in f.title and f"{HERE}:" in f.title
    assert "gc.freeze()" in f.fix
    assert w.gc_pauses is not None and w.gc_pauses._callback not in gc.callbacks  # removed with the watch


def test_batches_built_from_python_lists_in_the_loop() -> None:
    rows = torch.randn(2048, 32).tolist()
    labels = torch.randint(0, 4, (2048,)).tolist()
    model, opt = _model()
    with redline.watch(warmup_steps=2, count_flops=False) as w:
        for step in range(40):
            idx = [(step * 131 + k * 17) % 2048 for k in range(1024)]
            xb = torch.tensor([rows[i] for i in idx])
            yb = torch.tensor([labels[i] for i in idx])
            _train_step(model, opt, xb, yb)
    report = w.report(show=False)
    f = _found(report, "batches_built_in_loop")
    assert "torch.tensor(" in str(f.evidence["site_1_code"])
    assert "DataLoader" in f.fix


def _py_metric(out: list[float]) -> float:
    s = 0.0
    for v in out:
        s += v * v
    return s


def test_other_host_code_is_named_by_line_with_its_share() -> None:
    values = [float(i) for i in range(600_000)]

    def body(step: int, model: nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        _py_metric(values)

    report, _ = _run(body, steps=20)
    f = _found(report, "host_work_in_loop")
    lw = report.measurements.loop
    assert lw is not None and lw.other_fraction > 0.25
    assert f.evidence["site_1"] == f"{HERE}:{_py_metric.__code__.co_firstlineno + 3} (_py_metric)" or \
        str(f.evidence["site_1"]).endswith("(_py_metric)")
    assert f.ceiling_speedup is not None and f.ceiling_speedup > 1.2
    # every second of the step is accounted for: the sites' shares add up to 'other'
    total = sum(lw.kind_fractions.values())
    assert total == pytest.approx(lw.other_fraction, abs=0.02)


def test_a_stall_every_kth_step_is_named_with_its_period() -> None:
    def body(step: int, model: nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        if step % 5 == 0:
            time.sleep(0.2)

    report, _ = _run(body, steps=32)
    lw = report.measurements.loop
    assert lw is not None and lw.periodic is not None
    assert lw.periodic.period_steps == 5 and lw.periodic.phase == "other"
    assert lw.periodic.site is not None and "time.sleep(0.2)" in str(lw.periodic.site.text)
    f = next(f for f in report.findings if f.id == "periodic_stall")
    assert "host_work_in_loop" not in _ids(report)  # the period is the diagnosis
    assert f.evidence["period_steps"] == 5


def test_a_compute_bound_loop_gets_no_host_finding() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 512)
    with redline.watch(warmup_steps=2, count_flops=False) as w:
        for _ in range(25):
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    report = w.report(show=False)
    assert not _ids(report) & {"host_work_in_loop", "logging_in_loop", "checkpoint_in_loop",
                               "gc_pauses", "batches_built_in_loop", "periodic_stall"}


def test_a_tick_inside_a_phase_reads_no_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = StepTracker(time.perf_counter)
    sampler = CodeSampler(tracker, 0, lambda: True)
    calls = []
    monkeypatch.setattr(sys, "_current_frames", lambda: calls.append(1) or {})
    tracker.enter(PHASES.index("forward"), 0.0)
    sampler.tick(1.0)
    sampler.tick(1.01)
    assert calls == [] and sampler.inside_s == pytest.approx(0.01)
    tracker.exit(PHASES.index("forward"), 1.02)
    sampler.tick(1.03)
    assert calls == [1]  # outside every phase, the stack is read


def test_ticks_slow_in_warm_up_and_while_little_time_is_outside_the_phases() -> None:
    """Every tick takes the GIL from the loop: in warm-up (nothing recorded) and while under 1 %
    of the window is outside the phases (no host-work finding can reach its 5 %) ticks come
    every 50 ms; the window's first tick weighs nothing, and at 2 % outside the configured
    period is back."""
    from redline.measure import stacks

    measuring = [False]
    tracker = StepTracker(time.perf_counter)
    sampler = CodeSampler(tracker, 0, lambda: measuring[0], interval_s=0.005, jitter=(1, 1))
    assert sampler.tick(1.0) == stacks.SLOW_TICK_S == sampler.slow_interval_s == 0.05
    assert sampler.tick(1.05) == 0.05 and sampler.ticks == 0
    measuring[0] = True
    tracker.enter(PHASES.index("forward"), 1.06)
    # the window's first tick: the 50 ms before it are partly warm-up's
    assert sampler.tick(1.10) == 0.005 and sampler.inside_s == 0.0
    t = 1.10
    periods = []
    for _ in range(stacks.DECIDE_AFTER_TICKS + 1):
        t += 0.005
        periods.append(sampler.tick(t))
    assert set(periods[:stacks.DECIDE_AFTER_TICKS]) == {0.005}
    assert periods[-1] == 0.05  # 0 % outside the phases in the 100 ticks before
    assert sampler.inside_s == pytest.approx(0.005 * (stacks.DECIDE_AFTER_TICKS + 1))
    # a slowed tick weighs up to 4 of its own periods, not of the configured one
    t += 0.2
    sampler.tick(t)
    assert sampler.inside_s == pytest.approx(0.005 * (stacks.DECIDE_AFTER_TICKS + 1) + 0.2)
    tracker.exit(PHASES.index("forward"), t)
    # outside the phases: 1.5 % does not bring the fast ticks back, 2 % does, from the tick
    # after the one that reached it (the period never follows where the loop is at a tick)
    inside = sampler.inside_s
    t += inside * 0.015 / 0.985
    assert sampler.tick(t) == 0.05
    t += inside * 0.006
    assert sampler.tick(t) == 0.05
    tracker.enter(PHASES.index("forward"), t)
    t += 0.01
    assert sampler.tick(t) == 0.005


def test_the_slowed_period_is_never_longer_than_the_ticking_threads_interval() -> None:
    tracker = StepTracker(time.perf_counter)
    assert CodeSampler(tracker, 0, lambda: False, interval_s=0.005,
                       longest_s=0.02, jitter=(1, 1)).tick(1.0) == 0.02
    # drawn periods too
    jittered = CodeSampler(tracker, 0, lambda: False, interval_s=0.005, longest_s=0.02)
    assert max(jittered.tick(1.0 + k) for k in range(50)) == 0.02
    assert CodeSampler(tracker, 0, lambda: False, interval_s=0.1).slow_interval_s == 0.1


def test_the_cpu_sampler_ticks_at_the_period_its_ticker_returns() -> None:
    from redline.measure.cpu import CpuSampler

    calls: list[float] = []

    def ticker(now: float) -> float:
        calls.append(now)
        return 0.2

    cpu = CpuSampler(interval_s=0.5)
    cpu.set_ticker(ticker, 0.005)
    cpu.start()
    time.sleep(0.6)
    cpu.stop()
    # the first tick after 5 ms, then every 200 ms or at the 0.5 s sample: at most 5 in
    # 0.6 s (a slow machine makes fewer, never more); at the 5 ms period it would be ~100
    assert 1 <= len(calls) <= 5


def test_a_ticker_slower_than_the_cpu_interval_does_not_delay_the_cpu_samples() -> None:
    from redline.measure.cpu import CpuSampler

    cpu = CpuSampler(interval_s=0.07)
    cpu.set_ticker(lambda now: 0.05, 0.005)
    samples: list[float] = []
    cpu.on_sample = lambda t, rss, children: samples.append(t)
    cpu.start()
    time.sleep(0.5)
    taken = list(samples)  # before stop(), whose own last sample may come at any moment
    cpu.stop()
    # the 50 ms ticks do not stretch the 70 ms interval to 100 ms: a slow machine could
    # stretch each gap, so the check is on the shortest, which a cut wait keeps near 70 ms
    gaps = sorted(b - a for a, b in itertools.pairwise(taken))
    assert gaps and gaps[0] < 0.09


def test_samples_count_once_their_step_closes_and_after_the_last_step_none_do() -> None:
    """A sample outside the phases belongs to the step in progress: it counts when that step
    closes; the samples taken after the last step's end (end-of-training work, the watch's
    own close) are no step's and are dropped."""
    import threading

    tracker = StepTracker(time.perf_counter)
    sampler = CodeSampler(tracker, threading.get_ident(), lambda: True)
    sampler.tick(1.0)
    sampler.tick(1.004)  # step 0, outside every phase
    assert sampler.weights == {} and sampler.outside_s == 0.0  # step 0 still open
    tracker.manual_step(1.005)
    sampler.tick(1.008)  # step 1: step 0 has closed, its sample counts
    assert sampler.outside_s == pytest.approx(0.004)
    tracker.manual_step(1.009)
    sampler.tick(1.012)  # after the last step: never closes
    sampler.settle()
    assert sampler.outside_s == pytest.approx(0.008)
    assert [step for step, _, _ in sampler.per_step] == [0, 1]
    assert sum(n for _, n in sampler.weights.values()) == 2.0


def test_work_after_the_last_step_is_not_named_as_the_steps_host_work() -> None:
    """Seconds of Python after the loop's last step, inside the watch, take no share of the
    steps' time outside the phases."""
    model, opt = _model()
    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
    values = [float(i) for i in range(600_000)]
    with redline.watch(warmup_steps=2, count_flops=False) as w:
        for _ in range(20):
            _train_step(model, opt, x, y)
        t_end = time.perf_counter() + 1.0
        while time.perf_counter() < t_end:
            _py_metric(values)
    report = w.report(show=False)
    lw = report.measurements.loop
    assert lw is not None
    assert not any(s.function == "_py_metric" for s in lw.sites), lw.sites
    assert not any("_py_metric" in f.title for f in report.findings)


def test_library_frames_fold_into_the_users_line() -> None:
    import threading

    tracker = StepTracker(time.perf_counter)
    sampler = CodeSampler(tracker, threading.get_ident(), lambda: True)
    frame = sys._getframe()
    key = sampler._site(frame)
    assert key is not None and key.file == __file__
    assert key.function == "test_library_frames_fold_into_the_users_line"

    # a frame of torch.serialization under the user's line names the kind
    import torch.serialization as ser

    def fake_save() -> Any:
        return sampler._site(sys._getframe())

    code = fake_save.__code__.replace(co_filename=ser.__file__, co_name="_save")
    inner = type(fake_save)(code, fake_save.__globals__, "_save", None, fake_save.__closure__)
    k = inner()
    assert k is not None and k.kind == "checkpoint" and k.via == "torch.serialization:_save"
    assert k.file == __file__  # folded into this test's line that called it


def test_gc_pauses_count_only_the_measured_window() -> None:
    tracker = StepTracker(time.perf_counter)
    on = [False]
    g = GcPauses(tracker, lambda: on[0])
    from contextlib import ExitStack

    with ExitStack() as stack:
        g.install(stack)
        gc.collect()
        assert g.pause_s == 0.0 and g.paused_s(time.perf_counter()) > 0.0
        on[0] = True
        gc.collect()
        assert g.collections[2] == 1 and g.pause_s > 0.0 and g.outside_s == g.pause_s
        assert any(f == __file__ for f, _, _ in g.full_callers)
    assert g._callback not in gc.callbacks


def test_a_collection_started_with_no_python_frame_is_timed_without_an_error() -> None:
    """A thread started on a C function (``_thread.start_new_thread(gc.collect, ())``) runs
    the collection with no Python frame under the callback: it is timed, with no caller, and
    nothing is printed as "Exception ignored"."""
    import _thread

    tracker = StepTracker(time.perf_counter)
    g = GcPauses(tracker, lambda: True)
    unraisable: list[Any] = []
    from contextlib import ExitStack

    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with ExitStack() as stack:
            g.install(stack)
            before = g.collections[2]
            _thread.start_new_thread(gc.collect, ())
            deadline = time.monotonic() + 10
            while g.collections[2] == before and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        sys.unraisablehook = hook
    assert g.collections[2] == before + 1
    assert unraisable == []


def _rec(i: int, step_s: float, other_s: float = 0.0, data_s: float = 0.0) -> StepRecord:
    phases = [0.0] * len(PHASES)
    phases[PHASES.index("data_wait")] = data_s
    phases[PHASES.index("forward")] = step_s - other_s - data_s
    return StepRecord(index=i, start_s=i * 1.0, end_s=i * 1.0 + step_s, phases=phases)


def test_periodic_stall_arithmetic_and_phase() -> None:
    steps = [_rec(i, 0.010 + (0.040 if i % 5 == 0 else 0.0), data_s=0.040 if i % 5 == 0 else 0.0)
             for i in range(3, 60)]
    p = periodic_stall(steps, None)
    assert p is not None and p.period_steps == 5 and p.phase == "data_wait"
    assert p.slow_steps == 11
    assert p.extra_s_per_slow_step == pytest.approx(0.040, rel=1e-6)
    assert p.step_fraction == pytest.approx(11 * 0.040 / sum(s.step_s for s in steps))
    # irregular slow steps: no period
    irregular = [_rec(i, 0.05 if i in (4, 7, 15, 16, 30) else 0.01) for i in range(60)]
    assert periodic_stall(irregular, None) is None
    # chance stalls of every size, three of them on one residue mod 15: no period
    chance = [_rec(i, {5: 0.6, 20: 0.05, 35: 0.2, 9: 0.3, 41: 0.4}.get(i, 0.01))
              for i in range(3, 53)]
    assert periodic_stall(chance, None) is None
    # no slow step
    assert periodic_stall([_rec(i, 0.01) for i in range(60)], None) is None


def _loop(**kw: Any) -> LoopWork:
    base = LoopWork(other_fraction=0.0, sampled_s=1.0, samples=100, interval_s=0.005, sites=[],
                    kind_fractions={}, gc_pause_fraction=0.0, gc_collections=[0, 0, 0],
                    gc_full_sites=[], periodic=None)
    return replace(base, **kw)


def test_periodic_stall_finding_for_a_data_wait_every_kth_step() -> None:
    p = PeriodicStall(period_steps=8, slow_steps=6, extra_s_per_slow_step=0.09,
                      step_fraction=0.2, phase="data_wait", site=None)
    m = replace(measurements(phases={"data_wait": 0.02, "forward": 0.9}), loop=_loop(periodic=p))
    f = next(f for f in diagnose(m) if f.id == "periodic_stall")
    assert "Every 8th step" in f.title and "data_wait" in f.title
    assert f.ceiling_speedup == pytest.approx(1 / 0.8)


def test_a_periodic_checkpoint_is_told_inside_its_finding() -> None:
    site = CodeSite(file="train.py", line=57, function="train", kind="checkpoint",
                    via="torch.serialization:_save", step_fraction=0.4, samples=40,
                    text="torch.save(state, path)")
    p = PeriodicStall(period_steps=5, slow_steps=9, extra_s_per_slow_step=0.2,
                      step_fraction=0.38, phase="other", site=site)
    lw = _loop(other_fraction=0.42, sites=[site], kind_fractions={"checkpoint": 0.4},
               periodic=p)
    found = diagnose(replace(measurements(phases={"forward": 0.5}), loop=lw))
    ids = [f.id for f in found]
    assert "checkpoint_in_loop" in ids and "periodic_stall" not in ids
    f = found[ids.index("checkpoint_in_loop")]
    assert "every 5 steps" in f.title and "train.py:57" in f.title
    assert f.ceiling_speedup == pytest.approx(1 / 0.6)


def test_on_cuda_the_ceiling_is_bounded_by_the_device_idle_share() -> None:
    site = CodeSite(file="train.py", line=9, function="log", kind="logging", via=None,
                    step_fraction=0.5, samples=50, text="print(loss.item())")
    lw = _loop(other_fraction=0.5, sites=[site], kind_fractions={"logging": 0.5})
    m = measurements(device="cuda", cc="9.0", dev={"device_span_fraction": 0.8})
    f = next(f for f in diagnose(replace(m, loop=lw)) if f.id == "logging_in_loop")
    assert f.ceiling_speedup == pytest.approx(1 / 0.8)  # the device idles 20 %, not 50 %


@pytest.mark.parametrize(("via", "framework", "setting"), [
    ("transformers.trainer:_maybe_log_save_evaluate", "the Hugging Face Trainer",
     "logging_steps"),
    ("transformers.trainer:_prepare_input", "the Hugging Face Trainer",
     "remove_unused_columns"),
    ("transformers:num_parameters", "the Hugging Face Trainer", "Override floating_point_ops"),
    ("lightning.pytorch.loops.fit_loop:advance", "Lightning", "log_every_n_steps"),
    (None, None, "vectorize"),
])
def test_host_code_inside_a_framework_is_told_as_the_framework_s_own(
        via: str | None, framework: str | None, setting: str) -> None:
    """The sampled line is the user's ``trainer.train()``; the code under it is the
    framework's: the finding says whose work it is and which settings make it run less often."""
    site = CodeSite(file="train.py", line=73, function="<module>", kind="code", via=via,
                    step_fraction=0.15, samples=30, text="trainer.train()")
    lw = _loop(other_fraction=0.16, sites=[site], kind_fractions={"code": 0.15})
    f = next(f for f in diagnose(replace(measurements(phases={"forward": 0.5}), loop=lw))
             if f.id == "host_work_in_loop")
    assert f.evidence.get("framework") == framework
    assert setting in f.fix and "train.py:73" in f.title
    if via is not None and via.endswith(("_prepare_input", "num_parameters")):
        # work that logging and progress settings do not change is not sent to them
        assert "logging_steps" not in f.fix and "disable_tqdm" not in f.fix
    if framework is not None:
        assert f.fix.startswith(f"The largest share is {framework}'s own per-step work ({via})")


def test_host_code_no_sample_named_keeps_its_ceiling_and_ranks_by_it() -> None:
    """82 % of the step outside the phases with no stack sample to name the code: the
    finding still bounds what removing it gives, so it ranks above a 7 % data wait."""
    m = replace(measurements(phases={"data_wait": 0.07, "forward": 0.03, "backward": 0.04,
                                     "optimizer": 0.03}),
                loop=_loop(other_fraction=0.83, samples=0, sampled_s=0.0))
    found = diagnose(m)
    f = found[0]
    assert f.id == "host_work_in_loop" and "no stack sample" in f.title
    assert f.ceiling_speedup == pytest.approx(1 / (1 - 0.83))


@pytest.mark.parametrize("kind", ["loss", "batch", "code"])
def test_one_stack_sample_does_not_name_where_most_of_the_step_went(kind: str) -> None:
    """91 % of each step outside the phases and a single stack sample there (a pure-Python
    batch builder that holds the GIL: the sampler gets it at the loss's call): the sample's
    line does not take the whole share, and the time is still told, as a whole."""
    site = CodeSite(file="train.py", line=44, function="main", kind=kind, via=None,
                    step_fraction=0.913, samples=1, text="loss = F.cross_entropy(model(xb), yb)")
    lw = _loop(other_fraction=0.915, samples=1, sampled_s=0.005, sites=[site],
               kind_fractions={kind: 0.913})
    m = replace(measurements(phases={"forward": 0.03, "backward": 0.04, "optimizer": 0.015}),
                loop=lw)
    found = diagnose(m)
    assert [f.id for f in found] == ["host_work_in_loop"], [f.id for f in found]
    assert "too few to name its code" in found[0].title and "train.py" not in found[0].title
    assert found[0].ceiling_speedup == pytest.approx(1 / (1 - 0.915))
    # three samples are enough to name it
    three = replace(lw, samples=3, sites=[replace(site, samples=3)])
    ids = [f.id for f in diagnose(replace(m, loop=three))]
    assert ids[:1] == {"loss": [], "batch": ["batches_built_in_loop"],
                       "code": ["host_work_in_loop"]}[kind], ids


def _confusion(pred: list[int], true: list[int]) -> list[list[int]]:
    table = [[0] * 4 for _ in range(4)]
    for _ in range(1000):  # a per-step metric in pure Python (~8 ms): it holds the GIL
        for p, t in zip(pred, true, strict=True):
            table[t][p] += 1
    return table


def test_pure_python_beside_a_dataloader_is_sampled_where_it_runs() -> None:
    """A per-step metric in pure Python holds the GIL for most of the step; the batches come
    from a DataLoader whose collate releases it. The ticks must land in the metric (where the
    time goes), not at the collate (where the GIL is next released)."""
    from torch.utils.data import DataLoader, TensorDataset

    model, opt = _model()
    data = TensorDataset(torch.randn(16384, 32), torch.randint(0, 4, (16384,)))
    with redline.watch(warmup_steps=2, count_flops=False) as w:
        for step, (x, y) in enumerate(DataLoader(data, batch_size=256)):
            _train_step(model, opt, x, y)
            _confusion(model(x).argmax(1).tolist(), y.tolist())
            if step == 40:
                break
    report = w.report(show=False)
    lw = report.measurements.loop
    assert lw is not None and lw.other_fraction > 0.5 and lw.samples >= 20
    f = _found(report, "host_work_in_loop")
    assert str(f.evidence["site_1"]).endswith("(_confusion)")
    # the samples split the step as the phases' clock does (within a fifth of it)
    assert lw.kind_fractions["code"] == pytest.approx(lw.other_fraction, abs=0.2)


def test_the_switch_interval_is_lowered_while_sampling_and_given_back() -> None:
    import sys
    from contextlib import ExitStack

    from redline.measure.stacks import SWITCH_INTERVAL_S, shorten_switch_interval

    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        with ExitStack() as stack:
            shorten_switch_interval(stack)
            assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
        assert sys.getswitchinterval() == pytest.approx(0.005)
        # a program that changed it meanwhile keeps its own value
        with ExitStack() as stack:
            shorten_switch_interval(stack)
            sys.setswitchinterval(0.002)
        assert sys.getswitchinterval() == pytest.approx(0.002)
        # a lower value is left as it is
        sys.setswitchinterval(0.0002)
        with ExitStack() as stack:
            shorten_switch_interval(stack)
            assert sys.getswitchinterval() == pytest.approx(0.0002)
        # the watch does it for its life only
        sys.setswitchinterval(0.005)
        _run(lambda *a: None, steps=5)
        assert sys.getswitchinterval() == pytest.approx(0.005)
    finally:
        sys.setswitchinterval(before)


def test_tick_periods_are_drawn_around_the_nominal_one() -> None:
    tracker = StepTracker(time.perf_counter)
    sampler = CodeSampler(tracker, 0, lambda: False, interval_s=0.005)
    periods = [sampler.tick(1.0 + k) for k in range(200)]  # warm-up: nominal 50 ms
    assert all(0.025 <= p <= 0.075 for p in periods)
    assert len(set(periods)) > 150 and 0.045 < sum(periods) / len(periods) < 0.055


def test_samples_between_bridged_evaluation_forwards_are_not_the_loops_lines() -> None:
    """Ticks between two evaluation forwards of a step (a validation loop's metrics) count
    as evaluation once the step closes; those after the last forward stay the loop's."""
    tracker = StepTracker(time.perf_counter)
    sampler = CodeSampler(tracker, threading.get_ident(), lambda: True, interval_s=0.01,
                          jitter=(1, 1))
    ev = PHASES.index("evaluation")

    def forward(start: float, end: float) -> None:
        tracker.bridge_evaluation(start)
        tracker.push([ev, start, 0.0])
        tracker.exit(ev, end)
        tracker.evaluation_forward_ended(end)

    sampler.tick(1.0)  # opens the window
    forward(1.0, 1.01)
    sampler.tick(1.02)  # between two forwards: 0.02 s
    sampler.tick(1.03)  # 0.01 s
    forward(1.04, 1.05)
    sampler.tick(1.06)  # after the last forward: 0.03 s, the loop's own
    tracker.manual_step(1.07)
    sampler.tick(1.08)  # the next step: commits the last one's samples
    assert list(tracker.evaluation_spans) == [(1.01, 1.04)]
    assert sampler.outside_s == pytest.approx(0.03)
    assert sampler.inside_s == pytest.approx(0.03)
    (seconds, samples), = sampler.weights.values()
    assert seconds == pytest.approx(0.03) and samples == 1
