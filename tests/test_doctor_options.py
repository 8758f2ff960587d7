"""Doctor's options are one record: every field has one flag and one default, the ranks of a
launcher's job get it as one JSON document, and messages name fields the CLI shows as flags."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from redline.cli.args import dest_flags, flag_words
from redline.cli.main import build_parser
from redline.doctor import DoctorError, DoctorOptions
from redline.doctor.launch import rank_command

SCRIPTS = Path(__file__).parent / "scripts"


def _doctor_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices["doctor"]
    return parser


def test_every_field_is_one_flag_with_the_records_default() -> None:
    doctor = _doctor_parser()
    flags = dest_flags(doctor)
    fields = {f.name: f.default for f in dataclasses.fields(DoctorOptions)}
    assert set(flags) == set(fields)
    defaults = doctor.parse_args([])
    for name, default in fields.items():
        assert getattr(defaults, name) == default, name
    assert flags["json_path"] == "--json" and flags["count_flops"] == "--no-flops"
    parsed = doctor.parse_args(["--no-flops", "--steps", "7", "--json", "r.json",
                                "--", "python", "t.py"])
    options = DoctorOptions(**{n: getattr(parsed, n) for n in fields})
    assert (options.count_flops, options.steps, options.json_path) == (False, 7, "r.json")


def test_the_record_travels_as_one_json_document() -> None:
    options = DoctorOptions(steps=9, warmup=0, json_path="out.json", count_flops=False,
                            metrics_port=0, live=True)
    assert DoctorOptions.from_json(options.to_json()) == options
    with pytest.raises(DoctorError, match="not JSON"):
        DoctorOptions.from_json("{steps: 9")
    with pytest.raises(DoctorError, match=r"\['frobnicate'\].*another redline version"):
        DoctorOptions.from_json(json.dumps({"steps": 3, "frobnicate": 1}))


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"steps": 0}, "`steps` must be an integer >= 1, got 0"),
    ({"warmup": -1}, "`warmup` must be an integer >= 0, got -1"),
    ({"steps": True}, "`steps` must be an integer >= 1, got True"),
    ({"metrics_port": 70000}, "`metrics_port` must be a TCP port 0..65535"),
])
def test_bad_values_are_refused_in_field_words(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(DoctorError) as e:
        DoctorOptions(**kwargs)
    assert says in str(e.value)
    shown = flag_words(str(e.value), dest_flags(_doctor_parser()))
    assert "`" not in shown.split(", got")[0]
    assert shown.startswith(("--steps", "--warmup", "--metrics-port"))


def test_the_launcher_gives_each_rank_the_record() -> None:
    options = DoctorOptions(steps=4, json_path="job.json")
    cmd = rank_command(["torchrun", "--nproc_per_node=2", "train.py", "--lr", "1"],
                       options.to_json())
    assert cmd is not None
    at = cmd.index("redline.doctor")
    assert cmd[at - 1] == "-m" and cmd[at + 2] == "--"
    assert DoctorOptions.from_json(cmd[at + 1]) == options
    assert cmd[at + 3:] == ["python", "train.py", "--lr", "1"]


def test_a_rank_runs_from_the_record(tmp_path: Path) -> None:
    out = tmp_path / "rank.json"
    options = DoctorOptions(steps=3, warmup=1, count_flops=False, json_path=str(out))
    p = subprocess.run([sys.executable, "-m", "redline.doctor", options.to_json(), "--",
                        "python", str(SCRIPTS / "train_ok.py")],
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["measurements"]["timing"]["steps_measured"] == 3
    assert report["status"] == "step_limit"
    bad = subprocess.run([sys.executable, "-m", "redline.doctor", "{}", "python", "x.py"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "expected OPTIONS_JSON -- CMD" in bad.stderr
