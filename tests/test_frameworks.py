"""`redline doctor` on unmodified scripts of the frameworks users train with — Lightning's
Trainer, Hugging Face's Trainer, a loop under Accelerate (the real libraries, on CPU, tiny
models built in code, nothing downloaded): the optimizer steps it counts are the script's own,
with gradient accumulation, bf16-mixed and a worker, and with two optimizers stepped by hand
per iteration (which count once, as on a plain loop)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
