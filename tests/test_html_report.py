"""The self-contained HTML report: every chart's numbers are the JSON document's numbers, the page
fetches nothing, every kind of document renders, and bad input is refused with what was wrong.
(tests/test_html_browser.py loads the pages in a real browser.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from html_docs import (
    SCRIPTS,
    compare_doc,
    embedded,
    report_doc,
    trace_compare_doc,
    trace_doc,
    tune_doc,
    two_ranks_doc,
)
from redline.report import html as html_report
from redline.report.html import HtmlReportError, kind_of, read_documents, render_html
from trace_fixtures import synthetic_events, write_trace

go = pytest.importorskip("plotly.graph_objects", reason="plotly (redline[html]) not installed")


def _charts(page: str) -> dict[str, dict[str, Any]]:
    charts: dict[str, dict[str, Any]] = embedded(page, "redline-charts")
    for fig in charts.values():
        go.Figure(fig)  # plotly's own validation: every property exists and has a valid value
    return charts


def _chart(charts: dict[str, dict[str, Any]], title_start: str) -> dict[str, Any]:
    found = [f for f in charts.values() if f["layout"]["title"]["text"].startswith(title_start)]
    assert len(found) == 1, (title_start, [f["layout"]["title"]["text"] for f in charts.values()])
    return found[0]


def _trace(fig: dict[str, Any], name: str) -> dict[str, Any]:
    found = [t for t in fig["data"] if t.get("name") == name]
    assert len(found) == 1, (name, [t.get("name") for t in fig["data"]])
    return found[0]


def test_a_report_page_draws_the_json_numbers() -> None:
    doc = report_doc()
    page = render_html([doc])
    assert embedded(page, "redline-data") == [doc]  # the page carries its document
    charts = _charts(page)
    steps = doc["timeline"]["steps"]
    assert len(steps) == doc["measurements"]["timing"]["steps_total"]
    timeline = _chart(charts, "Step time by phase")
    assert _trace(timeline, "data_wait")["y"] == pytest.approx([s[5][0] * 1e3 for s in steps])
    assert _trace(timeline, "forward")["y"] == pytest.approx([s[5][2] * 1e3 for s in steps])
    assert _trace(timeline, "step time")["y"] == pytest.approx([s[2] * 1e3 for s in steps])
    assert _trace(timeline, "step time")["x"] == [s[0] for s in steps]
    kinds = [s[3] for s in steps]
    assert kinds[:3] == ["warmup"] * 3 and "measured" in kinds
    assert _trace(timeline, "data_wait")["marker"]["opacity"] == [
        1 if k == "measured" else 0.35 for k in kinds]
    shade = timeline["layout"]["shapes"][0]
    assert (shade["x0"], shade["x1"]) == (-0.5, 2.5)  # the warm-up marked

    shares = doc["measurements"]["breakdown"]
    bd = _chart(charts, "Mean per measured step")["data"][0]
    assert bd["y"] == [s["phase"] for s in shares]
    assert bd["x"] == pytest.approx([s["mean_s"] * 1e3 for s in shares])
    assert bd["customdata"] == [s["fraction"] for s in shares]

    starving = next(f for f in doc["findings"] if f["id"] == "data_starvation")
    ev = starving["evidence"]
    wait = _chart(charts, "Share of the data wait")["data"][0]
    expected = {k: ev[k] for k in ("cpu_share_of_wait", "contention_share_of_wait",
                                   "waiting_share_of_wait") if ev[k] is not None}
    assert wait["x"] == list(expected.values())
    ceilings = _chart(charts, "Ceilings")["data"][0]
    assert ceilings["x"] == [f["ceiling_speedup"] for f in doc["findings"]
                             if f["ceiling_speedup"] is not None]
    counters = doc["timeline"]["counters"]
    assert "CPU cores, training process" in counters
    for name, pts in counters.items():
        line = _chart(charts, name)["data"][0]
        assert line["x"] == [t for t, _ in pts] and line["y"] == [v for _, v in pts]
    # the tables print the same numbers
    t = doc["measurements"]["timing"]
    assert f"{t['step_time_mean_s'] * 1e3:,.2f} ms" in page
    assert f"{starving['ceiling_speedup']:.2f}×" in page
    assert f">{t['steps_measured']}<" in page


def test_the_page_fetches_nothing_and_stays_a_few_mb(tmp_path: Path) -> None:
    page = render_html([report_doc()])
    assert len(page.encode()) < 6 * 2 ** 20
    tags = re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", page)
    assert tags and all("src=" not in t and "href=" not in t for t in tags), tags
    assert "@import" not in page.split("<script>")[0]  # the inline style imports nothing
    assert "Plotly" in page  # the charting library itself is inline
    path = html_report.write_html([report_doc()], tmp_path / "r.html")
    assert path.read_text(encoding="utf-8") == page  # the same page, written whole


def test_a_tune_page_shows_every_trial_in_path_order_and_before_after() -> None:
    doc = tune_doc()
    charts = _charts(render_html([doc]))
    decisions = doc["plan"]["decisions"]
    trials = [d for d in decisions if d["samples_per_s_before"] is not None
              or d["samples_per_s_after"] is not None]
    assert trials
    path = _chart(charts, "Each trial side by side")
    before, after = _trace(path, "current setup"), _trace(path, "with the change")
    assert before["x"] == after["x"] == [f"{decisions.index(d) + 1}. {d['step']}"
                                         for d in trials]
    assert before["y"] == [d["samples_per_s_before"] for d in trials]
    assert after["y"] == [d["samples_per_s_after"] for d in trials]
    assert after["customdata"] == ["kept" if d["kept"] else "not kept" for d in trials]
    box = _chart(charts, "Measured step times")["data"]
    assert box[0]["y"] == pytest.approx([t * 1e3 for t in doc["before"]["step_times_s"]])
    assert box[1]["y"] == pytest.approx([t * 1e3 for t in doc["after"]["step_times_s"]])
    page = render_html([doc])
    assert f"{doc['before']['throughput_samples_per_s']:,.1f} samples/s" in page
    assert f"{doc['after']['throughput_samples_per_s']:,.1f} samples/s" in page
    assert f"job time ({doc['before_projection']['run_steps']:,} steps)" in page
    probes = doc["batch_search"]["probes"]
    fits = _trace(_chart(charts, "Probes"), "fits")
    assert fits["x"] == [p["batch"] for p in probes if not p["oom"]]
    # a plan that changed the optimization says so on the page
    doc["plan"]["notes"] = ["The optimization changed: effective batch 32 → 256"]
    assert "Note: The optimization changed: effective batch 32 → 256" in render_html([doc])


def test_a_trace_page_shows_each_rank_and_its_top_kernels() -> None:
    doc = trace_doc()
    charts = _charts(render_html([doc]))
    ranks = doc["ranks"]
    assert len(ranks) == 2
    temporal = _chart(charts, "Temporal breakdown")
    assert _trace(temporal, "idle")["y"] == [r["temporal"]["idle_pct"] for r in ranks]
    assert _trace(temporal, "compute")["y"] == [r["temporal"]["compute_pct"] for r in ranks]
    idle = _chart(charts, "Idle time by cause")
    assert _trace(idle, "waiting for the host (launches)")["y"] == pytest.approx(
        [r["idle_sum_over_streams"]["host_wait"] / 1e3 for r in ranks])
    for r in ranks:
        top = _chart(charts, f"Top kernels, rank {r['rank']}")["data"][0]
        assert top["x"] == pytest.approx([k["total_us"] / 1e3 for k in r["top_kernels"][:10]])
        assert [c[0] for c in top["customdata"]] == [k["name"] for k in r["top_kernels"][:10]]
    ceilings = _chart(charts, "Ceilings")["data"][0]["y"]
    assert {c.rsplit(" (", 1)[1] for c in ceilings} == {"rank 0)", "rank 1)"}  # whose finding
    kt = _chart(charts, "Kernel time by type, per rank")
    for r in ranks:
        bars = _trace(kt, f"rank {r['rank']}")
        assert dict(zip(bars["y"], bars["x"], strict=True)) == pytest.approx(
            {k: v / 1e3 for k, v in r["kernel_types_us"].items()})


def test_a_comparison_page_shows_the_verdict_the_phases_and_the_kernels() -> None:
    doc = compare_doc()
    page = render_html([doc])
    # the verdict is the statistics' (tests/test_compare.py); the page shows it first
    assert page.index(f"<h2>Verdict: {doc['verdict']['verdict']}</h2>") < page.index("Phases")
    tested = _chart(_charts(page), "Tested time")["data"][0]
    test = doc["verdict"]["test"]
    assert tested["y"] == pytest.approx([test["before_mean_s"] * 1e3, test["after_mean_s"] * 1e3])
    phases = _chart(_charts(page), "Phases, mean ms per step")
    assert _trace(phases, "before")["y"] == [p["before_ms"] for p in doc["phases"]]
    assert _trace(phases, "after")["y"] == pytest.approx([2 * p["before_ms"]
                                                          for p in doc["phases"]])
    diff = trace_compare_doc()
    kernels = _chart(_charts(render_html([diff])), "Kernels: largest changes")["data"][0]
    assert kernels["x"] == [20.0]  # the GEMMs' 20 µs per step more
    assert kernels["customdata"] == [["sm90_xmma_gemm_f32f32", "slower"]]
    assert kernels["marker"]["color"] == ["#ff7f0e"]  # slower: orange, as the page says


def test_a_multi_rank_report_compares_the_ranks() -> None:
    doc = two_ranks_doc()
    page = render_html([doc])
    charts = _charts(page)
    per_rank = _chart(charts, "Per rank")
    assert _trace(per_rank, "backward")["y"] == pytest.approx([4.0, 8.0])
    assert _trace(per_rank, "step time")["y"] == pytest.approx([10.0, 14.0])
    assert "h2d_copy" not in [t["name"] for t in per_rank["data"]]  # unknown on every rank
    waits = _chart(charts, "Waiting at collectives")
    assert _trace(waits, "made the others wait")["y"] == pytest.approx([0.0, 4.0])
    assert "20 of 20" in page and "rank 1" in page  # rank 1 arrived last at every collective


def test_a_run_without_steps_says_so_instead_of_charting_zeros(tmp_path: Path) -> None:
    r = _cli("doctor", "--html", str(tmp_path / "r.html"), "--", "python",
             str(SCRIPTS / "never_steps.py"))
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "r.html").read_text()
    assert "No step was measured" in page and "status no steps" in page
    assert embedded(page, "redline-charts") == {}
    assert "No finding" not in page and "did not starve" not in page


def test_a_report_and_its_tuning_show_side_by_side() -> None:
    page = render_html([report_doc(), tune_doc()], ["naive run", "tuned"])
    assert re.findall(r'data-kind="(\w+)"', page) == ["report", "tune"]
    assert "<title>redline: naive run and tuned</title>" in page
    assert embedded(page, "redline-data") == [report_doc(), tune_doc()]


# -- bad input ---------------------------------------------------------------------------------


def test_documents_that_are_not_redline_s_are_refused_with_what_they_were(tmp_path: Path) -> None:
    with pytest.raises(HtmlReportError, match="got a JSON list"):
        kind_of([1, 2])
    with pytest.raises(HtmlReportError, match=r"got schema 'x/1'.*--json"):
        kind_of({"schema": "x/1"})
    cut = dict(report_doc())
    del cut["measurements"]
    with pytest.raises(HtmlReportError, match=r"a\.json: a report document .*'measurements'"):
        render_html([cut], ["a.json"])
    with pytest.raises(HtmlReportError, match="no document"):
        render_html([])
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "redline.report/2", ')
    with pytest.raises(HtmlReportError, match=r"bad\.json: not valid JSON \(line 1"):
        read_documents([str(bad)])
    with pytest.raises(HtmlReportError, match=r"missing\.json: cannot read it"):
        read_documents([str(tmp_path / "missing.json")])
    binary = tmp_path / "b.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(HtmlReportError, match="not UTF-8"):
        read_documents([str(binary)])


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "redline.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_redline_report_writes_the_page_from_saved_json(tmp_path: Path) -> None:
    a, b = tmp_path / "run.json", tmp_path / "tune.json"
    a.write_text(json.dumps(report_doc()))
    b.write_text(json.dumps(tune_doc()))
    out = tmp_path / "page.html"
    r = _cli("report", str(a), str(b), "--html", str(out))
    assert r.returncode == 0, r.stderr
    assert embedded(out.read_text(), "redline-data") == [report_doc(), tune_doc()]
    r = _cli("report", str(a), "--html", str(a))
    assert r.returncode == 2 and "would replace it" in r.stderr
    assert json.loads(a.read_text()) == report_doc()  # the input is untouched
    r = _cli("report", str(a), "--html", str(tmp_path / "no" / "page.html"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    (tmp_path / "other.json").write_text('{"traceEvents": []}')
    r = _cli("report", str(tmp_path / "other.json"), "--html", str(out))
    assert r.returncode == 2 and "expected a redline document" in r.stderr


def test_without_plotly_html_fails_before_the_run_with_the_install_hint(
        tmp_path: Path) -> None:
    hide = ("import importlib.util, sys; real = importlib.util.find_spec; "
            "importlib.util.find_spec = lambda n, *a: None if n == 'plotly' else real(n, *a); "
            "sys.modules['plotly'] = None; from redline.cli.main import main; ")
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    r = subprocess.run([sys.executable, "-c", hide + "sys.exit(main(sys.argv[1:]))", "doctor",
                        "--html", str(tmp_path / "r.html"), "--", "python", str(script)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "pip install 'redline[html]'" in r.stderr and not marker.exists()
    r = subprocess.run([sys.executable, "-c", hide + "sys.exit(main(sys.argv[1:]))", "demo",
                        "--html", str(tmp_path / "r.html")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "redline[html]" in r.stderr
    assert "training" not in r.stdout  # refused before the demo trained anything


@pytest.mark.slow
def test_each_command_writes_its_page(tmp_path: Path) -> None:
    page = tmp_path / "doctor.html"
    r = _cli("doctor", "--steps", "5", "--html", str(page), "--json", str(tmp_path / "d.json"),
             "--", "python", str(SCRIPTS / "train_ok.py"))
    assert r.returncode == 0, r.stderr
    assert "HTML report written to" in r.stderr
    assert embedded(page.read_text(), "redline-data") == [
        json.loads((tmp_path / "d.json").read_text())]
    r = _cli("doctor", "--steps", "5", "--html", str(page), "--json", str(page), "--",
             "python", str(SCRIPTS / "train_ok.py"))
    assert r.returncode == 2 and "name the same file" in r.stderr

    folder = tmp_path / "traces"
    folder.mkdir()
    write_trace(folder / "r0.json.gz", synthetic_events(), rank=0)
    r = _cli("trace", str(folder), "--html", str(tmp_path / "trace.html"), "--json",
             str(tmp_path / "t.json"))
    assert r.returncode == 0, r.stderr
    assert embedded((tmp_path / "trace.html").read_text(), "redline-data") == [
        json.loads((tmp_path / "t.json").read_text())]
    r = _cli("trace", str(folder), "--html", str(tmp_path / "t.json"), "--json",
             str(tmp_path / "t.json"))
    assert r.returncode == 2 and "--json and --html both name" in r.stderr

    r = _cli("tune", str(SCRIPTS / "tune_tiny.py"), "--steps", "3", "--rounds", "1",
             "--no-compile", "--fresh", "--plan", str(tmp_path / "plan.json"), "--json",
             str(tmp_path / "u.json"), "--html", str(tmp_path / "tune.html"))
    assert r.returncode == 0, r.stderr
    assert embedded((tmp_path / "tune.html").read_text(), "redline-data") == [
        json.loads((tmp_path / "u.json").read_text())]

    r = _cli("demo", "--no-tune", "--steps", "2", "--workload", "lm", "--html",
             str(tmp_path / "demo.html"))
    assert r.returncode == 0, r.stderr
    assert re.findall(r'data-kind="(\w+)"', (tmp_path / "demo.html").read_text()) == ["report"]
