"""A plan's texts, projections and commands are computed once (plan.outcome); the terminal and
JSON presentations only show them."""

from __future__ import annotations

import importlib
import io
import json
import re

import pytest
from rich.console import Console

from redline.plan import PlanInputError, Training, cluster, from_numbers, search
from redline.plan.outcome import plan_outcome
from redline.report.plan_render import render, to_dict

# by module path: `redline.plan.search` the attribute is the function of that name
emit = importlib.import_module("redline.plan.emit")
outcome_module = importlib.import_module("redline.plan.outcome")
search_module = importlib.import_module("redline.plan.search")


def test_presentations_compute_nothing_and_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = from_numbers(params=7e9, layers=32, hidden=4096, heads=32, seq=4096, vocab=32000)
    res = search(spec, Training(global_batch=512, seq=4096), cluster(16, "H100",
                                                                        price_per_gpu_hour=2.5))
    out = plan_outcome(res, steps=10_000, top=3, script="pretrain.py")
    assert out.chosen is not None and out.listed[0] is out.chosen
    assert len(out.listed) == min(3, len(res.ranked))
    assert out.chosen.projection is not None and out.chosen.projection.steps == 10_000
    assert out.chosen.projection.cost == pytest.approx(
        out.chosen.candidate.timing.step_s * 10_000 / 3600 * 16 * 2.5)
    assert out.torchrun is not None and "pretrain.py" in out.torchrun

    def computed(*args: object, **kwargs: object) -> None:
        raise AssertionError("a presentation computed what the outcome holds")

    for module in (search_module, outcome_module):
        for name in ("why", "project"):
            monkeypatch.setattr(module, name, computed)
    for name in ("torchrun_command", "pytorch_snippet", "deepspeed_config"):
        monkeypatch.setattr(emit, name, computed)
        monkeypatch.setattr(outcome_module, name, computed)
    doc = json.loads(json.dumps(to_dict(out), default=str))
    buf = io.StringIO()
    render(out, Console(file=buf, width=200), top=2)
    text = buf.getvalue()
    assert doc["chosen"]["why"] == out.chosen.why and doc["chosen"]["torchrun"] == out.torchrun
    assert len(doc["candidates"]) == len(out.listed)
    assert f"run: {out.torchrun}" in text
    assert f"job of {10_000:,} steps" in text and "cost" in text
    rows = [line for line in text.splitlines() if re.match(r"^│\s+[0-9]+\s+│", line)]
    assert len(rows) == 2 and len(out.listed) == 3  # top=2 of the 3 listed


def test_the_outcome_checks_its_counts() -> None:
    res = search(from_numbers(params=1e9, layers=24, hidden=2048, heads=16, seq=2048),
                 Training(global_batch=64, seq=2048), cluster(8, "H100"))
    with pytest.raises(PlanInputError, match="`top`"):
        plan_outcome(res, top=0)
    with pytest.raises(PlanInputError, match="`steps`"):
        plan_outcome(res, steps=0)
    assert plan_outcome(res).chosen is not None and plan_outcome(res).chosen.projection is None  # type: ignore[union-attr]
