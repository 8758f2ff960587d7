"""`redline doctor` on unmodified scripts of the frameworks users train with — Lightning's
Trainer, Hugging Face's Trainer, a loop under Accelerate (the real libraries, on CPU, tiny
models built in code, nothing downloaded): the optimizer steps it counts are the script's own,
with gradient accumulation, bf16-mixed and a worker, and with two optimizers stepped by hand
per iteration (which count once, as on a plain loop)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from html_docs import embedded

SCRIPTS = Path(__file__).parent / "scripts" / "frameworks"
pytestmark = pytest.mark.slow


def _doctor(tmp_path: Path, *script: str) -> tuple[dict, int]:
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "redline.cli.main", "doctor", "--json", str(out),
                        "--", "python", *script], cwd=SCRIPTS, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("SCRIPT optimizer steps: "))
    return json.loads(out.read_text()), int(line.rsplit(" ", 1)[1])


def test_lightning_with_accumulation_bf16_mixed_and_a_worker(tmp_path: Path) -> None:
    rep, own = _doctor(tmp_path, "lightning_train.py")
    t = rep["measurements"]["timing"]
    assert (t["step_source"], t["steps_total"]) == ("optimizer", own) and own == 12
    assert t["samples_per_step"] == 16  # batch 8 × accumulate_grad_batches 2
    assert rep["measurements"]["config"]["loader"]["num_workers"] == 1


def test_lightning_manual_optimization_with_two_optimizers(tmp_path: Path) -> None:
    rep, own = _doctor(tmp_path, "lightning_train.py", "--manual")
    t = rep["measurements"]["timing"]
    # Lightning's global_step counts each optimizer's step (12); iterations are 6.
    assert t["steps_total"] == own == 6 and t["samples_per_step"] == 8


def test_hugging_face_trainer_with_accumulation(tmp_path: Path) -> None:
    rep, own = _doctor(tmp_path, "hf_train.py", str(tmp_path / "hf-out"))
    t = rep["measurements"]["timing"]
    assert t["steps_total"] == own == 12
    assert t["samples_per_step"] == 8  # per_device_train_batch_size 4 × accumulation 2


def test_accelerate_loop_with_accumulate(tmp_path: Path) -> None:
    rep, own = _doctor(tmp_path, "accelerate_train.py")
    t = rep["measurements"]["timing"]
    assert t["steps_total"] == own == 12  # optimizer.step() called 24 times, 12 real steps
    # Accelerate's loader fetches one batch ahead (to know the last one), so the measured
    # window's first step has one batch of 8 fetched before the window began.
    assert 15 <= t["samples_per_step"] <= 16


# -- callbacks ------------------------------------------------------------------------------

def _script(tmp_path: Path, script: str, *args: str, launcher: list[str] | None = None,
            ) -> tuple[dict, int, str]:
    """Run a framework script that reports through redline's callback into tmp_path."""
    cmd = [*(launcher or [sys.executable]), script, str(tmp_path), *args]
    p = subprocess.run(cmd, cwd=SCRIPTS, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    # Gloo's teardown can abort a process after its work is done (see rank_scripts.run_ranks):
    # tolerated only once the report was written.
    teardown_abort = ((tmp_path / "report.json").exists()
                      and "terminate called without an active exception" in p.stderr)
    assert p.returncode == 0 or teardown_abort, p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("SCRIPT optimizer steps: "))
    return json.loads((tmp_path / "report.json").read_text()), int(line.rsplit(" ", 1)[1]), p.stdout


