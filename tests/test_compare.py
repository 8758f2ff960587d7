"""`redline compare`: the statistics (Student's t, Welch's test on batch means), the verdict's
rules, what two reports, a plan and a report, and two traces are compared on, and the inputs it
refuses. The runs of a real script are in test_compare_runs.py."""

from __future__ import annotations

import copy
import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest

from redline.compare import (
    IMPROVEMENT,
    NO_CHANGE,
    REGRESSION,
    UNKNOWN,
    CompareInputError,
    compare_paths,
    compare_plan,
    compare_reports,
)
from redline.compare.stats import (
    BATCH_MEANS,
    STEPS,
    Sample,
    batch_sample,
    ratio_interval,
    t_quantile,
    t_sf,
    welch,
)
from redline.compare.verdict import step_test, verdict_of
from redline.core.report import SCHEMA_VERSION
from redline.report.compare_render import to_dict
from trace_fixtures import synthetic_events, write_trace

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
NS_TRACE = SHARED / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
NCCL_TRACE = SHARED / "nccl_parser_config" / "nccl_data.json.gz"
needs_shared = pytest.mark.skipif(not NS_TRACE.exists(), reason=f"shared traces not found at "
                                  f"{SHARED} (CI and the developers' checkout have them)")


# ---- statistics -------------------------------------------------------------------------

@pytest.mark.parametrize(("q", "df", "expected"), [
    (0.975, 1, 12.706204736), (0.975, 10, 2.228138852), (0.95, 5, 2.015048373),
    (0.975, 1000, 1.962339081)])
def test_t_quantiles_match_the_tables(q: float, df: float, expected: float) -> None:
    assert t_quantile(q, df) == pytest.approx(expected, rel=1e-8)
    assert t_sf(expected, df) == pytest.approx(1 - q, rel=1e-8)


def test_welch_by_hand() -> None:
    a = Sample(mean_s=10.0, n=10, std_s=2.0, steps=10, method=STEPS)
    b = Sample(mean_s=12.0, n=20, std_s=3.0, steps=20, method=STEPS)
    r = welch(a, b)
    va, vb = 4 / 10, 9 / 20
    assert r.t == pytest.approx(2 / (va + vb) ** 0.5)
    assert r.df == pytest.approx((va + vb) ** 2 / (va ** 2 / 9 + vb ** 2 / 19))
    assert r.p_value == pytest.approx(2 * t_sf(r.t, r.df))
    half = t_quantile(0.975, r.df) * (va + vb) ** 0.5
    assert (r.ci_low_s, r.ci_high_s) == pytest.approx((2 - half, 2 + half))


def test_the_relative_change_s_interval_is_fieller_s_and_never_below_minus_100_percent() -> None:
    """A wide before run: the difference's interval over the before mean goes below −100 %
    (impossible for a time); Fieller's interval of the ratio solves its defining equation at
    both ends, holds the observed ratio, and stays above −100 %."""
    before = Sample(mean_s=0.0101, n=10, std_s=0.0040, steps=30, method=BATCH_MEANS)
    after = Sample(mean_s=0.00227, n=10, std_s=0.00115, steps=20, method=BATCH_MEANS)
    r = welch(before, after)
    assert r.ci_low_s / before.mean_s < -1.0
    lo, hi = ratio_interval(before_mean_s=before.mean_s, before_se_s=before.standard_error_s,
                            after_mean_s=after.mean_s, after_se_s=after.standard_error_s,
                            df=r.df) or (None, None)
    assert lo is not None and hi is not None
    q = t_quantile(0.975, r.df or 0) ** 2
    for ratio in (lo, hi):
        lhs = (after.mean_s - ratio * before.mean_s) ** 2
        rhs = q * (after.standard_error_s ** 2 + ratio ** 2 * before.standard_error_s ** 2)
        assert lhs == pytest.approx(rhs, rel=1e-9)
    assert 0.0 < lo < after.mean_s / before.mean_s < hi
    test = step_test(before, after, "step_time")
    v = verdict_of(test, min_effect_fraction=0.05, alpha=0.05, step_time_before_s=None,
                   step_time_after_s=None, throughput_before=None, throughput_after=None)
    assert f"95 % CI {lo - 1:+.1%} to {hi - 1:+.1%}" in v.reason
    # a before run whose mean is not told from zero bounds no ratio
    assert ratio_interval(before_mean_s=1.0, before_se_s=1.0, after_mean_s=1.0,
                          after_se_s=0.1, df=5.0) is None


