"""The diagnosis benchmark's answer key and scoring, without running any job."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from redline.core.findings import CATALOGUE

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


key_mod = _load("diagnosis_key")
bench = _load("diagnosis")


def test_key_covers_every_job_file_and_nothing_else() -> None:
    scripts = {p.name for p in (BENCH / "diagnosis_jobs").glob("*.py") if not p.name.startswith("_")}
    assert scripts == {k.script for k in key_mod.KEY}
    assert len(key_mod.KEY) == len(key_mod.BY_SCRIPT)
    causes = [k for k in key_mod.KEY if k.cause_class != "control"]
    assert len(causes) >= 15 and len(key_mod.KEY) - len(causes) >= 3


def test_every_key_id_is_known_and_every_class_listed() -> None:
    known = set(CATALOGUE) | set(key_mod.NEW_IDS)
    for k in key_mod.KEY:
        assert set(k.accepted_ids) | set(k.tolerated_ids) <= known, k.script
        assert not set(k.accepted_ids) & set(k.tolerated_ids), k.script
        assert k.cause_class in key_mod.CLASSES and set(k.tolerated_classes) <= set(key_mod.CLASSES)
        assert bool(k.accepted_ids) == (k.cause_class != "control"), k.script


def test_every_peer_label_maps_to_known_classes() -> None:
    classes = set(key_mod.CLASSES)
    for cls in bench.TRACEML_CLASSES.values():
        assert set(cls) <= classes
    for _, _, cls in bench.GPUPROF_RULES:
        assert set(cls) <= classes


def F(fid: str, severity: str = "high", rank: int | None = None, classes: tuple[str, ...] = ()) -> object:
    return bench.Finding(id=fid, severity=severity, rank=rank, classes=classes)


def test_redline_scoring() -> None:
    ck = key_mod.BY_SCRIPT["checkpoint_every5"]
    s = bench.score(ck, [F("host_work_in_loop"), F("checkpoint_in_loop", "medium"),
                         F("cpu_contention", "medium"), F("small_batch", "low")], "redline")
    # accepted second: detected, not first; the generic id is tolerated; a low one never counts
    assert (s.detected, s.first, s.false_alarms) == (True, False, ["cpu_contention"])
    s = bench.score(ck, [F("checkpoint_in_loop", "low")], "redline")
    assert (s.detected, s.first, s.false_alarms) == (True, True, [])
    s = bench.score(ck, [], "redline")
    assert (s.detected, s.first, s.false_alarms) == (False, False, [])


def test_rank_must_match_for_a_straggler() -> None:
    sk = key_mod.BY_SCRIPT["ddp_slow_rank1"]
    s = bench.score(sk, [F("straggler", rank=0), F("data_starvation")], "redline")
    assert (s.detected, s.first, s.false_alarms) == (False, False, ["straggler"])
    s = bench.score(sk, [F("data_starvation"), F("straggler", rank=1)], "redline")
    assert (s.detected, s.first, s.false_alarms) == (True, False, [])


def test_controls_count_every_severe_finding() -> None:
    ck = key_mod.BY_SCRIPT["clean_mlp"]
    s = bench.score(ck, [F("straggler", "high"), F("host_sync", "medium"), F("launch_bound", "low")],
                    "redline")
    assert (s.detected, s.first, s.false_alarms) == (False, False, ["straggler", "host_sync"])
    # a peer's compute-bound verdict is right for a control
    s = bench.score(ck, [F("COMPUTE_BOUND", classes=("control",)), F("HIGH_CPU", "medium",
                                                                     classes=("contention", "data"))],
                    "traceml")
    assert s.false_alarms == ["HIGH_CPU"]


def test_peer_scoring_by_class_and_parsing() -> None:
    gk = key_mod.BY_SCRIPT["gc_bookkeeping"]
    traceml = bench.traceml_findings({
        "primary_diagnosis": {"kind": "RESIDUAL_HEAVY", "severity": "crit", "summary": "r 70%"},
        "step_time": {"issues": [{"kind": "RESIDUAL_HEAVY", "severity": "crit", "summary": "r 70%"}]},
        "system": {"issues": [{"kind": "HIGH_CPU", "severity": "warn", "summary": "cpu"}]},
        "process": {"issues": [{"kind": "NORMAL", "severity": "info", "summary": "ok"}]},
    })
    assert [f.id for f in traceml] == ["RESIDUAL_HEAVY", "HIGH_CPU"]
    s = bench.score(gk, traceml, "traceml")
    # residual time names no kind: tolerated on a gc job, not a detection
    assert (s.detected, s.first, s.false_alarms) == (False, False, ["HIGH_CPU"])
    gp = bench.gpuprof_findings([
        {"severity": "high", "title": "Rank skew: rank 0 median 72 ms vs rank 1 7 ms (906% slower)"},
        {"severity": "high", "title": "53% of step time waiting on the loader (inter-step gap)"},
        {"severity": "low", "title": "No rank skew detected"},
    ], rank=None)
    assert [(f.id, f.rank) for f in gp] == [("rank_skew", 0), ("dataloader_stall", None)]
    s = bench.score(key_mod.BY_SCRIPT["ddp_slow_rank1"], gp, "gpuprof")
    assert (s.detected, s.first, s.false_alarms) == (False, False, ["rank_skew"])
    s = bench.score(key_mod.BY_SCRIPT["storage_latency"], gp[1:], "gpuprof")
    assert (s.detected, s.first, s.false_alarms) == (True, True, [])
