"""Every knob of the path is one object with every part: when it applies, its candidates and
decision (run), its plan fields, how the tuned loop applies it, its framework words, its labels
and a test of its own. The plan's fields are the knobs' fields and the path's, each once."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import ClassVar

import pytest

from factories import plan_key
from redline.core.loader import LoaderSettings
from redline.integrations.settings import hf_settings, lightning_settings
from redline.tune.decision import Knob
from redline.tune.knob import APPLY_STAGES, FrameworkWords, TuneKnob, TuningPath
from redline.tune.knobs import KNOBS, PATH, PATH_FIELDS
from redline.tune.tuned import DdpSettings, TunePlan

TESTS = Path(__file__).parent


def _overrides(knob: TuneKnob, method: str) -> bool:
    return getattr(type(knob), method) is not getattr(TuneKnob, method)


def missing_parts(knob: TuneKnob, test_sources: dict[str, str]) -> list[str]:
    """What ``knob`` lacks of the recipe (docs/architecture.md, "A knob"), in words."""
    missing: list[str] = []
    if type(knob).__module__ != f"redline.tune.knobs.{knob.name}":
        missing.append(f"its module redline.tune.knobs.{knob.name}")
    if not getattr(knob, "records", ()) or not all(isinstance(r, Knob) for r in knob.records):
        missing.append("a label (its decision ids in redline.tune.decision.Knob)")
    plan_fields = {f.name for f in dataclasses.fields(TunePlan)}
    fields = getattr(knob, "plan_fields", ())
    if not knob.advice_only and not fields:
        missing.append("a plan field (or advice_only saying why it changes none)")
    missing += [f"the plan field {f!r}" for f in fields if f not in plan_fields]
    applies = [stage for stage in APPLY_STAGES if _overrides(knob, stage)]
    if fields and not applies:
        missing.append("an apply stage (apply_data, apply_model, apply_optimizer, apply_step)")
    if knob.advice_only and applies:
        missing.append("nothing applied: it is advice only")
    words = getattr(knob, "words", None)
    if not isinstance(words, FrameworkWords):
        missing.append("its framework words")
    else:
        if bool(words.lightning) == bool(words.lightning_none):
            missing.append("its Lightning argument or the reason it has none")
        if bool(words.hf) == bool(words.hf_none):
            missing.append("its TrainingArguments field or the reason it has none")
    mentions = [f"redline.tune.knobs.{knob.name}"] + [f"Knob.{r.name}" for r in knob.records]
    if not any(re.search(re.escape(m) + r"\b", src) for src in test_sources.values()
               for m in mentions):
        missing.append(f"a test file that mentions it ({' or '.join(mentions)})")
    return missing


def _test_sources() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in TESTS.glob("test_*.py")
            if p.name != Path(__file__).name}


def test_every_knob_has_every_part() -> None:
    sources = _test_sources()
    gaps = {knob.name: missing_parts(knob, sources) for knob in KNOBS}
    assert not {name: gap for name, gap in gaps.items() if gap}


def test_a_knob_missing_its_parts_is_named() -> None:
    class HalfKnob(TuneKnob):
        name = "half"
        records = ()
        plan_fields = ("not_a_field",)
        switches = ()
        words: ClassVar[FrameworkWords] = FrameworkWords(lightning=("x",), lightning_none="y")

        def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
            return plan

    gaps = missing_parts(HalfKnob(), {"test_other.py": "nothing about it"})
    assert gaps == [
        "its module redline.tune.knobs.half",
        "a label (its decision ids in redline.tune.decision.Knob)",
        "the plan field 'not_a_field'",
        "an apply stage (apply_data, apply_model, apply_optimizer, apply_step)",
        "its Lightning argument or the reason it has none",
        "its TrainingArguments field or the reason it has none",
        "a test file that mentions it (redline.tune.knobs.half)",
    ]


def test_the_plan_fields_are_the_knobs_and_the_paths_each_once() -> None:
    owned = [f for knob in KNOBS for f in knob.plan_fields] + list(PATH_FIELDS)
    assert len(owned) == len(set(owned))
    assert set(owned) == {f.name for f in dataclasses.fields(TunePlan)}


def test_every_decision_id_belongs_to_one_knob() -> None:
    records = [r for knob in KNOBS for r in knob.records]
    assert len(records) == len(set(records)) and set(records) == set(Knob)


def test_the_path_visits_every_knob_once_in_list_order_and_again_where_it_can() -> None:
    first = [v.knob for v in PATH if not v.again]
    assert first == list(KNOBS)
    again = [v.knob.name for v in PATH if v.again]
    assert again == ["batch", "precision", "batch", "gpu_decode", "loader"]
    assert all(_overrides(v.knob, "again") for v in PATH if v.again)
    assert [v.knob.name for v in PATH if v.knob.heading is not None and not v.again] == [
        "loader", "batch", "batch_change", "precision", "sdpa", "ddp"]


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
def test_the_framework_words_are_the_exported_arguments(precision: str) -> None:
    """Each name a knob declares is a key of the exported settings for a plan that turns it
    on (the precision's names across the four precisions)."""
    plan = TunePlan(key=plan_key(), effective_batch=64, micro_batch=16, precision=precision,
                    cudnn_benchmark=True, compile=True, optimizer_impl="fused",
                    ddp=DdpSettings(bucket_cap_mb=10.0, gradient_as_bucket_view=True),
                    lr_scale=2.0, lr_rule="linear", lr_warmup_steps=5,
                    user_effective_batch=32,
                    loader=LoaderSettings(num_workers=2, prefetch_factor=4, pin_memory=True,
                                          persistent_workers=True))
    lit, hf = lightning_settings(plan), hf_settings(plan)
    lit_keys, hf_keys = set(lit.arguments) | set(lit.dataloader), set(hf.arguments)
    for knob in KNOBS:
        assert set(knob.words.lightning) <= lit_keys, knob.name
        hf_declared = set(knob.words.hf)
        if knob.name == "precision":  # tf32 is a field only where the plan is TF32
            hf_declared -= {"tf32"} if precision != "tf32" else set()
        assert hf_declared <= hf_keys, knob.name