def test_batches() -> None:
    s = batch_sample([float(i) for i in range(100)])
    assert (s.method, s.n, s.steps) == (BATCH_MEANS, 10, 100)
    assert s.mean_s == pytest.approx(49.5)
    assert s.lag1_autocorrelation == pytest.approx(0.7)  # a straight line's batch means
    s = batch_sample([float(i) for i in range(23)])  # 10 batches of 2, the 3 earliest dropped
    assert (s.method, s.n, s.steps) == (BATCH_MEANS, 10, 20)
    assert s.mean_s == pytest.approx(sum(range(3, 23)) / 20)
    s = batch_sample([1.0, 2.0, 3.0])
    assert (s.method, s.n) == (STEPS, 3)
    with pytest.raises(ValueError, match="at least 2"):
        batch_sample([1.0])


def _ar1(rng: random.Random, n: int, phi: float, mean: float) -> list[float]:
    x, out = 0.0, []
    for _ in range(n):
        x = phi * x + rng.gauss(0, 1)
        out.append(mean + x)
    return out


def test_batch_means_hold_the_false_alarm_rate_on_autocorrelated_steps() -> None:
    """Two runs of the same loop whose step times drift together for tens of steps (AR(1),
    φ = 0.9): single steps taken as independent call most such pairs different; their batch
    means keep to about the test's 5 %."""
    rng = random.Random(7)
    alarms = {"steps": 0, "batches": 0}
    pairs = 200
    for _ in range(pairs):
        a, b = _ar1(rng, 400, 0.9, 100.0), _ar1(rng, 400, 0.9, 100.0)
        single = welch(Sample(mean_s=sum(a) / 400, n=400, std_s=_std(a), steps=400,
                              method=STEPS),
                       Sample(mean_s=sum(b) / 400, n=400, std_s=_std(b), steps=400,
                              method=STEPS))
        alarms["steps"] += single.p_value < 0.05
        alarms["batches"] += welch(batch_sample(a), batch_sample(b)).p_value < 0.05
    assert alarms["steps"] / pairs > 0.4
    assert alarms["batches"] / pairs < 0.11


def _std(xs: list[float]) -> float:
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


# ---- the verdict ------------------------------------------------------------------------

def _verdict(before: list[float], after: list[float], min_effect: float = 0.05,
             contention: tuple[float, float] | None = None) -> str:
    test = step_test(batch_sample(before), batch_sample(after), "step_time")
    return verdict_of(test, min_effect_fraction=min_effect, alpha=0.05,
                      step_time_before_s=None, step_time_after_s=None, throughput_before=None,
                      throughput_after=None, contention=contention).verdict


def test_the_verdict_needs_significance_and_the_minimum_effect() -> None:
    rng = random.Random(3)
    base = [0.100 + rng.gauss(0, 0.002) for _ in range(200)]
    slower = [0.130 + rng.gauss(0, 0.002) for _ in range(200)]
    faster = [0.080 + rng.gauss(0, 0.002) for _ in range(200)]
    slightly = [0.102 + rng.gauss(0, 0.002) for _ in range(200)]  # certain, but 2 %
    noisy = [0.130 + rng.gauss(0, 0.2) for _ in range(200)]  # 30 % in a spread of 200 %
    assert _verdict(base, slower) == REGRESSION
    assert _verdict(base, faster) == IMPROVEMENT
    assert _verdict(base, slightly) == NO_CHANGE
    assert _verdict(base, slightly, min_effect=0.01) == REGRESSION
    assert _verdict(base, noisy) == NO_CHANGE
    # 30 % slower on the wall clock, but the after run waited for a CPU 25 % of its time
    # instead of 2 %: 1.3 × 0.75 / 0.98 is +0 %, the host's load
    assert _verdict(base, slower, contention=(0.02, 0.25)) == NO_CHANGE
    assert _verdict(base, slower, contention=(0.02, 0.05)) == REGRESSION
    unknown = verdict_of(None, min_effect_fraction=0.05, alpha=0.05, step_time_before_s=None,
                         step_time_after_s=None, throughput_before=None, throughput_after=None)
    assert unknown.verdict == UNKNOWN


# ---- two reports ------------------------------------------------------------------------

