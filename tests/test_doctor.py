"""`redline doctor` end to end, in subprocesses as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from redline.report.json_io import schema

HERE = Path(__file__).parent
SCRIPTS = HERE / "scripts"
pytestmark = pytest.mark.slow


def doctor(*args: str, cwd: Path = SCRIPTS, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "redline.cli.main", "doctor", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "120"})


def load(path: Path) -> dict:
    data = json.loads(path.read_text())
    jsonschema.validate(data, schema())
    return data


def test_runs_unmodified_script_with_its_args_and_output(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = doctor("--steps", "100", "--warmup", "2", "--json", str(out), "--",
               "python", "train_ok.py", "--epochs", "2")
    assert p.returncode == 0, p.stderr
    assert "argv=['--epochs', '2'] name=__main__" in p.stdout
    assert "trained 32 steps" in p.stdout  # ran to its own end: fewer steps than --steps
    data = load(out)
    assert data["status"] == "completed"
    t = data["measurements"]["timing"]
    assert t["steps_total"] == 32 and t["steps_warmup"] == 2 and t["steps_excluded"] == 1
    assert t["steps_measured"] == 29
    assert data["measurements"]["config"]["batch_size"] == 16
    assert "Where each step's time goes" in p.stderr


def test_the_script_sees_the_file_and_argv_python_gives_it(tmp_path: Path) -> None:
    """``__file__`` is absolute, as Python 3.9+ makes it, so a script that changes directory
    still finds the files beside it (``sys.argv[0]`` is absolute too: runpy sets it to the
    path it runs)."""
    (tmp_path / "cfg.txt").write_text("beside the script\n")
    (tmp_path / "train.py").write_text(
        "import os, sys\nfrom pathlib import Path\nhere = Path(__file__).parent\n"
        "os.chdir('/')\nprint('file', __file__, 'argv0', sys.argv[0])\n"
        "print((here / 'cfg.txt').read_text().strip())\n")
    bare = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    p = doctor("--no-flops", "--", "python", "train.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert bare.stdout.startswith(f"file {tmp_path / 'train.py'} argv0 train.py\n")
    assert p.stdout == bare.stdout.replace("argv0 train.py", f"argv0 {tmp_path / 'train.py'}")
    assert "beside the script" in p.stdout


def test_exit_code_is_preserved(tmp_path: Path) -> None:
    p = doctor("--json", str(tmp_path / "r.json"), "--", "python", "train_ok.py",
               "--epochs", "1", "--exit-code", "3")
    assert p.returncode == 3
    assert load(tmp_path / "r.json")["status"] == "script_error"


def test_stops_after_n_measured_steps(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = doctor("--steps", "5", "--warmup", "2", "--json", str(out), "--",
               "python", "train_ok.py", "--epochs", "50")
    assert p.returncode == 0, p.stderr
    assert "trained" not in p.stdout  # stopped before the script's own end
    data = load(out)
    assert data["status"] == "step_limit"
    assert data["measurements"]["timing"]["steps_measured"] == 5


def test_python_dash_m_module(tmp_path: Path) -> None:
    p = doctor("--steps", "3", "--warmup", "1", "--", "python", "-m", "pkg_mod.train",
               cwd=SCRIPTS)
    assert p.returncode == 0, p.stderr
    assert "step_limit" in p.stderr.replace(" ", "_") or "step limit" in p.stderr


def test_crashing_script_still_reports_and_writes(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = doctor("--steps", "50", "--warmup", "2", "--json", str(out), "--",
               "python", "train_crash.py")
    assert p.returncode == 1
    assert "ValueError: loss went NaN at step 12" in p.stderr
    assert "train_crash.py" in p.stderr and "runpy" not in p.stderr
    data = load(out)
    assert data["status"] == "script_error"
    assert "ValueError" in data["status_detail"]
    assert data["measurements"]["timing"]["steps_total"] == 12


def test_a_run_shorter_than_its_warm_up_leaves_the_start_up_out(tmp_path: Path) -> None:
    """Four steps, three of warm-up and one counted for FLOPs: the statistics fall back to
    the warm-up steps after the first (which runs from the start, the script's imports and
    model build included: it would read as host work in the loop), and the note counts
    every step that ran."""
    (tmp_path / "train.py").write_text(
        "import time\nimport torch\nfrom torch import nn\ntime.sleep(0.5)  # a slow start-up\n"
        "model = nn.Linear(64, 8)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(4):\n"
        "    nn.functional.mse_loss(model(torch.randn(16, 64)), torch.randn(16, 8)).backward()\n"
        "    opt.step()\n    opt.zero_grad()\n")
    out = tmp_path / "r.json"
    p = doctor("--warmup", "3", "--json", str(out), "--", "python", "train.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    data = load(out)
    t = data["measurements"]["timing"]
    assert (t["steps_total"], t["steps_warmup"], t["steps_excluded"], t["steps_measured"]) == (
        4, 3, 1, 0)
    assert len(t["step_times_s"]) == 2 and max(t["step_times_s"]) < 0.25
    note = data["measurements"]["notes"][0]
    assert note.startswith("Only 4 step(s) ran (1 of them slowed on purpose")
    assert "after the first (which also holds the script's start-up)" in note
    assert "config: batch unknown · no DataLoader" in p.stderr  # no DataLoader: said, not None


def test_script_that_never_steps(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = doctor("--json", str(out), "--", "python", "never_steps.py")
    assert p.returncode == 0
    assert "inference done" in p.stdout
    data = load(out)
    assert data["status"] == "no_steps"
    detail = data["status_detail"]
    assert "0 optimizer steps, 0 backward calls, 5 forward calls" in detail
    assert "w.step()" in detail
    assert "without a training step" in p.stderr


def test_missing_script_is_a_clear_usage_error(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = doctor("--json", str(out), "--", "python", "trian.py")
    assert p.returncode == 2
    assert "script not found: 'trian.py'" in p.stderr
    assert not out.exists()


@pytest.mark.parametrize("steps", ["0", "-3", "x"])
def test_bad_steps_value(steps: str) -> None:
    p = doctor("--steps", steps, "--", "python", "train_ok.py")
    assert p.returncode == 2
    assert "--steps must be" in p.stderr


def test_not_a_python_command() -> None:
    p = doctor("--", "bash", "train.sh")
    assert p.returncode == 2
    assert "expected `redline doctor -- python train.py" in p.stderr


def test_unwritable_json_dir_fails_before_running(tmp_path: Path) -> None:
    p = doctor("--json", str(tmp_path / "nope" / "r.json"), "--", "python", "train_ok.py")
    assert p.returncode == 2
    assert "does not exist" in p.stderr
    assert "trained" not in p.stdout


def _signal_when_ready(out: Path, sig: int, *script: str) -> tuple[str, int]:
    """Run ``script`` under doctor (no step limit), send ``sig`` once it prints READY; (stderr,
    exit status)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "redline.cli.main", "doctor", "--steps", "100000", "--warmup",
         "2", "--json", str(out), "--", "python", *script],
        cwd=SCRIPTS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if "READY" in proc.stdout.readline():
            break
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return err, proc.returncode


