"""Evaluation inside the training loop is its own phase: forwards with gradients disabled or in
eval mode with no backward after them, and the evaluation_in_loop finding over it."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import redline
from redline.diagnose import diagnose
from redline.measure.step_record import COMM, DATA_WAIT, EVALUATION, FORWARD
from redline.measure.timeline import StepTracker

STEPS = 40
PERIOD = 10
EVAL_BATCHES = 6
EVAL_SLEEP_S = 0.03
"""Each validation forward also sleeps this long: a lower bound of the evaluation time that a
loaded machine cannot shrink, and that would show in 'forward' were it counted there."""


class _Net(nn.Module):
    def __init__(self, slow_eval: bool = False) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
        self.slow_eval = slow_eval

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.slow_eval and not (self.training and torch.is_grad_enabled()):
            time.sleep(EVAL_SLEEP_S)
        out: torch.Tensor = self.body(x)
        return out


def _mlp(slow_eval: bool = False) -> nn.Module:
    return _Net(slow_eval)


def _run(evaluate: str | None, train_mode: bool = True, slow_first: int = 0,
         slow_s: float = 0.03) -> tuple[redline.Watch, list[tuple[float, float]]]:
    """A loop of STEPS steps that validates every PERIOD steps over EVAL_BATCHES batches:
    ``evaluate`` 'no_grad' (model.eval() + torch.no_grad()), 'eval_only' (model.eval(),
    gradients on), or None (never). ``train_mode=False`` trains with the model left in eval
    mode. The first ``slow_first`` steps also sleep ``slow_s`` (a start-up). Returns the watch and
    each validation block's (start, end) on the host clock."""
    torch.manual_seed(0)
    model = _mlp(slow_eval=train_mode)
    if not train_mode:
        model.eval()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randn(64, 1)
    vx = torch.randn(64, 256)
    blocks: list[tuple[float, float]] = []
    with redline.watch(warmup_steps=3, count_flops=False) as w:
        for i in range(STEPS):
            if i < slow_first:
                time.sleep(slow_s)
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if evaluate is not None and i % PERIOD == PERIOD - 1:
                t0 = time.perf_counter()
                model.eval()
                if evaluate == "no_grad":
                    with torch.no_grad():
                        for _ in range(EVAL_BATCHES):
                            model(vx)
                else:
                    for _ in range(EVAL_BATCHES):
                        model(vx).sum().item()
                if train_mode:
                    model.train()
                blocks.append((t0, time.perf_counter()))
    return w, blocks


def _in_measured(w: redline.Watch, blocks: list[tuple[float, float]]) -> float:
    """Seconds of the validation blocks that fall inside measured steps."""
    return sum(max(0.0, min(b, s.end_s) - max(a, s.start_s))
               for s in w.measured_steps for a, b in blocks)


def test_validation_every_10_steps_is_evaluation_not_training_forward() -> None:
    for how in ("no_grad", "eval_only"):
        w, blocks = _run(how)
        steps = w.measured_steps
        ev_s = sum(s.phases[EVALUATION] for s in steps)
        timed = _in_measured(w, blocks)
        assert timed > 0
        # the validation block is its forwards (plus model.eval()/train() and .item())
        assert 0.7 * timed <= ev_s <= timed * 1.001, (how, ev_s, timed)
        at = [s for s in steps if s.phases[EVALUATION] > 0]
        assert len(at) == 3
        # the sleeps alone are a lower bound of the evaluation; counted as training forward,
        # they would make the forward of those steps at least as long
        assert all(s.phases[EVALUATION] >= EVAL_BATCHES * EVAL_SLEEP_S for s in at)
        fwd = sum(s.phases[FORWARD] for s in at)
        assert fwd < 0.5 * sum(s.phases[EVALUATION] for s in at), (how, fwd)
        m = w.report(show=False).measurements
        assert m.evaluation is not None and m.evaluation.period_steps == PERIOD
        assert m.evaluation.steps_with_evaluation == 3
        assert m.counts["evaluation"] == EVAL_BATCHES * STEPS // PERIOD
        total = sum(s.step_s for s in steps)
        found = [f for f in diagnose(m) if f.id == "evaluation_in_loop"]
        assert len(found) == 1, (how, m.fraction("evaluation"), timed / total)
        f = found[0]
        share = f.evidence["evaluation_fraction"]
        assert isinstance(share, float)
        assert abs(share - timed / total) <= 0.3 * timed / total, (how, share, timed / total)
        assert f.evidence["period_steps"] == PERIOD
        assert f"every {PERIOD} steps" in f.title
        assert f.ceiling_speedup is not None
        assert abs(f.ceiling_speedup - 1 / (1 - m.fraction("evaluation"))) < 1e-9
        assert "less often" in f.fix