def test_lightning_callback_steps_loggers_and_report(tmp_path: Path) -> None:
    rep, own, out = _script(tmp_path, "lightning_callback.py")
    assert "redline · completed" in out  # printed at the end of fit
    t = rep["measurements"]["timing"]
    assert (t["step_source"], t["steps_total"], own) == ("manual", 12, 12)
    assert t["samples_per_step"] == 16  # batch 8 × accumulate_grad_batches 2
    # The validation loader (batch 4) ran first in no step; the report is the training one's.
    assert rep["measurements"]["config"]["batch_size"] == 8
    # Each validation takes 0.4 s of sleep: left out of the steps, none comes near it.
    assert t["step_time_p95_s"] < 0.2 and t["steps_measured"] == 10
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    live = [r for r in rows if r["redline/step_time_ms"]]
    # Lightning flushes every log_every_n_steps=2 steps: steps measured 2, 4, ... 10.
    assert [float(r["redline/steps_measured"]) for r in live] == [2, 4, 6, 8, 10]
    assert all(float(r["redline/step_time_ms"]) > 0 and 0 <= float(r["redline/data_wait_share"])
               <= 1 for r in live)
    end = next(r for r in rows if r["redline/findings"])
    assert float(end["redline/findings"]) == len(rep["findings"])
    assert float(end["redline/run_step_time_ms"]) == pytest.approx(t["step_time_mean_s"] * 1e3)
    share = next(p["fraction"] for p in rep["measurements"]["breakdown"] if p["phase"] == "data_wait")
    assert float(end["redline/run_data_wait_share"]) == pytest.approx(share)
    assert embedded((tmp_path / "report.html").read_text(), "redline-data") == [rep]


