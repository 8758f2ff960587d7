"""Traces with bad numbers are named, not averaged in; broken files say how far they got; a
symlink loop is a loop; output survives a terminal that cannot encode non-ASCII."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from redline.cli.main import main
from redline.trace import TraceError, analyze_paths, load_trace
from redline.trace.kineto_fast import ORJSON_MIN_BYTES
from trace_fixtures import _x, kineto_text, synthetic_events, write_trace


def _with_bad_kernels() -> list[dict[str, object]]:
    ev = synthetic_events()
    ev += [  # inside the window of the good ones, so any of them counted would show
        _x("kernel", "bad_negative", 40, -25, stream=7, correlation=90),
        _x("kernel", "bad_nan", 41, float("nan"), stream=7, correlation=91),
        _x("kernel", "bad_inf", 42, float("inf"), stream=7, correlation=92),
        {"ph": "X", "cat": "kernel", "name": "bad_missing", "ts": 43, "args": {"stream": 7}},
    ]
    return ev


def test_kernels_with_bad_durations_are_counted_and_left_out(tmp_path: Path) -> None:
    good = analyze_paths([write_trace(tmp_path / "good.json.gz")])
    bad_path = tmp_path / "bad.json"
    # json.dumps writes NaN and Infinity, as some producers do (not strict JSON)
    bad_path.write_text(json.dumps({"traceEvents": _with_bad_kernels(),
                                    "distributedInfo": {"rank": 0}}))
    bad = analyze_paths([bad_path])
    (r,) = bad.ranks
    assert r.temporal == good.ranks[0].temporal  # every statistic as if they were absent
    assert r.kernel_types_us == good.ranks[0].kernel_types_us
    assert r.left_out == {"negative duration": 1, "NaN or infinite start or duration": 2,
                          "missing start or duration": 1}
    said = [w for w in bad.warnings if "left out of every statistic" in w]
    assert len(said) == 3 and any("'bad_negative'" in w for w in said)


def test_the_json_of_a_bad_trace_is_strict_and_says_what_was_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "bad.json"
    src.write_text(json.dumps({"traceEvents": _with_bad_kernels(),
                               "distributedInfo": {"rank": 0}}))
    out = tmp_path / "analysis.json"
    assert main(["trace", str(src), "--json", str(out)]) == 0
    text = out.read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert data["ranks"][0]["left_out"]["negative duration"] == 1
    assert sum("left out of every statistic" in w for w in data["warnings"]) == 3
    t = data["ranks"][0]["temporal"]
    assert min(t["idle_pct"], t["compute_pct"], t["non_compute_pct"]) >= 0
    printed = capsys.readouterr().out
    assert "negative duration left out of every statistic" in printed
    assert not re.search(r"nan%|-\d+(\.\d+)?%|inf%", printed.lower())  # no NaN or negative share


def test_a_truncated_trace_says_how_far_it_got(tmp_path: Path) -> None:
    events = synthetic_events() * 200  # enough events that a cut lands in the middle
    full = json.dumps({"schemaVersion": 1, "traceEvents": events}, indent=2).replace(
        '"traceEvents": [\n    {', '"traceEvents": [\n  {')  # (not Kineto's exact layout)
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(full.encode())[: len(gzip.compress(full.encode())) // 2])
    with pytest.raises(TraceError) as e:
        analyze_paths([cut])
    msg = str(e.value)
    assert "cut.json.gz" in msg and "bytes of JSON came out before it ends" in msg
    assert "#0" not in msg


def test_a_truncated_kineto_trace_names_the_events_read(tmp_path: Path) -> None:
    shared = Path(__file__).resolve().parents[2] / "shared" / "traces" / "nccl_parser_config"
    src = shared / "nccl_data.json.gz"
    if not src.exists():
        pytest.skip(f"the recorded trace {src} is not here (CI lays shared/ beside the clone)")
    raw = src.read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceError) as e:
        analyze_paths([cut])
    msg = str(e.value)
    assert "device and runtime events, at byte" in msg and "#0" not in msg
    n = int(msg.split("after ")[1].split(" device")[0].replace(",", ""))
    assert n > 100


def test_a_symlink_loop_is_named_as_one(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.symlink_to(b.name)
    b.symlink_to(a.name)
    with pytest.raises(TraceError, match="a symlink loop"):
        analyze_paths([a])
    dangling = tmp_path / "c.json"
    dangling.symlink_to("missing.json")
    with pytest.raises(TraceError, match=r"a symlink to 'missing\.json', which does not exist"):
        analyze_paths([dangling])


def test_output_survives_an_ascii_terminal(tmp_path: Path) -> None:
    t = write_trace(tmp_path / "t.json.gz")
    env = {**os.environ, "PYTHONIOENCODING": "ascii", "LANG": "C", "LC_ALL": "C",
           "COLUMNS": "120"}
    p = subprocess.run([sys.executable, "-m", "redline.cli.main", "trace", str(t)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "Where GPU time goes" in p.stdout and "Traceback" not in p.stderr


def _shifted(events: list[dict[str, object]], origin: int, as_float: bool
             ) -> list[dict[str, object]]:
    out = []
    for e in events:
        e = dict(e)
        ts = int(e["ts"]) + origin  # type: ignore[call-overload]
        e["ts"] = float(ts) if as_float else ts
        out.append(e)
    return out


def test_timestamps_near_1e18_give_the_same_figures_as_small_ones(tmp_path: Path) -> None:
    """Integer timestamps ~1e18 µs (a nanosecond clock written as µs) are exact in the file;
    a float holds them only to 128 µs, so times are kept relative to the first one."""
    small = analyze_paths([write_trace(tmp_path / "small.json.gz")]).ranks[0]
    big = analyze_paths([write_trace(tmp_path / "big.json.gz",
                                     _shifted(synthetic_events(), 10**18, False))]).ranks[0]
    assert big.temporal == small.temporal
    assert big.kernel_types_us == small.kernel_types_us


def test_float_timestamps_near_1e18_are_said_to_have_lost_their_digits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_trace(tmp_path / "f.json", _shifted(synthetic_events(), 10**18, True), gz=False)
    assert main(["trace", str(src)]) == 0
    out = capsys.readouterr()
    assert "resolve only 128 µs there" in out.out + out.err
    assert "Traceback" not in out.err


@pytest.mark.parametrize("padding", [0, 12_000])
def test_nan_and_infinity_in_kineto_layout_read_the_same_at_any_size(
        tmp_path: Path, padding: int) -> None:
    """A file of more than ORJSON_MIN_BYTES of text is parsed by orjson, which refuses NaN and
    Infinity; the standard library then reads it, so the bad kernels are left out as in a small
    file, not taken for a broken file."""
    unused = [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1,
               "ts": 1000 + i, "dur": 1, "args": {"External id": i}} for i in range(padding)]
    path = tmp_path / "bad.json"
    path.write_text(kineto_text(_with_bad_kernels() + unused))
    assert (path.stat().st_size >= ORJSON_MIN_BYTES) == (padding > 0)
    t = load_trace(path)
    assert t.read_counts is not None  # read by the block reader, not whole
    (r,) = analyze_paths([path]).ranks
    assert r.left_out == {"negative duration": 1, "NaN or infinite start or duration": 2,
                          "missing start or duration": 1}