def test_evaluations_in_start_up_steps_left_out_still_count() -> None:
    """A start-up slow enough to be left out of the step statistics still holds the loop's
    first evaluation: the period is the loop's, over every measured step."""
    # 12 slow steps, the first evaluation (after step 9) among them, 3 of them warm-up: the
    # steady run begins well before the half of the 40 steps (the steps after a sleep stay
    # above the steady level of these sub-millisecond steps for a few more); 100 ms sleeps: a
    # start-up far above the steady steps even where a loaded host stretches them to tens of
    # ms, and weighing more than twice the run delay it adds to their own work (where the
    # delay is over half of it, start-up steps are kept)
    w, _ = _run("no_grad", slow_first=12, slow_s=0.1)
    m = w.report(show=False).measurements
    startup = m.drift.startup if m.drift is not None else None
    assert startup is not None and startup.left_out, m.drift
    assert startup.steps_after_warmup >= 9
    # the evaluation is not start-up: what the start-up's measured steps cost above the steady
    # level is within their time less their evaluation (with it, ~180 ms more)
    kept = [s for s in w.steps if s.kind != "excluded"]
    own_s = sum(s.step_s - s.phases[EVALUATION] for s in kept[3:startup.steps])
    assert own_s >= 9 * 0.1 and startup.extra_after_warmup_s <= own_s + 1e-9, startup
    assert m.evaluation is not None and m.evaluation.steps_with_evaluation == 3
    assert m.evaluation.period_steps == PERIOD
    assert "evaluation_in_loop" in {f.id for f in diagnose(m)}


def test_a_loop_that_never_evaluates_has_no_evaluation() -> None:
    w, _ = _run(None)
    assert all(s.phases[EVALUATION] == 0.0 for s in w.steps)
    m = w.report(show=False).measurements
    assert m.evaluation is None and m.fraction("evaluation") == 0.0
    assert "evaluation_in_loop" not in {f.id for f in diagnose(m)}


def test_a_model_left_in_eval_mode_that_trains_is_training_forward() -> None:
    """A forward followed by a backward in the same step is training, whatever the module's
    ``training`` flag: a model left in eval mode (gradients on) trains in 'forward'."""
    w, _ = _run(None, train_mode=False)
    assert all(s.phases[EVALUATION] == 0.0 for s in w.steps)
    assert all(s.phases[FORWARD] > 0.0 for s in w.steps)
    m = w.report(show=False).measurements
    assert "evaluation_in_loop" not in {f.id for f in diagnose(m)}


