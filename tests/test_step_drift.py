"""Steps that drift, measured on real loops: a step slowed by a growing sleep is
step_time_drift with its phase; one that alternates between two levels is step_time_bimodal;
a stall every k-th step stays periodic_stall's; the first slow steps are start-up cost, left
out of the steady statistics; a steady loop gets none of them. The effects are many times a
loaded 2-core host's jitter (sleeps of several ms), and the thresholds read the run's own
spread."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable

import jsonschema
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import redline
from factories import measurements
from redline.core.findings import Finding
from redline.core.measurements import StepDrift, StepModes, StepTrend
from redline.diagnose import diagnose
from redline.measure.drift import startup_cost
from redline.measure.step_record import PHASES, StepRecord
from redline.report.json_io import schema, to_dict

DRIFT_IDS = {"step_time_drift", "step_time_bimodal"}


class Sleepy(nn.Module):
    """A linear layer whose forward also sleeps ``delay(call)`` seconds (the step's 'forward')."""

    def __init__(self, delay: Callable[[int], float]) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 3)
        self.delay = delay
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay(self.calls))
        self.calls += 1
        return self.lin(x)


def _run(delay: Callable[[int], float], steps: int = 200, warmup: int = 2,
         between: Callable[[int], float] | None = None) -> redline.Report:
    ds = TensorDataset(torch.randn(steps * 8, 16), torch.randint(0, 3, (steps * 8,)))
    model = Sleepy(delay)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with redline.watch(warmup_steps=warmup, count_flops=False) as w:
        for i, (x, y) in enumerate(DataLoader(ds, batch_size=8)):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if between is not None:
                time.sleep(between(i))
    rep = w.report(show=False)
    jsonschema.validate(to_dict(rep), schema())
    return rep


def _ids(rep: redline.Report) -> set[str]:
    return {f.id for f in rep.findings}


def _finding(rep: redline.Report, fid: str) -> Finding:
    found = [f for f in rep.findings if f.id == fid]
    d = rep.measurements.drift
    assert found, f"{sorted(_ids(rep))} {d.trend if d else None} {d.modes if d else None}"
    return found[0]


def test_a_growing_sleep_in_forward_is_a_drift_named_by_its_phase() -> None:
    rep = _run(lambda i: 0.002 + 0.0005 * i)  # 2 ms → 102 ms over 200 steps
    f = _finding(rep, "step_time_drift")
    assert f.evidence["phase"] == "forward"
    # the forward grows 0.5 ms a step: 500 ms per 1,000 steps (the step's own slope also
    # carries the host's load as it comes and goes)
    assert 400 < f.evidence["phase_slope_ms_per_1k_steps"] < 600
    assert 250 < f.evidence["slope_ms_per_1k_steps"] < 750
    assert f.evidence["end_ms"] - f.evidence["start_ms"] > 50  # 100 ms designed
    assert f.ceiling_speedup is not None and f.ceiling_speedup > 1.2
    assert "step_time_bimodal" not in _ids(rep)


def test_a_growing_sleep_between_the_phases_is_a_drift_outside_them() -> None:
    rep = _run(lambda i: 0.002, between=lambda i: 0.0005 * i)
    f = _finding(rep, "step_time_drift")
    assert f.evidence["phase"] == "other" and "outside the measured phases" in f.title


def test_two_interleaved_levels_are_bimodal_in_their_phase() -> None:
    rng = random.Random(7)
    slow = [rng.random() < 0.35 for _ in range(400)]
    rep = _run(lambda i: 0.2 if slow[i] else 0.002, steps=150)
    f = _finding(rep, "step_time_bimodal")
    assert f.evidence["phase"] == "forward"
    assert 0.2 < f.evidence["slow_share"] < 0.5
    assert f.evidence["slow_ms"] > 3 * f.evidence["fast_ms"]
    assert "step_time_drift" not in _ids(rep)
    assert "periodic_stall" not in _ids(rep)


def test_a_stall_every_fifth_step_stays_periodic_stall() -> None:
    rep = _run(lambda i: 0.1 if i % 5 == 4 else 0.005)
    f = _finding(rep, "periodic_stall")
    # named with its period and the phase it comes from (the sleep is in forward)
    assert f.evidence["period_steps"] == 5 and f.evidence["phase"] == "forward"
    assert 80 < f.evidence["extra_ms_per_slow_step"] < 150  # 95 ms designed
    assert not DRIFT_IDS & _ids(rep)


def test_first_slow_steps_are_start_up_cost_left_out_of_the_steady_state() -> None:
    rep = _run(lambda i: 0.25 if i < 10 else 0.003, steps=120)
    m = rep.measurements
    assert m.drift is not None and m.drift.startup is not None
    s = m.drift.startup
    # the 10 slow steps at least (a loaded host may keep the next ones slow too)
    assert s.steps >= 10 and s.steps_after_warmup == s.steps - 2 and s.left_out
    assert s.run_delay_s is not None and s.run_delay_s < 0.5 * s.extra_s
    assert s.extra_s > 10 * 0.2 and s.first_step_s > 0.25
    assert 0.003 <= s.steady_step_s < 0.1
    # the steady statistics hold none of them
    assert m.timing.step_time_p95_s is not None and m.timing.step_time_p95_s < 0.2
    assert any("start-up" in n for n in m.notes)
    assert not DRIFT_IDS & _ids(rep)


def test_a_steady_loop_gets_no_drift_finding() -> None:
    for _ in range(3):
        rep = _run(lambda i: 0.004, steps=200)
        assert not DRIFT_IDS & _ids(rep), [f.title for f in rep.findings]
        m = rep.measurements
        assert m.drift is not None and m.drift.trend is not None
        s = m.drift.startup
        # slow first steps of a steady loop are a loaded host's, and stay in the statistics
        assert s is not None and (s.steps_after_warmup == 0 or not s.left_out), s


