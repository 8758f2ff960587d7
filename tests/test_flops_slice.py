"""FLOP counting on a step that makes many small calls: the count covers one forward+backward
and is scaled to the step's backward passes, the counted step is left out of the timing
statistics, and its cost is that of one pass, not of the whole step (issue 29)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import redline
from redline.measure.stats import percentile

PASSES = 8
"""Backward passes per optimizer step (gradient accumulation), as an LBFGS step's closures."""


class Recurrent(nn.Module):
    """An ``LSTMCell`` stepped over 60 time steps: ~200 small operator calls per forward."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(1, 32)
        self.out = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = c = torch.zeros(x.size(0), 32)
        outs = []
        for t in x.split(1, dim=1):
            h, c = self.cell(t, (h, c))
            outs.append(self.out(h))
        return torch.cat(outs, 1)


@pytest.fixture
def one_thread() -> Iterator[None]:
    # many tiny operators on an oversubscribed 2-core runner: intra-op threads would spin
    # waiting for each other and make step times noise; one thread keeps them comparable
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _setup() -> tuple[Recurrent, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    m = Recurrent()
    w = torch.arange(61.0).expand(4, -1) + torch.arange(4.0)[:, None] * 7
    d = torch.sin(w / 5.0)
    return m, torch.optim.SGD(m.parameters(), lr=0.01), d[:, :-1], d[:, 1:]


def _step(m: Recurrent, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    for _ in range(PASSES):
        ((m(x) - y) ** 2).mean().backward()
    opt.step()
    opt.zero_grad()


def test_a_counted_step_of_many_small_calls_costs_one_pass_and_is_left_out(
        one_thread: None) -> None:
    m, opt, x, y = _setup()
    # the FLOPs of one forward+backward and the cost of counting a whole step, measured here
    with FlopCounterMode(display=False) as one:  # (also pays the counter's one-off set-up)
        ((m(x) - y) ** 2).mean().backward()
    opt.zero_grad()
    t = time.perf_counter()
    _step(m, opt, x, y)
    bare_s = time.perf_counter() - t
    t = time.perf_counter()
    with FlopCounterMode(display=False):
        _step(m, opt, x, y)
    whole_overhead_s = time.perf_counter() - t - bare_s
    assert whole_overhead_s > 0.5 * bare_s  # counting every call is costly on this loop

    with redline.watch(warmup_steps=2, sample_interval_s=0.05) as w:
        for _ in range(9):
            _step(m, opt, x, y)
    report = w.report(show=False)
    timing = report.measurements.timing

    assert w.flops.passes == PASSES
    assert w.flops.flops == PASSES * one.get_total_flops() > 0
    assert report.measurements.mfu.flops_per_step == w.flops.flops
    steps = w.steps
    excluded = [s for s in steps if s.kind == "excluded"]
    measured = [s for s in steps if s.kind == "measured"]
    assert len(excluded) == 1 and timing.steps_excluded == 1
    assert timing.steps_measured == len(measured) >= 5
    # the statistic is over the measured steps alone
    times = [s.step_s for s in measured]
    assert timing.step_time_p50_s == pytest.approx(percentile(times, 50))
    assert timing.step_time_mean_s == pytest.approx(sum(times) / len(times))
    # the counted step paid for one pass of eight, not for the whole step
    counted_overhead_s = excluded[0].step_s - percentile(times, 50)
    assert counted_overhead_s < 0.5 * whole_overhead_s, (counted_overhead_s, whole_overhead_s)


def test_without_a_measured_step_the_counted_step_is_not_the_step_time(
        one_thread: None) -> None:
    m, opt, x, y = _setup()
    with redline.watch(warmup_steps=2, sample_interval_s=0.05) as w:
        for _ in range(3):  # two warm-up steps, then the counted one: none measured
            _step(m, opt, x, y)
    report = w.report(show=False)
    timing = report.measurements.timing
    assert timing.steps_measured == 0 and timing.steps_excluded == 1
    warm = [s.step_s for s in w.steps if s.kind == "warmup"]
    assert len(warm) == 2
    assert timing.step_time_p50_s == pytest.approx(percentile(warm, 50))
    assert any("warm-up" in n for n in report.measurements.notes)


class _TinyVit(nn.Module):
    """Convolution, attention (SDPA), layer norm, GELU and a batched matmul: the operators
    whose FLOPs torch's formulas count, each through a different aten call."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 16, 4, stride=4)
        self.block = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x).flatten(2).transpose(1, 2)
        t = self.block(t)
        return self.head(torch.bmm(t.transpose(1, 2), t).mean(1))