def _report(times: list[float], *, batch: int = 32, phases: dict[str, float] | None = None,
            findings: list[dict[str, Any]] | None = None, device: str = "cpu",
            host: dict[str, Any] | None = None) -> dict[str, Any]:
    mean = sum(times) / len(times)
    s = sorted(times)
    phases = phases or {"data_wait": 0.2, "forward": 0.3, "backward": 0.4, "other": 0.1}
    return {
        "schema": SCHEMA_VERSION, "redline_version": "0.1.0", "torch_version": "2.5.0",
        "status": "completed",
        "measurements": {
            "device": {"type": device, "name": device, "count": 1},
            "config": {"device": device, "batch_size": batch, "precision": "fp32",
                       "torch_threads": 2, "loader": {"num_workers": 0, "pin_memory": False}},
            "timing": {"steps_measured": len(times), "step_time_mean_s": mean,
                       "step_time_p50_s": s[len(s) // 2], "step_time_p95_s": s[int(len(s) * .95)],
                       "samples_per_step": float(batch),
                       "throughput_samples_per_s": batch / mean, "step_times_s": times},
            "breakdown": [{"phase": k, "mean_s": v * mean, "fraction": v}
                          for k, v in phases.items()],
            "host": {"cpus_available": 2.0, "main_cpu_cores": 1.0,
                     "main_thread_run_delay_fraction": 0.01, **(host or {})},
        },
        "findings": findings or [],
    }


def _times(rng: random.Random, mean: float, n: int = 100) -> list[float]:
    return [mean + rng.gauss(0, mean * 0.03) for _ in range(n)]


def test_two_reports_phases_findings_and_host() -> None:
    rng = random.Random(1)
    slow_data = {"id": "data_starvation", "severity": "high", "title": "waits for data",
                 "ceiling_speedup": 2.0}
    before = _report(_times(rng, 0.100), findings=[slow_data, {
        "id": "small_batch", "severity": "low", "title": "small", "ceiling_speedup": 1.2}])
    after = _report(_times(rng, 0.150), phases={"data_wait": 0.5, "forward": 0.2,
                                                "backward": 0.25, "other": 0.05},
                    findings=[{**slow_data, "ceiling_speedup": 3.0},
                              {"id": "host_sync", "severity": "medium", "title": "syncs",
                               "ceiling_speedup": None}],
                    host={"main_cpu_cores": 0.5})
    c = compare_reports(before, after, before_source="a", after_source="b")
    assert c.verdict.verdict == REGRESSION
    assert c.verdict.step_time_delta_pct == pytest.approx(50, abs=3)
    assert c.verdict.throughput_delta_pct == pytest.approx(-33.3, abs=2)
    by = {p.phase: p for p in c.phases}
    assert by["data_wait"].delta_ms == pytest.approx(0.5 * 150 - 0.2 * 100, rel=0.05)
    assert {(f.id, f.change) for f in c.findings} == {
        ("data_starvation", "changed"), ("host_sync", "appeared"), ("small_batch", "vanished")}
    assert [(m.name, m.delta_fraction) for m in c.metrics] == [("host.main_cpu_cores", -0.5)]
    assert c.differences == []
    doc = to_dict(c)
    assert doc["schema"] == "redline.compare/1"
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc


def test_differences_are_stated_and_an_old_report_gets_the_weaker_test() -> None:
    rng = random.Random(2)
    before = _report(_times(rng, 0.100), batch=32)
    after = _report(_times(rng, 0.100), batch=64, device="cuda")
    old = copy.deepcopy(before)
    old["schema"] = "redline.report/1"
    del old["measurements"]["timing"]["step_times_s"]
    c = compare_reports(old, after, before_source="old", after_source="new")
    fields = {d.field for d in c.differences}
    assert {"schema", "device", "device_name", "batch_size"} <= fields
    assert "command" not in fields  # neither names one
    old["command"], after["command"] = ["python", "a.py"], ["python", "b.py"]
    old["measurements"]["config"]["batch_size"] = None
    rows = {d.field: d for d in compare_reports(old, after, before_source="old",
                                                after_source="new").differences}
    assert (rows["command"].before, rows["command"].after) == ("python a.py", "python b.py")
    assert rows["batch_size"].consequence.startswith("the batch is unknown on one side")
    old["measurements"]["config"]["batch_size"] = 32
    assert c.verdict.test is not None and c.verdict.test.method == "summary"
    assert c.verdict.test.metric == "time_per_sample"
    # twice the samples in the same step time: half the time per sample
    assert c.verdict.verdict == IMPROVEMENT
    assert any("p50 and p95" in n for n in c.notes)
    del old["measurements"]["timing"]["step_time_p95_s"]
    assert compare_reports(old, after, before_source="old",
                           after_source="new").verdict.verdict == UNKNOWN


def test_the_timeline_stands_in_for_missing_step_times() -> None:
    rng = random.Random(4)
    before = _report(_times(rng, 0.100))
    times = before["measurements"]["timing"].pop("step_times_s")
    before["timeline"] = {"steps": [[i, 0.0, t, "measured", 32, []] for i, t in
                                    enumerate(times)] + [[999, 0.0, 9.0, "warmup", 32, []]]}
    c = compare_reports(before, _report(_times(rng, 0.100)), before_source="a",
                        after_source="b")
    assert c.verdict.test is not None and c.verdict.test.before_steps == 100
    assert c.verdict.verdict == NO_CHANGE


# ---- a plan and a report ----------------------------------------------------------------

def _plan(step_s: float, global_batch: int = 32) -> dict[str, Any]:
    return {"schema": "redline.parallel-plan/1",
            "training": {"global_batch": global_batch, "precision": "fp32"},
            "cluster": {"gpus": 1, "gpu_name": "cpu"},
            "chosen": {"dp": 1, "time": {"step_s": step_s, "compute_s": step_s * 0.9,
                                         "dp_exposed_s": 0.0, "pp_exposed_s": 0.0,
                                         "tp_comm_s": 0.0, "offload_s": 0.0}}}


def test_plan_schema_is_the_planners() -> None:
    from redline.compare.shape import PLAN_SCHEMA_READ
    from redline.report.plan_render import PLAN_SCHEMA

    assert PLAN_SCHEMA == PLAN_SCHEMA_READ


def test_a_run_slower_than_its_plan_is_a_regression() -> None:
    rng = random.Random(5)
    report = _report(_times(rng, 0.150))
    c = compare_plan(_plan(0.100), report, plan_source="p", report_source="r")
    assert c.verdict.verdict == REGRESSION
    assert c.verdict.test is not None and c.verdict.test.method == "projection"
    assert c.verdict.test.difference_fraction == pytest.approx(0.5, abs=0.03)
    rows = {p.phase: p for p in c.phases}
    assert rows["not modelled by the plan (data wait, copies, other)"].after_ms == \
        pytest.approx(0.3 * 150, rel=0.05)
    assert compare_plan(_plan(0.150), report, plan_source="p",
                        report_source="r").verdict.verdict == NO_CHANGE
    # the run's batch is half the plan's: judged per sample, and said
    c = compare_plan(_plan(0.150, global_batch=64), report, plan_source="p",
                     report_source="r")
    assert c.verdict.test is not None and c.verdict.test.metric == "time_per_sample"
    assert c.verdict.verdict == REGRESSION
    assert "samples_per_step" in {d.field for d in c.differences}


# ---- inputs -----------------------------------------------------------------------------

def test_inputs_are_recognised_and_refused_with_what_they_are(tmp_path: Path) -> None:
    rng = random.Random(6)
    a, b, plan = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "plan.json"
    a.write_text(json.dumps(_report(_times(rng, 0.1))))
    b.write_text(json.dumps(_report(_times(rng, 0.1))))
    plan.write_text(json.dumps(_plan(0.1)))
    assert compare_paths(str(a), str(b)).kind == "reports"
    assert compare_paths(str(plan), str(b)).kind == "plan_vs_report"
    reversed_ = compare_paths(str(b), str(plan))
    assert reversed_.kind == "plan_vs_report" and reversed_.before_source == str(plan)
    trace = write_trace(tmp_path / "rank0.json.gz")
    with pytest.raises(CompareInputError, match=r"cannot compare a report .* with a trace"):
        compare_paths(str(a), str(trace))
    analysis = tmp_path / "t.json"
    analysis.write_text(json.dumps({"schema": "redline.trace/1", "ranks": []}))
    with pytest.raises(CompareInputError, match="compare the trace files themselves"):
        compare_paths(str(analysis), str(analysis))
    other = tmp_path / "o.json"
    other.write_text(json.dumps({"loss": 1.0}))
    with pytest.raises(CompareInputError, match=r"keys \['loss'\]; expected two doctor reports"):
        compare_paths(str(other), str(b))
    with pytest.raises(CompareInputError, match="cannot read it"):
        compare_paths(str(tmp_path / "missing.json"), str(b))
    with pytest.raises(CompareInputError, match="`min_effect_fraction` must be"):
        compare_paths(str(a), str(b), min_effect_fraction=1.5)


# ---- traces -----------------------------------------------------------------------------

def test_synthetic_traces_kernels_added_removed_and_slower(tmp_path: Path) -> None:
    before = write_trace(tmp_path / "before.json.gz")
    events = synthetic_events()
    for e in events:
        if e.get("name") == "sm90_xmma_gemm_f32f32" and e["cat"] == "kernel":
            e["dur"] *= 2  # each 20 µs GEMM (10 µs in the dropped step) takes twice as long
        if e.get("name") == "void at::native::vectorized_elementwise_kernel":
            e["name"] = "triton_fused_elementwise"
    after = write_trace(tmp_path / "after.json.gz", events)
    c = compare_paths(str(before), str(after))
    assert c.kind == "traces" and c.per == "step"
    by = {k.name: k for k in c.kernels}
    gemm = by["sm90_xmma_gemm_f32f32"]
    # two GEMMs of 20 µs kept in 2 analysed steps (the third step is dropped): 20 µs per step
    assert (gemm.change, gemm.before_us, gemm.after_us) == ("slower", 20.0, 40.0)
    assert gemm.before_count == gemm.after_count == 1.0
    assert by["triton_fused_elementwise"].change == "added"
    assert by["void at::native::vectorized_elementwise_kernel"].change == "removed"
    assert by["ncclDevKernel_AllReduce_Sum_f32_RING_LL"].change == "unchanged"
    assert c.kernels[0].name == "sm90_xmma_gemm_f32f32"  # largest |Δ| first
    assert [o.name for o in c.operators] == ["aten::mm"]
    # the profiler steps are 100 µs on both sides: nothing to call a change
    assert c.verdict.verdict == NO_CHANGE


def _rewrite(src: Path, dst: Path, edit: Any) -> Path:
    doc = json.loads(gzip.decompress(src.read_bytes()))
    edit(doc["traceEvents"])
    dst.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return dst


@needs_shared
def test_a_real_trace_against_itself_and_a_changed_copy(tmp_path: Path) -> None:
    same = compare_paths(str(NS_TRACE), str(NS_TRACE))
    assert same.verdict.verdict == NO_CHANGE
    assert same.verdict.test is not None and same.verdict.test.difference_s == 0.0
    assert {k.change for k in same.kernels} == {"unchanged"}
    assert {o.change for o in same.operators} == {"unchanged"}
    assert same.differences == []
    gemm = "volta_sgemm_64x64_nt"

    def edit(events: list[dict[str, Any]]) -> None:
        for e in events:
            if e.get("cat") == "kernel" and e.get("name") == gemm:
                e["dur"] = e["dur"] * 3
            if e.get("cat") == "cpu_op" and e.get("name") == "aten::batch_norm":
                e["name"] = "aten::layer_norm"

    changed = compare_paths(str(NS_TRACE), str(_rewrite(NS_TRACE, tmp_path / "c.json.gz", edit)))
    by = {k.name: k for k in changed.kernels}
    assert by[gemm].change == "slower"
    assert by[gemm].after_us == pytest.approx(3 * by[gemm].before_us, rel=1e-4)  # float µs
    assert changed.kernels[0].name == gemm
    assert {k.change for k in changed.kernels if k.name != gemm} == {"unchanged"}
    ops = {o.name: o.change for o in changed.operators}
    assert ops["aten::batch_norm"] == "removed" and ops["aten::layer_norm"] == "added"


@needs_shared
def test_two_real_jobs_on_different_gpus() -> None:
    c = compare_paths(str(NS_TRACE), str(NCCL_TRACE))
    fields = {d.field: (d.before, d.after) for d in c.differences}
    assert fields["device_name"] == ("Tesla V100-SXM2-32GB", "NVIDIA A100-PG509-200")
    assert fields["profiler_steps"] == ("4", "2")
    # one trace file each, but the second is rank 0 of a 2-rank job (its distributedInfo)
    assert fields["world_size"] == ("1", "2")
    assert "ranks_given" not in fields
    assert any("1 of the job's 2 ranks" in n and n.startswith("after") for n in c.notes)
    by = {k.name: k for k in c.kernels}
    assert any(k.change == "added" and k.name.startswith("ncclKernel_AllReduce")
               for k in c.kernels)
    assert by["volta_sgemm_64x64_nt"].change == "removed"
    metrics = {m.name: m for m in c.metrics}
    assert metrics["comm_comp_overlap_pct"].before is None
    assert metrics["comm_comp_overlap_pct"].after is not None


# ---- inputs a comparison refuses, and differences it states -----------------------------

def test_a_report_or_plan_of_a_newer_schema_is_refused_with_what_to_do(tmp_path: Path) -> None:
    rng = random.Random(8)
    good, newer = tmp_path / "good.json", tmp_path / "newer.json"
    good.write_text(json.dumps(_report(_times(rng, 0.1))))
    version = int(SCHEMA_VERSION.rsplit("/", 1)[1])
    newer.write_text(json.dumps({**_report(_times(rng, 0.1)),
                                 "schema": f"redline.report/{version + 1}"}))
    with pytest.raises(CompareInputError, match=(
            rf"newer\.json: a report of schema 'redline\.report/{version + 1}', newer than "
            rf"this redline reads \(up to '{SCHEMA_VERSION}'\).*upgrade redline")):
        compare_paths(str(good), str(newer))
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({**_report(_times(rng, 0.1)), "schema": "redline.report/two"}))
    with pytest.raises(CompareInputError, match=r"odd\.json: .*schema 'redline\.report/two'"):
        compare_paths(str(odd), str(good))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({**_plan(0.1), "schema": "redline.parallel-plan/2"}))
    with pytest.raises(CompareInputError, match=r"plan\.json: a plan of schema "
                       r"'redline\.parallel-plan/2', newer than"):
        compare_paths(str(plan), str(good))
    # the public functions check the documents they are given, not only compare_paths
    with pytest.raises(CompareInputError, match="newer than this redline reads"):
        compare_reports(json.loads(good.read_text()), json.loads(newer.read_text()),
                        before_source="a", after_source="b")