def test_ctrl_c_reports_steps_so_far(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    err, code = _signal_when_ready(out, signal.SIGINT, "slow_forever.py")
    assert code == 130
    data = load(out)
    assert data["status"] == "interrupted"
    assert data["measurements"]["timing"]["steps_total"] >= 12
    assert "interrupted" in err


def test_sigterm_reports_steps_so_far_and_stops_the_workers(tmp_path: Path) -> None:
    """What Slurm and Kubernetes send before killing a job: the report of the steps so far is
    printed and written, the DataLoader workers are stopped, the exit status is 128 + 15."""
    import psutil

    out, pids = tmp_path / "r.json", tmp_path / "pids"
    pids.mkdir()
    err, code = _signal_when_ready(out, signal.SIGTERM, "workers_forever.py", str(pids))
    assert code == 143
    data = load(out)
    assert data["status"] == "interrupted"
    assert data["status_detail"] == "terminated (SIGTERM); DataLoader workers stopped"
    assert data["measurements"]["timing"]["steps_total"] >= 12
    assert "terminated (SIGTERM)" in err
    workers = [int(p.name) for p in pids.iterdir()]
    assert len(workers) == 2
    assert not [p for p in workers if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_a_second_signal_exits_at_once() -> None:
    code = (
        "import os, signal, time\n"
        "from redline.doctor.exits import Signals, Terminated\n"
        "with Signals():\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n"
        "    except Terminated:\n"
        "        print('report', flush=True)\n"
        "        os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n"
        "        print('never', flush=True)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 128 + signal.SIGINT
    assert p.stdout == "report\n"


@pytest.mark.parametrize(("fetch_too", "status", "detail"), [
    (False, "step_limit", "stopped after 5 measured steps (the limit); the script caught "
                          "redline's stop 1 time(s)"),
    (True, "step_limit", "stopped at the limit of 5 measured steps; the script "
                         "caught redline's stop 3 time(s)"),
])
def test_the_step_limit_is_not_swallowed_by_a_bare_except(
        tmp_path: Path, fetch_too: bool, status: str, detail: str) -> None:
    out = tmp_path / "r.json"
    p = doctor("--steps", "5", "--warmup", "1", "--no-flops", "--json", str(out), "--",
               "python", "swallows_everything.py", *(["--fetch-too"] if fetch_too else []))
    data = load(out)
    assert data["status"] == status and data["status_detail"].startswith(detail)
    assert "the script finished" not in p.stdout  # ended at the limit, either way
    assert p.returncode == 0
    assert data["measurements"]["timing"]["steps_measured"] == 5


def test_cli_defaults_come_from_the_configs() -> None:
    from redline.cli.main import build_parser
    from redline.measure.config import WatchConfig
    from redline.tune.config import TuneConfig

    p = build_parser()
    d = p.parse_args(["doctor", "--", "python", "train.py"])
    assert d.warmup == WatchConfig().warmup_steps and callable(d.func)
    t = p.parse_args(["tune", "train.py"])
    assert (t.steps, t.rounds) == (TuneConfig().steps_per_trial, TuneConfig().rounds)


@pytest.mark.parametrize(("args", "message"), [
    (["tune", "x.py", "--rounds", "0"],
     "--rounds must be >= 1 (times each comparison alternates current and candidate), got 0"),
    (["tune", "x.py", "--price-per-hour", "-1"], "--price-per-hour must be >= 0, got -1"),
    (["doctor", "--warmup", "-1", "--", "python", "x.py"], "--warmup must be >= 0"),
    (["demo", "--steps", "zero"], "--steps must be an integer, got 'zero'"),
])
def test_bad_values_name_the_flag(args: list[str], message: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    from redline.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_workers_seen_are_the_loader_s_workers_not_every_child(tmp_path: Path) -> None:
    """A 'spawn' DataLoader also starts multiprocessing's resource tracker, a child process
    that is no worker: two workers are two."""
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, "
        "TensorDataset\n"
        "def main():\n"
        "    data = TensorDataset(torch.randn(640, 32), torch.randint(0, 4, (640,)))\n"
        "    loader = DataLoader(data, batch_size=16, num_workers=2, "
        "multiprocessing_context='spawn', persistent_workers=True)\n"
        "    model = nn.Linear(32, 4)\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x, y in loader:\n"
        "        nn.functional.cross_entropy(model(x), y).backward()\n"
        "        opt.step()\n        opt.zero_grad()\n"
        "if __name__ == '__main__':\n    main()\n")
    out = tmp_path / "r.json"
    p = doctor("--no-flops", "--json", str(out), "--", "python", "train.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    host = load(out)["measurements"]["host"]
    assert host["workers_seen"] == 2, host
