"""Each kind of HTML report in a real browser: Debian's Chromium, headless, with every network
request refused. The page must draw every chart (plotly's SVG present and holding marks), raise
no script error, log nothing to the console and fetch nothing; a screenshot of each is saved
(into $REDLINE_SCREENSHOTS when set, to look at)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from html_docs import (
    compare_doc,
    report_doc,
    trace_compare_doc,
    trace_doc,
    tune_doc,
    two_ranks_doc,
)
from redline.report.html import write_html

pytest.importorskip("plotly", reason="plotly (redline[html]) not installed")

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome")
                if shutil.which(b)), None)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    BROWSER is None, reason="no Chromium on PATH: install Debian's chromium package "
    "(.ci/run does) to run the browser tests")]

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars",
    # no network: every host unresolvable and every request through a closed proxy port
    "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
    "--virtual-time-budget=20000",
]
MARKS = ('class="point"', 'class="js-line"', 'class="box"', "class=\"trace bars\"",
         'class="scatterlayer')


def _browser(page: Path, profile: Path, *action: str) -> subprocess.CompletedProcess[str]:
    assert BROWSER is not None
    return subprocess.run([BROWSER, *FLAGS, f"--user-data-dir={profile}",
                           "--enable-logging=stderr", "--v=0", *action, page.as_uri()],
                          capture_output=True, text=True, timeout=180)


KINDS = {
    "report": lambda: [report_doc()],
    "tune": lambda: [tune_doc()],
    "trace": lambda: [trace_doc()],
    "ranks": lambda: [two_ranks_doc()],
    "demo": lambda: [report_doc(), tune_doc()],
    "compare": lambda: [compare_doc()],
    "trace_diff": lambda: [trace_compare_doc()],
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_page_renders_every_chart_offline_without_errors(kind: str, tmp_path: Path) -> None:
    page = write_html(KINDS[kind](), tmp_path / f"{kind}.html")
    r = _browser(page, tmp_path / "profile", "--dump-dom")
    assert r.returncode == 0, r.stderr[-2000:]
    dom = r.stdout
    attrs = dict(re.findall(r'data-redline-([a-z-]+)="([^"]*)"', dom.split(">", 2)[1]))
    assert attrs.get("errors") == "0", attrs.get("error-text")
    charts = int(attrs["charts"])
    assert charts >= 3 and attrs["rendered"] == str(charts), attrs
    assert attrs["external-requests"] == "0"
    console = [ln for ln in r.stderr.splitlines() if "CONSOLE" in ln]
    assert console == []
    # each chart div holds plotly's SVG with marks drawn in it
    pieces = re.split(r'<div class="chart[^"]*" id="chart-\d+"', dom)[1:]
    assert len(pieces) == charts
    for i, piece in enumerate(pieces, start=1):
        assert "main-svg" in piece, f"chart-{i} has no SVG"
        assert any(m in piece for m in MARKS), f"chart-{i} drew nothing"

    shot = tmp_path / f"{kind}.png"
    r = _browser(page, tmp_path / "profile2", "--window-size=1280,2400", f"--screenshot={shot}")
    assert r.returncode == 0 and shot.stat().st_size > 20_000, r.stderr[-2000:]
    keep = os.environ.get("REDLINE_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