def test_a_report_cut_short_is_named_as_one(tmp_path: Path) -> None:
    rng = random.Random(9)
    good, cut = tmp_path / "good.json", tmp_path / "cut.json"
    text = json.dumps(_report(_times(rng, 0.1)), indent=1)
    good.write_text(text)
    cut.write_text(text[:len(text) // 2])
    with pytest.raises(CompareInputError, match=(
            rf"cut\.json: a redline report \(schema '{SCHEMA_VERSION}'\) that ends early: "
            rf"not valid JSON at character {len(text) // 2:,} of {len(text) // 2:,} "
            r"\(cut short\?.*write it again")):
        compare_paths(str(cut), str(good))


def _edit(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    at: Any = out
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    return out


@pytest.mark.parametrize(("path", "value", "field"), [
    (("measurements", "timing"), "fast", "measurements.timing"),
    (("measurements", "timing", "step_times_s"), [0.1, float("nan"), 0.1],
     r"measurements.timing.step_times_s\[1\]"),
    (("measurements", "timing", "step_times_s"), [0.1, -0.1, 0.1],
     r"measurements.timing.step_times_s\[1\]"),
    (("measurements", "timing", "step_time_mean_s"), float("inf"),
     "measurements.timing.step_time_mean_s"),
    (("measurements", "breakdown"), 3, "measurements.breakdown"),
    (("measurements", "breakdown", 0, "phase"), ["data_wait"], r"measurements.breakdown\[0\].phase"),
    (("findings",), True, "findings"),
    (("findings", 0, "id"), {"x": 1}, r"findings\[0\].id"),
    (("ranks",), {"world_size": "2"}, "ranks.world_size"),
    (("measurements", "config"), [1], "measurements.config"),
])
def test_an_edited_report_is_refused_with_its_file_and_field(
        path: tuple[str | int, ...], value: Any, field: str) -> None:
    rng = random.Random(10)
    good = _report(_times(rng, 0.1), findings=[{"id": "small_batch", "severity": "low",
                                               "title": "small", "ceiling_speedup": 1.2}])
    bad = _edit(good, path, value)
    with pytest.raises(CompareInputError, match=rf"edited\.json: `{field}` is .*; expected "):
        compare_reports(good, bad, before_source="good.json", after_source="edited.json")
    with pytest.raises(CompareInputError, match=rf"edited\.json: `{field}` is "):
        compare_plan(_plan(0.1), bad, plan_source="plan.json", report_source="edited.json")


@pytest.mark.parametrize(("path", "value", "field"), [
    (("chosen",), "dp=1", "chosen"),
    (("chosen", "time", "step_s"), float("nan"), "chosen.time.step_s"),
    (("training", "precision"), 16, "training.precision"),
    (("cluster", "gpus"), 1.5, "cluster.gpus"),
])
def test_an_edited_plan_is_refused_with_its_file_and_field(
        path: tuple[str, ...], value: Any, field: str) -> None:
    report = _report(_times(random.Random(11), 0.1))
    with pytest.raises(CompareInputError, match=rf"plan\.json: `{field}` is .*; expected "):
        compare_plan(_edit(_plan(0.1), path, value), report, plan_source="plan.json",
                     report_source="r.json")


def test_the_cli_says_what_was_wrong_and_exits_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    rng = random.Random(12)
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(_report(_times(rng, 0.1))))
    bad.write_text(json.dumps(_edit(_report(_times(rng, 0.1)),
                                    ("measurements", "breakdown"), "none")))
    p = subprocess.run([sys.executable, "-m", "redline.cli.main", "compare", str(good),
                        str(bad)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"redline compare: error: {bad}: `measurements.breakdown` is "
                               "a JSON string")
    assert "Traceback" not in p.stderr


def test_world_size_and_noise_in_host_metrics() -> None:
    rng = random.Random(13)
    before = _report(_times(rng, 0.1), host={"other_processes_cpu_cores": 1.2e-13,
                                              "main_thread_run_delay_fraction": 0.0001,
                                              "data_fetch_cpu_fraction": 0.05})
    after = _report(_times(rng, 0.1), host={"other_processes_cpu_cores": 0.0,
                                             "main_thread_run_delay_fraction": 0.0,
                                             "data_fetch_cpu_fraction": 0.30})
    after["ranks"] = {"world_size": 2, "missing": [], "entries": []}
    c = compare_reports(before, after, before_source="a", after_source="b")
    assert {d.field: (d.before, d.after) for d in c.differences} == {"world_size": ("1", "2")}
    # a millionth of a core and a hundredth of a point are no change; 5 % → 30 % is
    assert [(m.name, m.before, m.after) for m in c.metrics] == [
        ("host.data_fetch_cpu_fraction", 0.05, 0.30)]


def test_traces_of_more_ranks_are_said(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    write_trace(one / "rank0.json.gz")
    for rank in (0, 1):
        write_trace(two / f"rank{rank}.json.gz", synthetic_events(offset=rank * 3.0), rank=rank)
    c = compare_paths(str(one), str(two))
    fields = {d.field: (d.before, d.after) for d in c.differences}
    # the fixture's traces all declare a world size of 1
    assert fields == {"ranks_given": ("1", "2")}


def test_the_cli_writes_the_json_and_the_html_page(tmp_path: Path) -> None:
    """`--json` and `--html` as for the other commands: the page carries the JSON document, an
    output that would replace an input is refused before anything is compared."""
    import subprocess
    import sys

    from html_docs import embedded

    before = write_trace(tmp_path / "before.json.gz")
    events = synthetic_events()
    for e in events:
        if e.get("name") == "sm90_xmma_gemm_f32f32" and e["cat"] == "kernel":
            e["dur"] *= 2
    after = write_trace(tmp_path / "after.json.gz", events)
    out, page = tmp_path / "c.json", tmp_path / "c.html"

    def compare(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "redline.cli.main", "compare",
                               str(before), str(after), *argv],
                              capture_output=True, text=True, timeout=120)

    p = compare("--json", str(out), "--html", str(page))
    assert p.returncode == 0, p.stderr
    assert f"HTML report written to {page}" in p.stdout
    doc = json.loads(out.read_text())
    assert doc["schema"] == "redline.compare/1" and doc["kind"] == "traces"
    assert embedded(page.read_text(), "redline-data") == [doc]
    assert "<h2>Verdict: no significant change</h2>" in page.read_text()
    p = compare("--html", str(after))
    assert p.returncode == 2 and "an input to compare" in p.stderr
    assert after.read_bytes()[:2] == b"\x1f\x8b"  # still the trace
