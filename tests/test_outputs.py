"""No output ever replaces a user's file: every command refuses an output path that is one of
its inputs or the script it runs (symlinks and hard links included), before doing any work;
outputs get the user's permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from redline.cli.main import main
from redline.core.files import OutputPathError, refuse_overwriting_inputs, write_text_atomic
from redline.doctor import DoctorError, DoctorOptions, run_doctor
from trace_fixtures import synthetic_events, write_trace

SCRIPTS = Path(__file__).parent / "scripts"


def _trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "rank0.json", synthetic_events())


def test_trace_refuses_to_write_over_its_input(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    t = _trace(tmp_path)
    before = t.read_bytes()
    link = tmp_path / "link.json"
    link.symlink_to(t)
    hard = tmp_path / "hard.json.out"
    os.link(t, hard)
    for out, given in ((t, t), (link, t), (hard, t), (t, tmp_path)):
        assert main(["trace", str(given), "--json", str(out)]) == 2
        err = capsys.readouterr().err
        assert "--json" in err and "is a trace to analyse" in err and "another path" in err
        assert t.read_bytes() == before
    ok = tmp_path / "out" / "analysis.json"
    ok.parent.mkdir()
    assert main(["trace", str(t), "--json", str(ok)]) == 0 and ok.exists()


def test_doctor_refuses_to_write_over_the_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text((SCRIPTS / "train_ok.py").read_text())
    before = script.read_bytes()
    link = tmp_path / "report.json"
    link.symlink_to(script)
    for out in (script, link):
        with pytest.raises(DoctorError, match="the script to run"):
            run_doctor(["python", str(script)], DoctorOptions(json_path=str(out)), show=False)
        assert script.read_bytes() == before
    module = SCRIPTS / "pkg_mod" / "train.py"
    cwd = os.getcwd()
    os.chdir(SCRIPTS)
    try:
        with pytest.raises(DoctorError, match="the script to run"):
            run_doctor(["python", "-m", "pkg_mod.train"], DoctorOptions(json_path=str(module)),
                       show=False)
    finally:
        os.chdir(cwd)


def test_tune_refuses_outputs_over_the_script_or_each_other(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text((SCRIPTS / "tune_tiny.py").read_text())
    before = script.read_bytes()
    assert main(["tune", str(script), "--plan", str(script)]) == 2
    assert "--plan" in capsys.readouterr().err and script.read_bytes() == before
    same = str(tmp_path / "out.json")
    assert main(["tune", str(script), "--plan", same, "--json", same]) == 2
    assert "--plan and --json both name" in capsys.readouterr().err
    assert not Path(same).exists()


def test_refusal_names_the_option_and_what_it_would_replace(tmp_path: Path) -> None:
    a = tmp_path / "a.json"
    a.write_text("{}")
    with pytest.raises(OutputPathError, match=r"--out '.*a\.json' is the input"):
        refuse_overwriting_inputs({"--out": a}, {"the input": [a]})
    refuse_overwriting_inputs({"--out": tmp_path / "b.json", "--other": None},
                              {"the input": [a]})


def test_outputs_keep_the_users_umask_and_an_existing_mode(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        new = write_text_atomic("x", tmp_path / "new.json")
        assert stat.S_IMODE(new.stat().st_mode) == 0o644
        os.umask(0o077)
        assert stat.S_IMODE(write_text_atomic("y", tmp_path / "private.json").stat().st_mode) \
            == 0o600
        os.umask(0o022)
        kept = tmp_path / "kept.json"
        kept.write_text("old")
        kept.chmod(0o640)
        write_text_atomic("new", kept)
        assert stat.S_IMODE(kept.stat().st_mode) == 0o640 and kept.read_text() == "new"
    finally:
        os.umask(old)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_text_with_square_brackets_is_printed_not_parsed(
        capsys: pytest.CaptureFixture[str]) -> None:
    """An error message, a path or a kernel name with [...] in it is shown as it is (the
    terminal renderer's markup must never read the user's text)."""
    r = run_doctor(["python", str(SCRIPTS / "raises_brackets.py")],
                   DoctorOptions(warmup=1, count_flops=False))
    assert r.report is not None and r.report.status == "script_error" and r.exit_code == 1
    err = capsys.readouterr().err
    assert "[/__w/pytorch/third_party/gloo/transport/tcp/pair.cc:553] Connection closed" in err
    assert "[bold]" in err
