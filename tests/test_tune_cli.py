"""`redline tune` end to end on a tiny script: plan, table, reuse, and bad input."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from redline.tune import apply_plan, load_plan
from redline.tune.tuned import TunePlanMismatchError

SCRIPT = Path(__file__).parent / "scripts" / "tune_tiny.py"


def _run(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REDLINE_CACHE_DIR": str(tmp / "cache"), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "redline.cli.main", "tune", *args],
                          capture_output=True, text=True, timeout=600, cwd=tmp, env=env)


@pytest.fixture()
def script(tmp_path: Path) -> Path:
    p = tmp_path / "train.py"
    shutil.copy(SCRIPT, p)
    return p


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.mark.slow
def test_tune_writes_plan_table_and_reuses_it(tmp_path: Path, script: Path) -> None:
    before = _digest(script)
    r = _run(tmp_path, str(script), "--steps", "3", "--rounds", "1", "--no-compile",
             "--price-per-hour", "2.5", "--json", "out.json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert _digest(script) == before  # the user's file is never modified
    assert "before → after" in r.stdout and "throughput" in r.stdout
    plan = load_plan(tmp_path / "redline-plan.json")
    # The budget (2 MB simulated) bounds the micro-batch; the effective batch stays 4 × 8.
    assert plan.effective_batch == 32
    assert 1 <= plan.micro_batch <= 32
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["schema"] == "redline.tune/1"
    search = out["batch_search"]
    assert search["limit_bytes"] == 2_000_000
    assert search["trials"] <= 4 and search["ooms"] == 0
    steps = [d["step"] for d in out["plan"]["decisions"]]
    assert steps[0] == "data pipeline" and "batch size" in steps
    assert any(s.startswith("precision") for s in steps)
    assert out["before_projection"]["cost"] is not None  # a price was given
    assert out["before"]["energy_source"].startswith("unknown")  # no RAPL/NVML here
    # Second run: the remembered plan is reused (same model, device, inputs).
    r2 = _run(tmp_path, str(script), "--steps", "2", "--rounds", "1", "--no-compile")
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "reusing the remembered plan" in r2.stdout


@pytest.mark.slow
def test_the_effective_batch_changes_only_when_allowed_and_is_said(tmp_path: Path,
                                                                    script: Path) -> None:
    r = _run(tmp_path, str(script), "--steps", "2", "--rounds", "1", "--no-compile",
             "--allow-batch-change", "--json", "out.json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())["plan"]
    (d,) = [d for d in out["decisions"] if d["knob"] == "effective batch"]
    # AdamW: the square-root rule; the guard's verdict travels with the decision
    assert d["details"]["lr_rule"] == "sqrt" and "of the user's progress" in d["details"]["guard"]
    # a tiny model on a CPU: a batch several times larger runs several times the samples/s
    assert d["kept"], d["reason"]
    assert out["user_effective_batch"] == 32 and out["effective_batch"] > 32
    assert out["lr_scale"] == pytest.approx((out["effective_batch"] / 32) ** 0.5)
    assert "note: The optimization changed: effective batch 32 →" in r.stdout
    # A remembered plan that changed the batch is not reused without the flag
    r2 = _run(tmp_path, str(script), "--steps", "2", "--rounds", "1", "--no-compile")
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert load_plan(tmp_path / "redline-plan.json").effective_batch == 32
    assert "--allow-batch-change was not given; searching again" in r2.stdout


def test_plan_from_another_model_is_refused(tmp_path: Path) -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import tune_tiny  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    from redline.tune.knobs import TunePlan
    from redline.tune.plan_store import save_plan
    from redline.tune.tuned import plan_key

    s = tune_tiny.redline_setup()
    first = next(iter(s.loader))
    plan = TunePlan(key=plan_key(s.model, torch.device("cpu"), "fp32", first),
                    effective_batch=32, micro_batch=16)
    save_plan(plan, tmp_path / "p.json")
    loaded = load_plan(tmp_path / "p.json")
    assert loaded == plan
    with apply_plan(loaded, s.model, s.optimizer, s.loader, s.loss_fn) as tuned:
        loss = tuned.step(next(iter(tuned.loader)))
        assert torch.isfinite(loss)
    other = tune_tiny.redline_setup(width=32)
    with pytest.raises(TunePlanMismatchError, match="model_signature"):
        apply_plan(loaded, other.model, other.optimizer, other.loader, other.loss_fn)


@pytest.mark.parametrize("factory,message", [
    ("raising_setup", "raised FileNotFoundError: /data/train.tar is missing"),
    ("wrong_type_setup", "returned dict, expected redline.tune.TrainSetup"),
    ("no_such_setup", "defines no function no_such_setup()"),
    ("huge_setup", "does not fit at micro-batch 1"),
    ("nan_setup", "in fp32 already"),
])
def test_bad_input_gives_a_clear_error(tmp_path: Path, script: Path, factory: str,
                                       message: str) -> None:
    before = _digest(script)
    r = _run(tmp_path, str(script), "--factory", factory, "--steps", "2", "--rounds", "1",
             "--no-compile")
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    if factory == "no_such_setup":  # the library's `name` shown as this command's flag
        assert "pick one with --factory" in r.stderr
    if factory == "huge_setup":  # what `redline plan` needs, filled in
        assert f"redline plan {script} --gpus N --gpu GPU --global-batch 32 (or --params " \
               f"{512 * 16 + 512 + 2 * 512 + 512 * 4 + 4} " in r.stderr
    assert not (tmp_path / "redline-plan.json").exists()  # nothing half-written
    assert _digest(script) == before


def test_missing_script_and_self_overwrite(tmp_path: Path, script: Path) -> None:
    r = _run(tmp_path, str(tmp_path / "nope.py"))
    assert r.returncode == 2 and "no such script" in r.stderr
    r = _run(tmp_path, str(script), "--plan", str(script))
    assert r.returncode == 2 and "is the script to tune" in r.stderr
