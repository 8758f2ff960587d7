"""What still limits a tuned step, from measured numbers, and the table that prints it."""

from __future__ import annotations

from typing import Any

import pytest

from factories import plan_key as _key
from redline.tune.knobs import TunePlan


def _after(wait: float | None, kernels: float | None, span: float | None) -> Any:
    from redline.tune.result import TrialMetrics

    return TrialMetrics(label="after", throughput_samples_per_s=1000.0, step_time_s=0.01,
                        data_wait_fraction=wait, device_busy_fraction=span, mfu=None,
                        peak_memory_bytes=None, peak_memory_source="", energy_j_per_step=None,
                        energy_source="", steps=10, wall_s=1.0,
                        device_busy_kernels_fraction=kernels)


def test_remaining_limits_say_which_bottleneck_is_left() -> None:
    from redline.diagnose import remaining_limits

    def ids(wait: float | None, kernels: float | None, span: float | None) -> list[str]:
        return [lim.id for lim in remaining_limits(wait, kernels, span)]

    # no data wait left, the span near 90 %, kernels far below: the host launches too slowly
    host = remaining_limits(0.022, 0.40, 0.856)
    assert [lim.id for lim in host] == ["host_bound"]
    assert "40%" in host[0].evidence and "86%" in host[0].evidence
    assert "reduce-overhead" in host[0].next_step
    assert ids(0.01, 0.95, 0.97) == ["device_bound"]
    assert ids(0.60, 0.35, 0.40) == ["data_bound"]  # waiting for data explains the idle device
    # some data wait, but most of the idle is the host launching
    both = remaining_limits(0.068, 0.316, 0.942)
    assert [lim.id for lim in both] == ["host_bound", "data_bound"]
    assert both[0].step_fraction == pytest.approx(0.616)
    assert "62% of the step not explained by the data wait" in both[0].evidence
    assert ids(0.30, 0.35, 0.40) == ["host_bound", "data_bound"]  # 35 % idle left unexplained
    assert ids(0.01, 0.60, 0.62) == ["host_bound"]  # idle between the step's device work
    assert ids(0.01, 0.85, 0.88) == []  # nothing clear enough to name
    assert ids(0.01, None, None) == []  # CPU: nothing is guessed about a device
    assert ids(0.20, None, None) == ["data_bound"]
    assert ids(None, None, None) == []


def test_tune_table_prints_what_still_limits() -> None:
    import io

    from rich.console import Console

    from redline.diagnose import remaining_limits
    from redline.report.tune_render import render
    from redline.tune.result import Projection, TuneResult

    after = _after(0.022, 0.40, 0.856)
    proj = Projection(run_steps=10_000, job_time_s=100.0, cost=None, energy_kwh=None)
    res = TuneResult(plan=TunePlan(key=_key(), effective_batch=64, micro_batch=64),
                     before=_after(0.86, 0.10, 0.13), after=after, before_projection=proj,
                     after_projection=proj, run_steps_source="default", price_per_device_hour=None,
                     limits=remaining_limits(0.022, 0.40, 0.856))
    buf = io.StringIO()
    render(res, console=Console(file=buf, width=200))
    text = buf.getvalue()
    assert "still limited: host_bound" in text
    assert "device busy (kernels)" in text and "40.0%" in text