def _trend(**kw: float | int | str) -> StepTrend:
    base = dict(steps=200, slope_s_per_1k_steps=0.1, slope_s_per_hour=1.0, trend_z=9.0,
                start_s=0.01, end_s=0.03, noise_s=0.001, rise_fraction=1.0, extra_fraction=0.3,
                phase="forward", phase_slope_s_per_1k_steps=0.1, run_delay_rise_s=0.002)
    return StepTrend(**{**base, **kw})  # type: ignore[arg-type]


def _modes(**kw: float | str | None) -> StepModes:
    base = dict(fast_s=0.01, slow_s=0.03, slow_share=0.3, separation=8.0,
                slow_first_half_share=0.5, extra_fraction=0.3, phase="forward",
                run_delay_fraction=0.01)
    return StepModes(**{**base, **kw})  # type: ignore[arg-type]


def _with(trend: StepTrend | None = None, modes: StepModes | None = None,
          **host: float) -> list[str]:
    m = dataclasses.replace(measurements(host=host or None),
                            drift=StepDrift(startup=None, trend=trend, modes=modes))
    return [f.id for f in diagnose(m)]


def test_drift_and_bimodal_thresholds_read_the_spread_and_the_host() -> None:
    assert "step_time_drift" in _with(_trend())
    assert "step_time_drift" not in _with(_trend(trend_z=3.0))  # within the noise
    assert "step_time_drift" not in _with(_trend(noise_s=0.025))  # a rise within 1 σ
    assert "step_time_drift" not in _with(_trend(rise_fraction=0.2, end_s=0.012))
    # the loop's wait for a CPU rose by half the step's rise (20 ms): the host's load rose
    assert "step_time_drift" not in _with(_trend(run_delay_rise_s=0.011))
    assert "step_time_drift" in _with(_trend(run_delay_rise_s=None))
    # waiting for a CPU (nearly) as long as the slow level cost: two speeds of a loaded host
    assert "step_time_bimodal" not in _with(None, _modes(run_delay_fraction=0.15))
    assert "step_time_bimodal" in _with(None, _modes(run_delay_fraction=0.1))
    assert "step_time_bimodal" in _with(None, _modes(run_delay_fraction=None))
    assert "step_time_bimodal" in _with(_trend(trend_z=0.0), _modes())
    assert "step_time_bimodal" not in _with(None, _modes(separation=2.0))
    assert "step_time_bimodal" not in _with(None, _modes(slow_s=0.012))
    assert "step_time_bimodal" not in _with(None, _modes(slow_share=0.05))
    assert "step_time_bimodal" not in _with(None, _modes(slow_first_half_share=0.02))  # a shift
    assert "step_time_bimodal" in _with(None, _modes(separation=None))  # no spread: apart


def _records(times_s: list[float], warmup: int,
             evaluation_s: list[float] | None = None) -> list[StepRecord]:
    out, t = [], 0.0
    for i, step_s in enumerate(times_s):
        phases = [0.0] * len(PHASES)
        phases[PHASES.index("evaluation")] = evaluation_s[i] if evaluation_s else 0.0
        out.append(StepRecord(index=i, start_s=t, end_s=t + step_s, phases=phases,
                              kind="warmup" if i < warmup else "measured"))
        t += step_s
    return out


def test_start_up_is_left_out_only_where_its_measured_steps_weigh() -> None:
    """Sub-millisecond steps a little above their level after a long first step, in a loop
    whose time is mostly an evaluation every 10 steps: the evaluations are not start-up, the
    rest is under 1 % of the measured time, and the steps stay in; the same steps in a loop of
    their own weigh and go."""
    quick = [0.075] + [0.0005] * 18 + [0.0003] * 21  # 3 warm-up, 16 measured at +0.2 ms
    evaluation = [0.2 if i % 10 == 0 and i else 0.0 for i in range(len(quick))]
    with_eval = [t + e for t, e in zip(quick, evaluation, strict=True)]
    def no_delay(a: float, b: float) -> float | None:
        return 0.0

    s = startup_cost(_records(with_eval, 3, evaluation), 1, no_delay)
    assert s is not None and s.steps == 19 and s.steps_after_warmup == 16
    # the first step's 75 ms are the warm-up's; the measured start-up holds 16 × 0.2 ms, the
    # evaluation at step 10 none of its 200 ms
    assert abs(s.extra_after_warmup_s - 16 * 0.0002) < 1e-9, s
    assert 0.075 < s.extra_s < 0.08 and abs(s.seconds - sum(quick[:19])) < 1e-9
    assert s.run_delay_after_warmup_s == 0.0 and not s.left_out
    assert s.kept_because == "immaterial"
    s = startup_cost(_records(quick, 3), 1, no_delay)
    assert s is not None and s.steps_after_warmup == 16 and s.left_out
    assert s.kept_because is None
    # a delay over the measured start-up of over half its extra keeps it in, whatever the
    # warm-up's
    def over_half(a: float, b: float) -> float | None:
        return 0.6 * 16 * 0.0002 if a >= 0.075 else 1.0

    s = startup_cost(_records(quick, 3), 1, over_half)
    assert s is not None and s.run_delay_s == 1.0 and not s.left_out
    assert s.kept_because == "loaded_host"
    # an unknown delay keeps them in
    s = startup_cost(_records(quick, 3), 1, lambda a, b: None)
    assert s is not None and s.run_delay_after_warmup_s is None and not s.left_out
    assert s.kept_because == "delay_unknown"
