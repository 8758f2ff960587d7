"""Plans: saved, loaded, remembered per key, and bad files named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factories import plan_key as _key
from redline.core.loader import LoaderSettings
from redline.tune.decision import Decision
from redline.tune.knobs import TunePlan
from redline.tune.plan_store import PlanStore, load_plan, save_plan
from redline.tune.tuned import TunePlanError


def test_plan_roundtrip_store_and_bad_files(tmp_path: Path) -> None:
    decision = Decision(knob="precision", value_in_label=True, kept=True,
                        reason="1.30× throughput", value="bf16", again=True,
                        context="channels_last", p_value=0.01, details={"trials": 3})
    plan = TunePlan(key=_key(), effective_batch=64, micro_batch=24, precision="bf16",
                    loader=LoaderSettings(num_workers=2, prefetch_factor=2),
                    decisions=[decision])
    assert plan.to_dict()["decisions"][0]["step"] == "precision bf16 (again, channels_last)"
    assert plan.accumulation_steps == 3
    save_plan(plan, tmp_path / "p.json")
    assert load_plan(tmp_path / "p.json") == plan
    store = PlanStore(tmp_path / "store")
    assert store.get(plan.key) is None
    store.put(plan)
    assert store.get(plan.key) == plan
    assert store.get(_key("other")) is None
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        load_plan(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"schema": "redline.report/1"}')
    with pytest.raises(ValueError, match="not a redline plan"):
        load_plan(tmp_path / "other.json")
    with pytest.raises(FileNotFoundError, match="redline tune"):
        load_plan(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="micro_batch"):
        TunePlan(key=_key(), effective_batch=8, micro_batch=16)
    old = plan.to_dict() | {"schema": "redline.plan/1"}
    (tmp_path / "v1.json").write_text(json.dumps(old))
    with pytest.raises(TunePlanError, match=r"v1\.json.*earlier redline.*redline tune"):
        load_plan(tmp_path / "v1.json")
    older = plan.to_dict()  # written before decisions stored value_in_label
    del older["decisions"][0]["value_in_label"]
    (tmp_path / "older.json").write_text(json.dumps(older))
    assert load_plan(tmp_path / "older.json").decisions[0].label == \
        "precision bf16 (again, channels_last)"
    unknown = plan.to_dict()
    unknown["decisions"][0]["knob"] = "warp drive"
    (tmp_path / "knob.json").write_text(json.dumps(unknown))
    with pytest.raises(TunePlanError, match=r"knob\.json.*warp drive"):
        load_plan(tmp_path / "knob.json")