def test_lightning_callback_under_the_ddp_strategy_merges_the_ranks(tmp_path: Path) -> None:
    rep, own, _ = _script(tmp_path, "lightning_callback.py", "--ddp", launcher=[
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"])
    assert rep["measurements"]["timing"]["steps_total"] == own == 12
    assert [(r["rank"], r["steps_measured"]) for r in rep["ranks"]["ranks"]] == [(0, 10), (1, 10)]
    # one page, rank 0's merged report
    assert embedded((tmp_path / "report.html").read_text(), "redline-data") == [rep]


def test_hf_callback_steps_loggers_and_report(tmp_path: Path) -> None:
    rep, own, out = _script(tmp_path, "hf_callback.py")
    assert "redline · completed" in out
    t = rep["measurements"]["timing"]
    assert (t["steps_total"], own, t["samples_per_step"]) == (12, 12, 8)
    assert embedded((tmp_path / "report.html").read_text(), "redline-data") == [rep]
    assert t["step_time_p95_s"] < 0.3  # the 0.4 s evaluations are not steps
    logged = json.loads((tmp_path / "logged.json").read_text())
    seen = logged["logger"]  # a callback registered before redline's, as report_to's are
    live = [r for r in seen if "redline/step_time_ms" in r]
    assert [r["redline/steps_measured"] for r in live] == [2, 4, 6, 8, 10]
    assert sum("loss" in r for r in seen) == 6  # the Trainer's own logging is untouched
    end = next(r for r in seen if "redline/findings" in r)
    assert end["redline/findings"] == len(rep["findings"])
    assert end["redline/run_step_time_ms"] == pytest.approx(t["step_time_mean_s"] * 1e3)
    assert {**end, "step": 12} in logged["log_history"]


def test_hf_callback_under_torchrun_merges_the_ranks(tmp_path: Path) -> None:
    rep, own, _ = _script(tmp_path, "hf_callback.py", launcher=[
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"])
    assert rep["measurements"]["timing"]["steps_total"] == own == 12
    assert [(r["rank"], r["steps_measured"]) for r in rep["ranks"]["ranks"]] == [(0, 10), (1, 10)]
    # one page, rank 0's merged report
    assert embedded((tmp_path / "report.html").read_text(), "redline-data") == [rep]


@pytest.mark.parametrize(("module", "extra", "hidden"), [
    ("redline.integrations.lightning", "lightning", ["lightning", "pytorch_lightning"]),
    ("redline.integrations.hf", "hf", ["transformers"]),
])
def test_a_missing_framework_says_how_to_install_it(module: str, extra: str,
                                                    hidden: list[str]) -> None:
    code = (f"import sys; sys.modules.update(dict.fromkeys({hidden!r}))\n"
            f"try:\n    import {module}\nexcept ImportError as e:\n"
            "    from redline import RedlineError; print(isinstance(e, RedlineError), e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("True ") and f"pip install 'redline[{extra}]'" in p.stdout


# -- plans in the frameworks' words ---------------------------------------------------------

EFFECTIVE = {"fp32": "fp32", "bf16": "bf16-autocast", "fp16": "fp16-autocast", "tf32": "tf32"}
"""A plan's precision as the watch reports the step that ran in it."""


def _tune(tmp_path: Path, script: str, framework: str) -> dict:
    plan = tmp_path / "plan.json"
    p = subprocess.run([sys.executable, "-m", "redline.cli.main", "tune", script, "--steps",
                        "2", "--rounds", "1", "--no-compile", "--fresh", "--plan", str(plan),
                        "--settings-for", framework],
                       cwd=SCRIPTS, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "REDLINE_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode == 0, p.stderr[-3000:]
    what = "L.Trainer(" if framework == "lightning" else "TrainingArguments("
    assert f"as {framework} settings:" in p.stdout and what in p.stdout
    assert ("precision=" if framework == "lightning" else "bf16=") in p.stdout
    return json.loads(plan.read_text())


def _apply(tmp_path: Path, script: str, plan: dict, name: str) -> dict:
    out = tmp_path / name
    out.mkdir()
    (out / "plan.json").write_text(json.dumps(plan))
    p = subprocess.run([sys.executable, script, str(out / "plan.json"), str(out)], cwd=SCRIPTS,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads((out / "report.json").read_text())["measurements"]


@pytest.mark.parametrize(("script", "framework", "micro"), [
    ("lightning_tune.py", "lightning", 4), ("hf_tune.py", "hf", 2)])
def test_tuned_plans_applied_through_the_framework_settings(tmp_path: Path, script: str,
                                                           framework: str, micro: int) -> None:
    """`redline tune` on the framework's own objects (lightning_setup / hf_setup), then the
    plan, exported as Trainer / TrainingArguments settings and applied by the framework,
    trains at the plan's effective batch and precision; and so does a plan that changes
    both the micro-batch (accumulation) and the precision (bf16)."""
    plan = _tune(tmp_path, script, framework)
    m = _apply(tmp_path, script, plan, "tuned")
    assert m["timing"]["samples_per_step"] == plan["effective_batch"]
    assert m["precision"]["effective"] == EFFECTIVE[plan["precision"]]
    bf16 = {**plan, "precision": "bf16", "micro_batch": micro}
    m = _apply(tmp_path, script, bf16, "bf16")
    assert m["timing"]["samples_per_step"] == plan["effective_batch"]
    # micro-batches of `micro` samples: effective ÷ micro backward passes per optimizer step
    per_step = plan["effective_batch"] // micro
    assert m["counts"]["backward"] == m["timing"]["steps_total"] * per_step
    assert m["precision"]["effective"] == "bf16-autocast"


# -- the same findings as on a plain loop ---------------------------------------------------

def _starved(tmp_path: Path, mode: str) -> dict:
    out = tmp_path / f"{mode}.json"
    p = subprocess.run([sys.executable, "-m", "redline.cli.main", "doctor", "--steps", "20",
                        "--json", str(out), "--", "python", "starved.py", mode], cwd=SCRIPTS,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def plain_starved(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _starved(tmp_path_factory.mktemp("plain"), "plain")


@pytest.mark.parametrize("mode", ["lightning", "hf", "accelerate"])
def test_a_starved_framework_run_gets_the_plain_loops_findings(
        tmp_path: Path, plain_starved: dict, mode: str) -> None:
    """The same dataset (~12 ms of CPU per batch, no workers) and model: the framework adds
    its own overhead to each step, but the diagnosis — its findings, in the same order — and
    the data wait per step are the plain loop's. A finding the plain loop has not is allowed
    only as that overhead itself: host work the report names as the framework's own (where the
    step is short, the framework's fixed per-step cost can pass the host-code bar)."""
    rep = _starved(tmp_path, mode)
    plain = [f["id"] for f in plain_starved["findings"]]
    ids = [f["id"] for f in rep["findings"]]
    extra = [f for f in rep["findings"] if f["id"] not in plain]
    for f in extra:
        assert f["id"] == "host_work_in_loop" and f["evidence"].get("framework"), f
    assert [i for i in ids if i in plain] == plain
    assert ids[:2] == ["data_starvation", "cpu_preprocessing"]

    def wait(r: dict) -> float:
        return next(p["mean_s"] for p in r["measurements"]["breakdown"]
                    if p["phase"] == "data_wait")

    assert wait(rep) == pytest.approx(wait(plain_starved), rel=0.3)