class _Baddbmm(nn.Module):
    """``baddbmm``, ``addmm`` (a bias) and ``mm`` (none), each called directly."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 4, 5))
        self.bias = nn.Parameter(torch.randn(5))
        self.v = nn.Parameter(torch.randn(5, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.baddbmm(torch.zeros(5), x, self.w, beta=0.5, alpha=2.0).reshape(6, 5)
        return torch.mm(torch.addmm(self.bias, t, torch.eye(5)), self.v)


@pytest.mark.parametrize("build", [
    lambda: (Recurrent(), torch.randn(4, 12)),
    lambda: (_TinyVit(), torch.randn(2, 3, 16, 16)),
    lambda: (nn.Sequential(nn.Conv1d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(24, 3)),
             torch.randn(3, 2, 8)),
    lambda: (_Baddbmm(), torch.randn(2, 3, 4)),
], ids=["lstm-cell", "conv-attention", "conv1d-linear", "baddbmm-addmm-mm"])
def test_the_counting_mode_counts_what_flop_counter_mode_counts(build: object) -> None:
    from redline.measure.flops import FlopWindow

    torch.manual_seed(0)
    model, x = build()  # type: ignore[operator]
    with FlopCounterMode(display=False) as ref:
        model(x).square().mean().backward()
    counts = ref.get_flop_counts()["Global"]
    conv = sum(n for op, n in counts.items() if "convolution" in str(op))
    win = FlopWindow()
    win.start()
    model(x).square().mean().backward()
    win.backward_ended()
    win.stop(passes=1)
    assert win.error is None
    assert win.flops == ref.get_total_flops() > 0
    assert win.conv_flops == conv


def test_the_matrix_product_shortcuts_agree_with_torchs_formulas() -> None:
    """Each shortcut against ``flop_registry``'s formula on operands of distinct m, n, k (an
    operand read from the wrong argument gives another count), with a broadcast ``self`` and
    non-default beta and alpha."""
    from torch.utils.flop_counter import flop_registry

    from redline.measure.flops import _GEMMS

    aten = torch.ops.aten
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    ba, bb = torch.randn(2, 3, 5), torch.randn(2, 5, 7)
    calls = {
        aten.mm: (a, b),
        aten.addmm: (torch.randn(7), a, b),
        aten.bmm: (ba, bb),
        aten.baddbmm: (torch.randn(7), ba, bb),
    }
    for packet, args in calls.items():
        kwargs = {"beta": 0.5, "alpha": 2.0} if packet in (aten.addmm, aten.baddbmm) else {}
        out = packet.default(*args, **kwargs)
        want = flop_registry[packet](*args, **kwargs, out_val=out)
        assert _GEMMS[packet](args) == want > 0, packet
    assert set(_GEMMS) == set(calls)


def test_every_convolution_of_torchs_formulas_counts_as_convolution() -> None:
    """``_slow_conv2d_forward`` (the CPU's own, reached when a caller calls it directly) is a
    convolution in torch's formulas although its name lacks the word: MFU needs its FLOPs
    among the convolutions' (TF32 by default on CUDA). Torch's formula for it takes other
    arguments than it has, so redline counts it by its shapes."""
    from torch.utils.flop_counter import flop_registry

    from redline.measure.flops import FlopWindow

    convs = {p.__name__ for p in flop_registry if "conv" in p.__name__}
    assert "_slow_conv2d_forward" in convs
    x, w = torch.randn(1, 2, 6, 6), torch.randn(4, 2, 3, 3)
    win = FlopWindow()
    win.start()
    torch.ops.aten._slow_conv2d_forward(x, w, [3, 3], None, [1, 1], [0, 0])
    win.backward_ended()
    win.stop(passes=1)
    # 2 · (4 output channels · 16 positions) · (2 input channels · 9 taps)
    assert win.error is None and win.flops == win.conv_flops == 2 * 4 * 16 * 2 * 9


def test_a_formula_that_raises_leaves_the_count_unknown_and_the_step_running(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A formula that does not fit its call (torch's own for an operator it misdescribes)
    must not break the user's step; a count without that operator is a lower bound, so the
    FLOPs are unknown and the error says which operator."""
    from torch.utils import flop_counter

    from redline.measure.flops import FlopWindow

    def broken(*args: object, **kwargs: object) -> int:
        raise TypeError("conv_flop() missing 1 required positional argument: 'transposed'")

    monkeypatch.setitem(flop_counter.flop_registry, torch.ops.aten.convolution, broken)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(), nn.Linear(48, 2))
    win = FlopWindow()
    win.start()
    out = model(torch.randn(2, 2, 6, 6))
    out.square().mean().backward()
    win.backward_ended()
    win.stop(passes=1)
    assert out.shape == (2, 2) and model[0].weight.grad is not None
    assert win.flops is None and win.conv_flops is None
    assert win.error is not None and "aten.convolution.default: TypeError" in win.error
