"""Exact step counts for every loop shape the watch must understand."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import redline
from redline.measure.step_record import BACKWARD, FORWARD, OPTIMIZER
from redline.measure.timeline import StepTracker

N = 7  # iterations of each loop


def _data(n: int = 64, d: int = 8) -> TensorDataset:
    return TensorDataset(torch.randn(n, d), torch.randn(n, 1))


def _watch() -> redline.Watch:
    return redline.watch(warmup_steps=0, count_flops=False)


def test_plain_loop_with_dataloader() -> None:
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(_data(N * 4), batch_size=4)
    with _watch() as w:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert len(w.steps) == N
    assert w.tracker.source == "optimizer"
    assert all(s.batches == 1 and s.samples == 4 for s in w.steps)
    assert all(s.phase_s["forward"] > 0 and s.phase_s["backward"] > 0 for s in w.steps)


def test_a_forward_that_steps_the_optimizer_itself_is_timed_at_every_step() -> None:
    # A module whose forward runs a whole update (meta-learning inner loops, some RL code):
    # the step ends inside the outermost forward, which must not lose count of its depth.
    class SelfUpdating(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(8, 1)
            self.opt = torch.optim.SGD(self.inner.parameters(), lr=0.1)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = nn.functional.mse_loss(self.inner(x), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            return loss.detach()

    model = SelfUpdating()
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    with redline.watch(warmup_steps=2, count_flops=False) as w:
        for _ in range(N):
            model(x, y)
    assert len(w.steps) == N
    # Each step holds the end of one forward (its tail after the update). The forward in
    # flight when the warm-up ended is lost with the per-module hooks removed then (step 2);
    # every later one is timed (a depth reset at step ends used to stop forward timing for
    # the rest of the run).
    assert all(s.phase_s["forward"] > 0 for s in w.steps[3:])
    assert all(s.phase_s["backward"] > 0 and s.phase_s["optimizer"] > 0 for s in w.steps)


def test_no_dataloader_hand_sliced_tensors() -> None:
    x, y = torch.randn(N * 5, 8), torch.randn(N * 5, 1)
    model = nn.Linear(8, 1)
    opt = torch.optim.Adam(model.parameters())
    with _watch() as w:
        for i in range(N):
            xb, yb = x[i * 5:(i + 1) * 5], y[i * 5:(i + 1) * 5]
            opt.zero_grad()
            nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
    assert len(w.steps) == N
    assert all(s.batches == 0 for s in w.steps)


def test_no_optimizer_manual_sgd() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    data = _data(N * 4)
    with _watch() as w:
        for i in range(N):
            xb, yb = data[i * 4:(i + 1) * 4]
            loss = nn.functional.mse_loss(model(xb), yb)
            model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.data -= 0.01 * p.grad
    assert len(w.steps) == N
    assert w.tracker.source == "forward_backward"


def test_no_optimizer_autograd_grad() -> None:
    w_ = torch.randn(8, 1, requires_grad=True)
    x = torch.randn(32, 8)
    with _watch() as w:
        for _ in range(N):
            loss = (x @ w_).pow(2).mean()
            (g,) = torch.autograd.grad(loss, [w_])
            with torch.no_grad():
                w_ -= 0.1 * g
    assert len(w.steps) == N


def test_two_optimizers_per_iteration_gan() -> None:
    g_net, d_net = nn.Linear(4, 8), nn.Linear(8, 1)
    opt_g = torch.optim.Adam(g_net.parameters())
    opt_d = torch.optim.Adam(d_net.parameters())
    real = torch.randn(N * 4, 8)
    with _watch() as w:
        for i in range(N):
            z = torch.randn(4, 4)
            fake = g_net(z)
            d_loss = d_net(real[i * 4:(i + 1) * 4]).mean() - d_net(fake.detach()).mean()
            opt_d.zero_grad()
            d_loss.backward()
            opt_d.step()
            g_loss = d_net(g_net(z)).mean()
            opt_g.zero_grad()
            g_loss.backward()
            opt_g.step()
    assert len(w.steps) == N
    # The first step closed retroactively at G's step: nothing of iteration 2 leaked into it.
    fwd = [s.phase_s["forward"] for s in w.steps]
    assert all(f > 0 for f in fwd)
    assert w.tracker.counts["optimizer_step"] == 2 * N


def test_closure_optimizer_lbfgs(monkeypatch: pytest.MonkeyPatch) -> None:
    """An optimizer that calls the closure several times a step; built before the watch, it is
    found on the phase stack (its step is open around the closure's backward), not by walking
    every object of the process."""
    import gc

    model = nn.Linear(8, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=5)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    calls = 0
    walks = []
    real = gc.get_objects
    monkeypatch.setattr(gc, "get_objects", lambda *a, **k: walks.append(1) or real(*a, **k))

    def closure() -> torch.Tensor:
        nonlocal calls
        calls += 1
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    with _watch() as w:
        for _ in range(N):
            opt.step(closure)
    assert calls > N  # LBFGS evaluated the closure several times per step
    assert len(w.steps) == N
    assert walks == []
    # forward/backward inside the closure are timed as such, not as optimizer time
    assert all(s.phase_s["backward"] > 0 for s in w.steps)


def test_gradient_accumulation() -> None:
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(_data(N * 4 * 4), batch_size=4)
    with _watch() as w:
        for i, (x, y) in enumerate(loader):
            (nn.functional.mse_loss(model(x), y) / 4).backward()
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()
    assert len(w.steps) == N
    assert all(s.batches == 4 and s.samples == 16 for s in w.steps)
    assert w.tracker.counts["backward"] == 4 * N


def test_optimizer_created_inside_watch_with_accumulation() -> None:
    """The optimizer is built inside the block: backward must not close steps before it steps."""
    model = nn.Linear(8, 1)
    with _watch() as w:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(N):
            for _ in range(3):
                nn.functional.mse_loss(model(torch.randn(4, 8)), torch.randn(4, 1)).backward()
            opt.step()
            opt.zero_grad()
    assert len(w.steps) == N


def test_manual_steps() -> None:
    model = nn.Linear(8, 1)
    with _watch() as w:
        for _ in range(N):
            model(torch.randn(2, 8)).sum().backward()
            model(torch.randn(2, 8)).sum().backward()
            w.step()
    assert len(w.steps) == N
    assert w.tracker.source == "manual"


def test_wrap_times_any_iterable() -> None:
    import time

    def slow_batches():
        for _ in range(N):
            time.sleep(0.01)
            yield torch.randn(4, 8)

    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with _watch() as w:
        for xb in w.wrap(slow_batches()):
            model(xb).sum().backward()
            opt.step()
    assert len(w.steps) == N
    # steps after the first include one full 10 ms fetch
    assert all(s.phase_s["data_wait"] >= 0.009 for s in w.steps[1:])


def test_warmup_and_flop_step_are_excluded() -> None:
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with redline.watch(warmup_steps=2) as w:
        for _ in range(10):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    kinds = [s.kind for s in w.steps]
    assert kinds == ["warmup", "warmup", "excluded"] + ["measured"] * 7
    # Linear(8→1), batch 4: forward 2·4·8·1, backward 2× that (grad input not needed: 1×)
    assert w.flops.flops is not None and w.flops.flops > 0


def _installed() -> tuple[object, ...]:
    """Everything a watch patches or registers, process-wide."""
    import torch.nn.modules.module as mm
    import torch.optim.optimizer as oo
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return (DataLoader.__iter__, _BaseDataLoaderIter.__next__, torch.autograd.backward,
            torch.autograd.grad, torch.optim.Optimizer.__init__, len(mm._global_forward_hooks),
            len(mm._global_forward_pre_hooks), len(oo._global_optimizer_post_hooks),
            len(oo._global_optimizer_pre_hooks))


def test_hooks_removed_on_exit() -> None:
    before = _installed()
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with redline.watch(warmup_steps=1, count_flops=False):
        for _ in range(4):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
    assert before == _installed()
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert "forward" not in vars(model)  # the timing wrapper is gone
    assert "to" not in vars(torch.Tensor)


def test_hooks_removed_when_loop_raises() -> None:
    import torch.nn.modules.module as mm

    model = nn.Linear(8, 1)
    try:
        with redline.watch(warmup_steps=0, count_flops=False):
            model(torch.randn(2, 8))
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert not mm._global_forward_hooks and not mm._global_forward_pre_hooks
    assert torch.autograd.backward.__module__ == "torch.autograd"


def test_tracker_exclusive_phases() -> None:
    t = [0.0]
    tr = StepTracker(lambda: t[0])
    tr.enter(OPTIMIZER, 0.0)
    tr.enter(FORWARD, 1.0)
    tr.exit(FORWARD, 3.0)
    tr.enter(BACKWARD, 3.0)
    tr.exit(BACKWARD, 6.0)
    tr.exit(OPTIMIZER, 7.0)
    tr.on_optimizer_step(1, 7.0)
    tr.finish(8.0)
    (s,) = tr.steps
    assert s.phase_s["forward"] == 2.0
    assert s.phase_s["backward"] == 3.0
    assert s.phase_s["optimizer"] == 2.0  # 7 s inclusive minus 5 s nested
    assert s.step_s == 7.0 and s.other_s == 0.0


def test_tracker_wgan_style_uneven_cycle() -> None:
    """D steps 3× per G step: each D step closes one step once the cycle repeats."""
    tr = StepTracker(lambda: 0.0)
    t = 0.0
    for _ in range(4):
        for opt in (1, 1, 1, 2):
            t += 1
            tr.on_optimizer_step(opt, t)
    tr.finish(t + 1)
    assert sum(1 for _ in tr.steps) >= 4
    assert tr.steps[-1].end_s == t


def _steps_of(events: list[tuple[int, float]]) -> list[tuple[float, float, float]]:
    """(start, end, optimizer seconds) of each step a tracker makes of optimizer steps given
    as (optimizer id, time), each timed 0.5 s through ``optimizer_done``."""
    tr = StepTracker(lambda: 0.0)
    for opt, t in events:
        tr.push([OPTIMIZER, t - 0.5, 0.0])
        tr.optimizer_done(opt, t)
    tr.finish(events[-1][1] + 1)
    return [(s.start_s, s.end_s, s.phase_s["optimizer"]) for s in tr.steps]


def test_one_optimizer_steps_close_each_step_and_a_second_one_joins_the_next() -> None:
    # A single optimizer: once its cycle is learnt, each of its steps ends a step (the fast
    # path). A second optimizer stepping later (a GAN's generator added after a while) is
    # part of the step the first one ends next, as on the general path.
    alone = _steps_of([(1, float(t)) for t in range(1, 6)])
    assert alone == [(0.0, 1.0, 0.5), (1.0, 2.0, 0.5), (2.0, 3.0, 0.5), (3.0, 4.0, 0.5),
                     (4.0, 5.0, 0.5)]
    joined = _steps_of([(1, 1.0), (1, 2.0), (1, 3.0), (2, 3.5), (1, 4.0), (2, 4.5), (1, 5.0)])
    assert joined == [(0.0, 1.0, 0.5), (1.0, 2.0, 0.5), (2.0, 3.0, 0.5), (3.0, 4.0, 1.0),
                      (4.0, 5.0, 1.0)]


def test_a_phase_left_open_by_a_raise_is_dropped_and_the_stack_keeps_working() -> None:
    tr = StepTracker(lambda: 0.0)
    tr.push([FORWARD, 0.0, 0.0])
    tr.push([BACKWARD, 1.0, 0.0])  # raised before its exit
    assert tr.exit(FORWARD, 3.0) == 3.0  # the stale backward frame is dropped
    assert tr.exit(FORWARD, 4.0) == 0.0  # no frame of that phase left: nothing to close
    assert not tr.in_phase(FORWARD) and not tr.in_phase(BACKWARD)
    tr.push([OPTIMIZER, 4.0, 0.0])
    tr.optimizer_done(7, 5.0)
    tr.finish(6.0)
    (s,) = tr.steps
    assert s.phase_s["forward"] == 3.0 and s.phase_s["optimizer"] == 1.0
    assert s.phase_s["backward"] == 0.0


def test_past_its_cap_the_tracker_keeps_a_uniform_sample_and_exact_counts() -> None:
    tr = StepTracker(lambda: 0.0, keep=8)
    for t in range(1, 51):
        tr.push([OPTIMIZER, t - 0.5, 0.0])
        tr.optimizer_done(1, float(t))
    tr.finish(51.0)
    assert tr.closed == 50 and tr.stride == 8
    # every 8th step, each with its own times: a uniform sample of the run
    assert [s.index for s in tr.steps] == [0, 8, 16, 24, 32, 40, 48]
    assert all(s.end_s == s.index + 1 and s.phase_s["optimizer"] == 0.5 for s in tr.steps)
    assert [s.index for s in tr.recent] == list(range(50))  # the last steps, every one
    with pytest.raises(ValueError, match="keep must be >= 2"):
        StepTracker(lambda: 0.0, keep=1)


def test_checkpoint_and_ema_copy_during_watch_stay_plain() -> None:
    """torch.save(model) and copy.deepcopy(model) inside the block: the saved model and the
    copy carry no redline code and compute with their own weights."""
    import copy
    import io

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    with _watch() as w:
        for _ in range(4):
            model(x).sum().backward()
            opt.step()
        assert "forward" in vars(model)  # timed now
        buf = io.BytesIO()
        torch.save(model, buf)
        ema = copy.deepcopy(model)
    assert len(w.steps) == 4
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert "redline" not in repr(vars(loaded).get("forward"))
    assert torch.allclose(loaded(x), model(x))
    with torch.no_grad():
        for p in ema.parameters():
            p.add_(1.0)
    assert not torch.allclose(ema(x), model(x))  # the copy uses its own weights
    assert "redline" not in repr(vars(ema).get("forward"))


def _train(w: redline.Watch, steps: int) -> None:
    torch.manual_seed(0)
    m = nn.Linear(8, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    it = iter(DataLoader(_data(), batch_size=4))
    with w:
        for _ in range(steps):
            x, y = next(it)
            loss = nn.functional.mse_loss(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


def test_no_warmup_means_no_warmup_step() -> None:
    """warmup_steps=0: every step counts from entry; the FLOP count still takes one excluded
    step, at the first exact step boundary."""
    w = redline.watch(warmup_steps=0)
    _train(w, 8)
    t = w.report(show=False).measurements
    assert (t.timing.steps_total, t.timing.steps_warmup, t.timing.steps_excluded,
            t.timing.steps_measured) == (8, 0, 1, 7)
    assert t.mfu.flops_per_step == 2 * (2 * 4 * 8 * 1)  # forward + weight gradient
    w = redline.watch(warmup_steps=0, count_flops=False)
    _train(w, 8)
    assert w.report(show=False).measurements.timing.steps_measured == 8


def test_counts_stay_exact_when_marked_steps_begin_after_the_watch_settled() -> None:
    """Once measuring and settled, the watch counts closes from the tracker's count without
    being called at each; the loop's first own ``step()`` folds the steps before it into one
    and starts the warm-up again, and the counts go on from there."""
    torch.manual_seed(0)
    m = nn.Linear(8, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with redline.watch(warmup_steps=2, count_flops=False) as w:
        for _ in range(12):  # steps cut at each optimizer step
            m(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        assert w.step_counts == (12, 2, 0, 10) and w.measured_count == 10
        # a reader on another thread (the metrics endpoint) may read the counts between the
        # tracker's reset and the watch's: never a negative count
        seen: list[int] = []
        reset = w.tracker._on_reset
        assert reset is not None

        def reading_reset() -> None:
            seen.append(w.measured_count)
            reset()

        w.tracker._on_reset = reading_reset
        for _ in range(6):  # from here the loop marks its steps itself
            m(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            w.step()
        assert w.step_counts == (6, 2, 0, 4)
    assert seen and min(seen) >= 0, seen
    assert w.tracker.source == "manual"
    assert [s.kind for s in w.steps] == ["warmup"] * 2 + ["measured"] * 4
    assert w.report(show=False).measurements.timing.steps_measured == 4


def test_step_limit_holds_without_warmup() -> None:
    """The limit is reached at the first measured step, though the FLOP count starts there."""
    stops: list[int] = []
    w = redline.Watch(redline.WatchConfig(warmup_steps=0, max_steps=1),
                      on_limit=lambda: stops.append(w.flops.flops is None))
    _train(w, 6)
    # at the first measured step, before the FLOP-counted one; then at every later step end
    # and fetch (this on_limit does not raise, so the loop runs on)
    assert stops[0] is True and len(stops) >= 5


def test_watches_closed_out_of_order_leave_no_hook() -> None:
    """A script with its own watch, run under another (redline doctor): the outer one closes
    first; once both are closed nothing of either is installed, and the inner one measured."""
    before = _installed()
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    it = iter(DataLoader(_data(), batch_size=4))
    outer = redline.watch(warmup_steps=0, count_flops=False).__enter__()
    inner = redline.watch(warmup_steps=0, count_flops=False).__enter__()
    for i in range(6):
        if i == 3:
            outer.__exit__(None, None, None)
            assert _installed() != before  # the inner watch still measures
        x, y = next(it)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    inner.__exit__(None, None, None)
    assert _installed() == before
    assert "forward" not in vars(model)
    assert inner.report(show=False).measurements.timing.steps_measured == 6
    assert outer.report(show=False).measurements.timing.steps_measured == 3


def test_a_block_that_raised_is_not_reported_completed() -> None:
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def run(exc: BaseException | None) -> redline.Report:
        w = redline.watch(warmup_steps=0, count_flops=False)
        try:
            with w:
                for _ in range(3):
                    model(torch.randn(4, 8)).sum().backward()
                    opt.step()
                if exc is not None:
                    raise exc
        except BaseException as e:
            assert e is exc
        return w.report(show=False)

    assert run(None).status == "completed"
    failed = run(ValueError("bad batch"))
    assert failed.status == "script_error"
    assert failed.status_detail == "the watched block raised ValueError: bad batch"
    assert failed.measurements.timing.steps_measured == 3
    assert run(KeyboardInterrupt()).status == "interrupted"


def test_a_loop_on_another_thread_is_named_not_hidden() -> None:
    import threading

    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loop() -> None:
        for _ in range(5):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()

    with redline.watch(warmup_steps=0, count_flops=False) as w:
        t = threading.Thread(target=loop, name="trainer")
        t.start()
        t.join()
    rep = w.report(show=False)
    assert rep.status == "no_steps"
    note = next(n for n in rep.measurements.notes if "another thread" in n)
    assert note.startswith("5 training step(s) ran on another thread (trainer)")
    assert "MainThread" in note


def test_a_root_with_its_own_forward_hooks_is_timed_around_them() -> None:
    """FSDP's root waits for its parameters in a pre-forward hook: that wait is forward time,
    not time outside the phases; the module's hooks and forward are left as they were."""
    import time

    model = nn.Linear(8, 1)
    theirs = model.register_forward_pre_hook(lambda m, a: time.sleep(0.02))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(_data(N * 4), batch_size=4)
    with _watch() as w:
        for x, y in loader:
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    # steps after the first (which finds the roots through global hooks) time the hook too
    assert all(s.phase_s["forward"] >= 0.02 for s in w.steps[1:])
    assert len(model._forward_pre_hooks) == 1 and not model._forward_hooks
    assert "forward" not in vars(model)
    theirs.remove()
