"""Commands import only what they use: ``redline trace``, ``redline plan`` (from numbers or a
config.json), ``redline compare`` on reports or traces and ``redline report`` on a trace's
JSON run without importing torch, whose import alone costs seconds (issue 29). Each command
runs in a fresh interpreter, as a user runs it, and the wrapper says at exit whether ``torch``
was ever imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trace_fixtures import write_trace

ROOT = Path(__file__).resolve().parents[1]

WRAPPER = """
import runpy, sys
argv = sys.argv[1:]
sys.argv = ["redline", *argv]
code = 0
try:
    runpy.run_module("redline.cli.main", run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else 1
print("TORCH_IMPORTED=" + str("torch" in sys.modules), file=sys.stderr)
print("REDLINE_MODULES=" + ",".join(sorted(m for m in sys.modules
                                           if m.startswith(("redline", "rich")))),
      file=sys.stderr)
sys.exit(code)
"""

LLAMA_7B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "vocab_size": 32000, "intermediate_size": 11008,
            "hidden_act": "silu", "max_position_embeddings": 4096}


def _run(*argv: str, cwd: Path) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-c", WRAPPER, *argv], capture_output=True, text=True,
                       cwd=cwd, timeout=120)
    return p.returncode, p.stdout, p.stderr


def _commands(tmp: Path) -> dict[str, list[str]]:
    trace = write_trace(tmp / "rank0.json.gz")
    config = tmp / "config.json"
    config.write_text(json.dumps(LLAMA_7B))
    reports = [tmp / "before.json", tmp / "after.json"]
    for path, step_s in zip(reports, (0.010, 0.020), strict=True):
        path.write_text(json.dumps({"schema": "redline.report/2", "measurements": {
            "timing": {"step_time_mean_s": step_s,
                       "step_times_s": [step_s * (1 + 0.01 * (i % 3)) for i in range(40)]}}}))
    (tmp / "after").mkdir(exist_ok=True)
    after_trace = write_trace(tmp / "after" / "rank0.json.gz")
    return {
        "compare reports": ["compare", str(reports[0]), str(reports[1])],
        "compare traces --json --html": ["compare", str(trace), str(after_trace), "--json",
                                         str(tmp / "c.json"), "--html", str(tmp / "c.html")],
        "trace": ["trace", str(trace)],
        "trace --json --html": ["trace", str(trace), "--json", str(tmp / "t.json"),
                                "--html", str(tmp / "t.html")],
        "plan numbers": ["plan", "--params", "7B", "--layers", "32", "--hidden", "4096",
                         "--heads", "32", "--vocab", "32000", "--seq", "2048", "--gpus", "8",
                         "--global-batch", "64", "--json", str(tmp / "p.json")],
        "plan config": ["plan", "--config", str(config), "--gpus", "16",
                        "--global-batch", "128"],
    }


@pytest.mark.parametrize("name", ["trace", "trace --json --html", "plan numbers",
                                  "plan config", "compare reports",
                                  "compare traces --json --html"])
def test_command_runs_without_importing_torch(name: str, tmp_path: Path) -> None:
    code, out, err = _run(*_commands(tmp_path)[name], cwd=tmp_path)
    assert code in (0, 1), err  # plan exits 1 when no layout fits; both did the work
    assert out.strip(), "the command printed nothing"
    assert "TORCH_IMPORTED=False" in err, f"`redline {name}` imported torch"


NOT_FOR_A_TRACE = ["redline.diagnose.engine", "redline.core.measurements", "redline.plan.search",
                   "redline.plan.memory", "redline.runs.build", "redline.doctor.options",
                   "redline.tune.config", "redline.measure.config", "rich.console"]
"""What ``redline trace`` has no use for: the rules over a watch's measurements and their
records, the planner, the report builder, the doctor's and the tuner's settings, and rich (its
tables are plain text)."""


def test_trace_loads_only_what_it_uses(tmp_path: Path) -> None:
    code, _, err = _run(*_commands(tmp_path)["trace"], cwd=tmp_path)
    assert code == 0, err
    loaded = set(err.split("REDLINE_MODULES=")[1].split()[0].split(","))
    assert {"redline.trace.load", "redline.diagnose.trace_rules"} <= loaded  # the check sees
    assert not loaded & set(NOT_FOR_A_TRACE), sorted(loaded & set(NOT_FOR_A_TRACE))


def test_html_report_of_a_trace_document_runs_without_importing_torch(tmp_path: Path) -> None:
    code, _, err = _run(*_commands(tmp_path)["trace --json --html"], cwd=tmp_path)
    assert code == 0, err
    code, _, err = _run("report", str(tmp_path / "t.json"), "--html",
                          str(tmp_path / "r.html"), cwd=tmp_path)
    assert code == 0, err
    assert (tmp_path / "r.html").stat().st_size > 0
    assert "TORCH_IMPORTED=False" in err


def test_the_check_can_fail() -> None:
    """The wrapper sees torch when a command does import it (doctor's help loads nothing, so a
    direct import stands in): a check that could never say True would prove nothing."""
    p = subprocess.run([sys.executable, "-c", "import torch\n" + WRAPPER, "--version"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "TORCH_IMPORTED=True" in p.stderr