def test_a_frozen_model_under_no_grad_is_part_of_training() -> None:
    """A teacher / frozen encoder run under no_grad in every step is training's own work."""
    torch.manual_seed(0)
    teacher, student = _mlp().requires_grad_(False).eval(), _mlp()
    opt = torch.optim.SGD(student.parameters(), lr=1e-3)
    x = torch.randn(32, 256)
    with redline.watch(warmup_steps=2, count_flops=False) as w:
        for _ in range(12):
            with torch.no_grad():
                target = teacher(x)
            loss = nn.functional.mse_loss(student(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert all(s.phases[EVALUATION] == 0.0 for s in w.steps)
    assert w.tracker.counts["evaluation"] == 0


class _SlowRows(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``n`` rows of 256 features; each read sleeps ``sleep_s`` (a validation set read from
    slow storage: its fetches are long, and they are evaluation's time)."""

    def __init__(self, n: int, sleep_s: float) -> None:
        self.x, self.y, self.sleep_s = torch.randn(n, 256), torch.randn(n, 1), sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


TRAIN_BATCH, VAL_BATCH, VAL_ROWS, VAL_ROW_SLEEP_S = 16, 64, 256, 0.0005


def _run_with_loaders(teacher: bool = False) -> tuple[redline.Watch, float]:
    """A DataLoader loop of STEPS steps (batch TRAIN_BATCH) that validates every PERIOD steps
    over a validation DataLoader (batch VAL_BATCH, slow rows), after a sanity-check pass over
    two validation batches before training (as Lightning runs). ``teacher``: every step also
    runs a teacher under ``no_grad`` on the batch before the student's forward (its weights
    still require gradients). Returns the watch and the seconds spent fetching validation
    batches inside the loop."""
    torch.manual_seed(0)
    model, other = _mlp(), _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    train = torch.utils.data.DataLoader(_SlowRows(STEPS * TRAIN_BATCH, 0.0),
                                        batch_size=TRAIN_BATCH)
    val = torch.utils.data.DataLoader(_SlowRows(VAL_ROWS, VAL_ROW_SLEEP_S), batch_size=VAL_BATCH)
    val_fetch_s = [0.0]

    def validate(batches: int | None = None, timed: bool = True) -> None:
        model.eval()
        with torch.no_grad():
            it = iter(val)
            for _ in range(batches or len(val)):
                t0 = time.perf_counter()
                x, _ = next(it)
                if timed:
                    val_fetch_s[0] += time.perf_counter() - t0
                model(x)
        model.train()

    with redline.watch(warmup_steps=3, count_flops=False) as w:
        validate(batches=2, timed=False)
        for i, (x, y) in enumerate(train):
            if teacher:
                with torch.no_grad():
                    target = other(x)
                y = y + 0 * target
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i % PERIOD == PERIOD - 1 and i < STEPS - 1:
                validate()
    return w, val_fetch_s[0]


def test_a_validation_loader_s_batches_and_waits_are_evaluation_not_training() -> None:
    """The validation loader's batches are not the step's samples (throughput counts the
    training batches only), its fetch waits are evaluation's time (no data starvation from
    a slow validation set), and the loader the report describes is the training one although
    the validation loader was iterated first."""
    w, val_fetch_s = _run_with_loaders()
    steps = w.measured_steps
    assert [s.samples for s in steps] == [TRAIN_BATCH] * len(steps)
    assert all(s.batches == 1 for s in steps)
    m = w.report(show=False).measurements
    assert m.timing.samples_per_step == TRAIN_BATCH
    assert m.config.batch_size == TRAIN_BATCH
    # seen first: the sanity check's, then three validations in the loop
    assert m.loaders[0].batch_size == VAL_BATCH and m.loaders[0].iterators == 4
    # the validation fetches sleep ≥ VAL_ROWS × VAL_ROW_SLEEP_S each time: in evaluation
    evaluating = [s for s in steps if s.phases[EVALUATION] > 0]
    assert len(evaluating) == 3
    wait = sum(s.phases[DATA_WAIT] for s in steps)
    assert sum(s.phases[EVALUATION] for s in evaluating) >= 0.9 * val_fetch_s
    assert wait < 0.5 * val_fetch_s, (wait, val_fetch_s)
    assert "data_starvation" not in {f.id for f in diagnose(m)}


def test_a_teacher_under_no_grad_leaves_the_batch_training_s() -> None:
    """A forward under ``no_grad`` before the training forward of the same batch (a teacher
    whose weights still require gradients) does not make the batch an evaluation one."""
    w, _ = _run_with_loaders(teacher=True)
    steps = w.measured_steps
    assert [s.samples for s in steps] == [TRAIN_BATCH] * len(steps)
    assert w.report(show=False).measurements.config.batch_size == TRAIN_BATCH


def _eval_forward(tr: StepTracker, start: float, end: float) -> None:
    """An outermost no-grad evaluation forward from ``start`` to ``end``, as the hooks time it."""
    tr.evaluation_forward_began()
    tr.bridge_evaluation(start)
    tr.push([EVALUATION, start, 0.0])
    tr.exit(EVALUATION, end)
    tr.evaluation_forward_ended(end)


def test_the_time_between_evaluation_forwards_of_a_step_is_evaluation() -> None:
    """Metrics and ``.item()`` calls between a validation loop's forwards are evaluation; what
    a phase times there stays that phase's; training work, another step or a frame around
    the forwards ends the bridge; what follows the last forward stays outside the phases;
    and where training work begins with no batch fetched since (a teacher's forwards on the
    training batch), the bridged time is taken back."""
    tr = StepTracker(lambda: 0.0)
    tr.push([FORWARD, 0.0, 0.0])  # the step's training forward
    tr.fetch_used()
    tr.exit(FORWARD, 1.0)
    _eval_forward(tr, 2.0, 3.0)  # 1 → 2: not bridged (no evaluation forward before it)
    _eval_forward(tr, 5.0, 6.0)  # 3 → 5 bridged
    tr.push([DATA_WAIT, 6.5, 0.0])  # a validation batch's fetch: its own phase, moved below
    tr.fetched(7.0, 8)
    _eval_forward(tr, 8.0, 9.0)  # 6 → 8 bridged less the 0.5 s fetch
    tr.push([DATA_WAIT, 9.2, 0.0])  # the next training batch
    tr.fetched(9.5, 8)
    tr.push([FORWARD, 10.0, 0.0])  # training work ends the run: 9 → 10 stays outside
    tr.fetch_used()
    tr.exit(FORWARD, 11.0)
    _eval_forward(tr, 12.0, 13.0)
    tr.manual_step(14.0)  # 13 → 14 (after the last forward) stays outside
    _eval_forward(tr, 15.0, 16.0)  # another step: 14 → 15 is not bridged to the last step
    tr.manual_step(17.0)
    first, second = tr.steps
    assert first.phases[EVALUATION] == 4 * 1.0 + 2.0 + 1.5 + 0.5  # the validation fetch's too
    assert abs(first.phases[DATA_WAIT] - 0.3) < 1e-9
    assert abs(first.other_s - (14.0 - 2.0 - first.phases[EVALUATION] - 0.3)) < 1e-9
    assert second.phases[EVALUATION] == 1.0
    assert list(tr.evaluation_spans) == [(3.0, 8.0)]
    # a teacher on the training batch: bridged, then taken back when the student trains
    tr.push([DATA_WAIT, 17.0, 0.0])
    tr.fetched(17.5, 8)
    _eval_forward(tr, 18.0, 18.5)
    _eval_forward(tr, 19.5, 20.0)  # 18.5 → 19.5 bridged for now
    assert list(tr.evaluation_spans) == [(3.0, 8.0), (18.5, 19.5)]
    tr.push([FORWARD, 20.0, 0.0])
    tr.fetch_used()
    tr.exit(FORWARD, 20.5)
    tr.manual_step(21.0)
    assert tr.steps[-1].phases[EVALUATION] == 1.0 and tr.steps[-1].other_s == 2.0
    assert list(tr.evaluation_spans) == [(3.0, 8.0)]
    # a forward inside another frame (here a training phase left open) is not bridged
    tr.push([COMM, 22.0, 0.0])
    _eval_forward(tr, 22.5, 23.0)
    _eval_forward(tr, 23.5, 24.0)
    assert list(tr.evaluation_spans) == [(3.0, 8.0)]


def test_metrics_between_validation_forwards_are_evaluation_not_loop_code() -> None:
    """A validation pass whose work is mostly between its forwards (metrics, ``.item()``):
    that work is evaluation in the step's phases and in the sampled lines, and
    evaluation_in_loop names it rather than periodic_stall or host_work_in_loop."""
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    train = DataLoader(TensorDataset(torch.randn(64 * STEPS, 256), torch.randn(64 * STEPS, 1)),
                       batch_size=64)
    with redline.watch(warmup_steps=3, count_flops=False) as w:
        for i, (x, y) in enumerate(train):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i % PERIOD == PERIOD - 1:
                model.eval()
                with torch.no_grad():
                    for _ in range(EVAL_BATCHES):
                        model(x)
                        time.sleep(EVAL_SLEEP_S)  # this batch's metrics
                model.train()
    m = w.report(show=False).measurements
    at = [s for s in w.measured_steps if s.phases[EVALUATION] > 0]
    assert len(at) == 3
    # the sleeps between the forwards (5 of the 6) are evaluation; the last, after the last
    # forward, is the loop's own
    bridged = (EVAL_BATCHES - 1) * EVAL_SLEEP_S
    assert all(s.phases[EVALUATION] >= bridged for s in at), [s.phases for s in at]
    assert all(s.other_s >= EVAL_SLEEP_S for s in at)
    ids = [f.id for f in diagnose(m)]
    assert ids[0] == "evaluation_in_loop", ids
    assert "periodic_stall" not in ids
    # the sampled lines outside the phases hold the last sleep alone: a sixth of the
    # validation pass, not the whole of it
    assert m.loop is not None
    assert m.loop.other_fraction < 0.5 * m.fraction("evaluation")


def test_a_teacher_run_twice_on_the_training_batch_is_not_bridged() -> None:
    """A teacher (not frozen, in eval mode) run under no_grad on two views of the training
    batch, the second view's augmentation between them, then the student trains: no batch
    was fetched between the teacher's forwards and the training, so the augmentation stays
    the loop's own work, as a validation pass's metrics would not."""
    torch.manual_seed(0)
    student, teacher = _mlp(), _mlp().eval()
    opt = torch.optim.SGD(student.parameters(), lr=1e-3)
    train = DataLoader(TensorDataset(torch.randn(16 * 30, 256), torch.randn(16 * 30, 1)),
                       batch_size=16)
    with redline.watch(warmup_steps=3, count_flops=False) as w:
        for x, _ in train:
            with torch.no_grad():
                first = teacher(x)
                time.sleep(EVAL_SLEEP_S)  # the second view's augmentation
                second = teacher(x + 0.1)
            loss = nn.functional.mse_loss(student(x), (first + second) / 2)
            opt.zero_grad()
            loss.backward()
            opt.step()
    steps = w.measured_steps
    # bridged, a step's evaluation would hold the whole sleep; not bridged, the teacher's two
    # forwards (under a sleep's length even where a loaded host stretches them)
    assert all(s.phases[EVALUATION] < EVAL_SLEEP_S for s in steps), [s.phases for s in steps]
    assert all(s.other_s >= EVAL_SLEEP_S for s in steps)
    # the augmentation is named as the loop's host work (the teacher's own forwards, a few
    # tenths of a ms under no_grad and not frozen, are evaluation by definition: a loaded
    # host can stretch them past evaluation_in_loop's 5 %, ranked below it)
    ids = [f.id for f in diagnose(w.report(show=False).measurements)]
    assert ids and ids[0] == "host_work_in_loop", ids


def test_no_bridge_crosses_an_optimizer_step() -> None:
    """Two optimizers stepping in turn, then an iteration where the second skips: the first's
    step is where the step may end (closed there later, retroactively), so two no-grad
    forwards on either side of it are not bridged and no step holds more than its time."""
    tr = StepTracker(lambda: 0.0)

    def train(start: float, end: float) -> None:
        tr.push([FORWARD, start, 0.0])
        tr.fetch_used()
        tr.exit(FORWARD, end)

    t = 0.0
    for _ in range(3):  # the cycle {1, 2} is learnt
        train(t, t + 1)
        tr.on_optimizer_step(1, t + 2)
        tr.on_optimizer_step(2, t + 3)
        t += 4
    train(t, t + 1)
    _eval_forward(tr, t + 2, t + 3)
    tr.on_optimizer_step(1, t + 5.9)  # optimizer 2 skips this iteration
    _eval_forward(tr, t + 6, t + 6.1)
    tr.push([DATA_WAIT, t + 6.1, 0.0])  # the next training batch
    tr.fetched(t + 6.15, 8)
    train(t + 6.2, t + 6.5)
    tr.on_optimizer_step(1, t + 6.6)  # the step closes at t + 5.9, retroactively
    tr.on_optimizer_step(2, t + 6.7)
    assert not tr.evaluation_spans
    assert all(sum(s.phases) <= s.step_s + 1e-9 for s in tr.steps), tr.steps


class _SlowBatches(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Samples that take ``delay_s`` each to fetch (a slow validation set)."""

    def __init__(self, n: int, delay_s: float) -> None:
        self.n, self.delay_s = n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay_s)
        return torch.randn(256), torch.randn(1)


def test_a_linear_probe_s_validation_keeps_its_batches_and_its_bridge() -> None:
    """A frozen backbone under a trained head: in validation the frozen forward runs first on
    each validation batch; the batch's wait stays evaluation's and the metric between the
    head's forwards is bridged, as in any validation pass."""
    torch.manual_seed(0)
    backbone = _mlp().body[0].requires_grad_(False).eval()
    head = nn.Linear(256, 1)
    opt = torch.optim.SGD(head.parameters(), lr=1e-3)
    train = DataLoader(TensorDataset(torch.randn(16 * STEPS, 256), torch.randn(16 * STEPS, 1)),
                       batch_size=16)
    val = DataLoader(_SlowBatches(4 * 16, 0.0005), batch_size=16)  # 8 ms a batch
    with redline.watch(warmup_steps=3, count_flops=False) as w:
        for i, (x, y) in enumerate(train):
            loss = nn.functional.mse_loss(head(backbone(x)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i % PERIOD == PERIOD - 1:
                head.eval()
                with torch.no_grad():
                    for vx, vy in val:
                        p = head(backbone(vx))
                        time.sleep(0.003)  # the batch's metric
                        float((p - vy).abs().mean())
                head.train()
    at = [s for s in w.measured_steps if s.phases[EVALUATION] > 0]
    assert len(at) == 3
    # four validation batches of 8 ms and three metrics between the head's forwards
    assert all(s.phases[EVALUATION] >= 4 * 0.008 + 3 * 0.003 for s in at), [s.phases for s in at]
    assert all(s.phases[DATA_WAIT] < 0.008 for s in at)
    ids = [f.id for f in diagnose(w.report(show=False).measurements)]
    assert ids[0] == "evaluation_in_loop", ids


def test_a_validation_pass_before_the_training_forward_keeps_its_bridge() -> None:
    """Validation run after the training batch is fetched and before its forward (the top of
    the iteration): its batches are fetched between its forwards, so the training forward
    that follows does not take the bridged time back, as it does a teacher's."""
    tr = StepTracker(lambda: 0.0)
    tr.push([DATA_WAIT, 0.0, 0.0])  # the training batch
    tr.fetched(0.5, 8)
    for k in range(3):  # three validation batches, a 1 s metric after each forward
        start = 1.0 + 3.0 * k
        tr.push([DATA_WAIT, start, 0.0])
        tr.fetched(start + 0.5, 8)
        _eval_forward(tr, start + 1.0, start + 2.0)
    tr.push([FORWARD, 10.0, 0.0])
    tr.fetch_used()
    tr.exit(FORWARD, 11.0)
    tr.manual_step(12.0)
    (step,) = tr.steps
    # three forwards, two bridged stretches of 1.0 + 0.5 (the fetch between is its own), the
    # three validation fetches: the last one counted as the training forward's (a batch
    # fetched last before a training forward is training's)
    assert list(tr.evaluation_spans) == [(3.0, 8.0)]
    assert abs(step.phases[EVALUATION] - (3 * 1.0 + 2 * 1.5 + 2 * 0.5)) < 1e-9, step.phases
