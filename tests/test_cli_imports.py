"""Commands import only what they use: ``redline trace``, ``redline plan`` (from numbers or a
config.json), ``redline compare`` on reports or traces and ``redline report`` on a trace's
JSON run without importing torch, whose import alone costs seconds (issue 29), and
``redline trace`` leaves out the standard-library modules and dataclasses it has no use for
(milliseconds each, on a command of ~50 ms). Each command runs in a fresh interpreter, as a
user runs it, and the wrapper says at exit what was imported."""

from __future__ import annotations

import ast
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trace_fixtures import kineto_text, synthetic_events, write_trace

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
print("ALL_MODULES=" + ",".join(sorted(sys.modules)), file=sys.stderr)
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


NOT_AT_START = {
    "typing": "annotations only (TYPE_CHECKING = False)",
    "shutil": "argparse's help width (cli/args.HelpFormatter finds it)",
    "gzip": "a file in Kineto's layout is gunzipped through zlib",
}
"""Standard-library modules ``redline trace`` loads no more on a torch.profiler trace, each
~1-3 ms of its start-up (module → why it is not needed)."""

DATACLASSES_ON_THE_TRACE_PATH = {"redline.core.findings"}
"""Modules ``redline trace`` loads that may define dataclasses: ``Finding``, which a report's
JSON reads and writes as a dataclass. The others' records are ``@record`` classes
(core/record.py), which compile no methods at import."""


def _loaded(err: str, line: str) -> set[str]:
    return set(err.split(line + "=")[1].split()[0].split(","))


def test_trace_of_a_kineto_file_starts_light(tmp_path: Path) -> None:
    trace = tmp_path / "rank0.pt.trace.json.gz"
    trace.write_bytes(gzip.compress(kineto_text(synthetic_events()).encode()))
    code, out, err = _run("trace", str(trace), cwd=tmp_path)
    assert code == 0, err
    assert "kernel" in out.lower()  # it read the events and printed their analysis
    loaded = _loaded(err, "ALL_MODULES")
    assert not loaded & set(NOT_AT_START), sorted(loaded & set(NOT_AT_START))
    defining = {name for name in _loaded(err, "REDLINE_MODULES") if _defines_dataclass(name)}
    assert defining == DATACLASSES_ON_THE_TRACE_PATH, sorted(defining)


def _defines_dataclass(module: str) -> bool:
    path = ROOT / "src" / Path(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return any(isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(decorator)
                                                      for decorator in node.decorator_list)
               for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))))


def test_the_dataclass_reader_sees_one() -> None:
    assert _defines_dataclass("redline.core.findings")
    assert not _defines_dataclass("redline.trace.kernels")


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
