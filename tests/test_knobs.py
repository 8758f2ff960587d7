"""Every knob of the path is one object with every part, all in its module: when it applies,
its candidates and decision (run), its plan fields, how the tuned loop applies it, its framework
words, its decision records and a test of its own. The plan's fields are the knobs' fields and
the core's, each once."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import ClassVar

import pytest

from factories import plan_key
from redline.core.loader import LoaderSettings
from redline.integrations.settings import hf_settings, lightning_settings
from redline.tune.ddp import DdpSettings
from redline.tune.decision import KnobRecord
from redline.tune.knob import APPLY_STAGES, FrameworkWords, TuneKnob, TuningPath
from redline.tune.knobs import KNOBS, PATH, TunePlan
from redline.tune.tuned import PlanCore

TESTS = Path(__file__).parent


def _overrides(knob: TuneKnob, method: str) -> bool:
    return getattr(type(knob), method) is not getattr(TuneKnob, method)


def missing_parts(knob: TuneKnob, test_sources: dict[str, str]) -> list[str]:
    """What ``knob`` lacks of the recipe (docs/architecture.md, "A knob"), in words."""
    missing: list[str] = []
    module = f"redline.tune.knobs.{knob.name}"
    if type(knob).__module__ != module:
        missing.append(f"its module {module}")
    records = getattr(knob, "records", ())
    if not records or not all(isinstance(r, KnobRecord) for r in records):
        missing.append("its decision records (KnobRecord, declared in its module)")
    fields = getattr(knob, "plan_fields", None)
    if not knob.advice_only and fields is None:
        missing.append("its plan fields (or advice_only saying why it changes none)")
    if fields is not None:
        if not dataclasses.is_dataclass(fields) or fields.__module__ != module:
            missing.append(f"its plan fields as a dataclass of {module}")
        elif not issubclass(TunePlan, fields):
            missing.append(f"{fields.__name__} among TunePlan's bases")
    applies = [stage for stage in APPLY_STAGES if _overrides(knob, stage)]
    if fields and not applies:
        missing.append("an apply stage (apply_data, apply_model, apply_optimizer, apply_step)")
    if knob.advice_only and applies:
        missing.append("nothing applied: it is advice only")
    if fields is not None and not _overrides(knob, "framework_args"):
        missing.append("its setting in the frameworks' words (framework_args)")
    words = getattr(knob, "words", None)
    if not isinstance(words, FrameworkWords):
        missing.append("its framework words")
    else:
        if bool(words.lightning) == bool(words.lightning_none):
            missing.append("its Lightning argument or the reason it has none")
        if bool(words.hf) == bool(words.hf_none):
            missing.append("its TrainingArguments field or the reason it has none")
    if not any(re.search(re.escape(module) + r"\b", src) for src in test_sources.values()):
        missing.append(f"a test file that mentions it ({module})")
    return missing


def _test_sources() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in TESTS.glob("test_*.py")
            if p.name != Path(__file__).name}


def test_every_knob_has_every_part() -> None:
    sources = _test_sources()
    gaps = {knob.name: missing_parts(knob, sources) for knob in KNOBS}
    assert not {name: gap for name, gap in gaps.items() if gap}


def test_a_knob_missing_its_parts_is_named() -> None:
    @dataclasses.dataclass(kw_only=True)
    class HalfFields:
        half: bool = False

    class HalfKnob(TuneKnob):
        name = "half"
        records = ()
        plan_fields = HalfFields
        switches = ()
        words: ClassVar[FrameworkWords] = FrameworkWords(lightning=("x",), lightning_none="y")

        def run(self, path: TuningPath, plan: TunePlan) -> TunePlan:
            return plan

    gaps = missing_parts(HalfKnob(), {"test_other.py": "nothing about it"})
    assert gaps == [
        "its module redline.tune.knobs.half",
        "its decision records (KnobRecord, declared in its module)",
        "its plan fields as a dataclass of redline.tune.knobs.half",
        "an apply stage (apply_data, apply_model, apply_optimizer, apply_step)",
        "its setting in the frameworks' words (framework_args)",
        "its Lightning argument or the reason it has none",
        "its TrainingArguments field or the reason it has none",
        "a test file that mentions it (redline.tune.knobs.half)",
    ]


def test_the_plan_fields_are_the_knobs_and_the_cores_each_once() -> None:
    owned = [f.name for knob in KNOBS if knob.plan_fields is not None
             for f in dataclasses.fields(knob.plan_fields)]
    owned += [f.name for f in dataclasses.fields(PlanCore)]
    assert len(owned) == len(set(owned))
    assert set(owned) == {f.name for f in dataclasses.fields(TunePlan)}


def test_the_plans_bases_are_the_knobs_fields_last_knob_first() -> None:
    """So the plan's fields, and its JSON, read in path order (a dataclass takes its bases'
    fields last base first)."""
    knob_fields = [knob.plan_fields for knob in KNOBS if knob.plan_fields is not None]
    assert TunePlan.__bases__ == (*reversed(knob_fields), PlanCore)
    names = [f.name for f in dataclasses.fields(TunePlan)]
    assert names.index("loader") < names.index("precision") < names.index("ddp")


def test_every_decision_record_belongs_to_one_knob_and_labels_are_unique() -> None:
    records = [r for knob in KNOBS for r in knob.records]
    labels = [r.label for r in records]
    assert len(labels) == len(set(labels)) == 14
    shown = {r.label for r in records if r.value_in_label}
    assert shown == {"precision", "optimizer", "DDP bucket_cap_mb", "effective batch"}


def test_a_decision_the_path_does_not_have_is_refused() -> None:
    with pytest.raises(ValueError, match=r"decisions\[0\]\.knob: 'warp drive' is not a knob"):
        TunePlan(key=plan_key(), effective_batch=8, micro_batch=8,
                 decisions=[KnobRecord(label="warp drive").decision()])


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
                    cudnn_benchmark=True, compile=True, compile_mode="reduce-overhead",
                    optimizer_impl="fused",
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
