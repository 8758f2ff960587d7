"""One self-contained HTML file from redline's JSON documents (``--html PATH``, ``redline report
REPORT.json --html PATH``): a doctor/demo report, a trace analysis, a tuning result, or a report
and a tuning result side by side (the demo's naive run and what tuning made of it).

Charts are drawn by plotly.js (the ``plotly`` package's bundled copy, from
``redline[html]``), inlined with the styles, so the page opens offline and fetches nothing.
The documents themselves travel inside the page (``<script id="redline-data">``) next to the
figures (``<script id="redline-charts">``); the figures are built from the documents' numbers
(:mod:`redline.report.html_charts`). After drawing, the page records on its root element how
many charts rendered, any script error, and any network fetch (``data-redline-*``), which is
what a browser test reads.
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from redline.core.errors import RedlineError
from redline.core.files import write_text_atomic
from redline.core.report import SCHEMA_VERSION
from redline.report.html_charts import Block, report_blocks
from redline.report.html_trace import trace_blocks
from redline.report.html_tune import tune_blocks
from redline.report.trace_render import TRACE_SCHEMA


def _kinds() -> dict[str, str]:
    """The documents a page can show, by their ``schema`` field. (The tuning schema's module
    imports the tuner: loaded here, when a page is made, not whenever doctor or a callback
    starts.)"""
    from redline.report.compare_render import COMPARE_SCHEMA
    from redline.report.tune_render import TUNE_SCHEMA

    return {SCHEMA_VERSION: "report", TRACE_SCHEMA: "trace", TUNE_SCHEMA: "tune",
            COMPARE_SCHEMA: "compare"}


class HtmlReportError(RedlineError):
    """The HTML report cannot be made: plotly is missing or a document is not redline's."""


MISSING_PLOTLY = ("the HTML report draws its charts with plotly, which is not installed; "
                  "install it with: pip install 'redline[html]'")


def check_available() -> None:
    """Fail before a run whose ``--html`` could not be written afterwards."""
    if importlib.util.find_spec("plotly") is None:
        raise HtmlReportError(MISSING_PLOTLY)


def _plotly_js() -> str:
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise HtmlReportError(MISSING_PLOTLY) from None
    js: str = get_plotlyjs()
    return js


def kind_of(doc: Any, source: str = "the document") -> str:
    """``report``, ``trace``, ``tune`` or ``compare``; anything else is refused with what it
    was."""
    if not isinstance(doc, dict):
        raise HtmlReportError(f"{source}: expected a JSON object written by redline (doctor, "
                              "demo, trace, tune or compare --json), got a JSON "
                              f"{type(doc).__name__}")
    schema = doc.get("schema")
    kinds = _kinds()
    if schema not in kinds:
        raise HtmlReportError(
            f"{source}: expected a redline document with schema one of {sorted(kinds)}, got "
            f"schema {schema!r}; write one with `redline doctor|demo|trace|tune|compare ... "
            "--json PATH`")
    return kinds[schema]


def blocks_of(doc: dict[str, Any], source: str = "the document") -> list[Block]:
    kind = kind_of(doc, source)
    try:
        if kind == "report":
            return report_blocks(doc)
        if kind == "trace":
            return trace_blocks(doc)
        if kind == "compare":
            from redline.report.html_compare import compare_blocks

            return compare_blocks(doc)
        return tune_blocks(doc)
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as e:
        raise HtmlReportError(
            f"{source}: a {kind} document (schema {doc.get('schema')!r}) with a missing or "
            f"malformed field ({type(e).__name__}: {e}); it may be cut short or edited by hand. "
            "Write it again with redline's --json") from None


def _title(kinds: list[str]) -> str:
    if kinds == ["report", "tune"]:
        return "redline: naive run and tuned"
    if len(kinds) != 1:
        return "redline: " + ", ".join(kinds)
    return {"report": "redline report", "trace": "redline trace analysis",
            "tune": "redline tuning result",
            "compare": "redline comparison"}.get(kinds[0], "redline")


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;
background:#fafafa}
header{background:#222;color:#fff;padding:14px 28px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#ccc;font-size:13px}
main{max-width:1200px;margin:0 auto;padding:8px 28px 40px}
section.doc{background:#fff;border:1px solid #e3e3e3;border-radius:6px;padding:6px 20px 18px;
margin:18px 0}
h2{font-size:17px;margin:22px 0 6px;border-bottom:1px solid #eee;padding-bottom:4px}
p{font-size:14px;line-height:1.45;margin:6px 0}
table{border-collapse:collapse;font-size:13px;margin:8px 0;width:100%}
th,td{border:1px solid #e0e0e0;padding:4px 8px;text-align:left;vertical-align:top}
td:last-child{overflow-wrap:anywhere}
th{background:#f2f2f2}td{font-variant-numeric:tabular-nums}
.chart{width:100%;min-height:120px}
"""

RUNNER = """
(function () {
  var root = document.documentElement, errors = [];
  function note() { root.setAttribute('data-redline-errors', String(errors.length));
    root.setAttribute('data-redline-error-text', errors.join(' | ')); }
  window.addEventListener('error', function (e) { errors.push(String(e.message)); note(); });
  note();
  var charts = JSON.parse(document.getElementById('redline-charts').textContent);
  var ids = Object.keys(charts), done = 0;
  root.setAttribute('data-redline-charts', String(ids.length));
  function finished() {
    var external = (performance.getEntriesByType('resource') || []).filter(function (r) {
      return !/^(file|data|blob|about):/.test(r.name); });
    root.setAttribute('data-redline-external-requests', String(external.length));
    root.setAttribute('data-redline-rendered', String(done));
  }
  if (!window.Plotly) { errors.push('plotly.js did not load'); note(); finished(); return; }
  ids.forEach(function (id) {
    var f = charts[id];
    try {
      Plotly.newPlot(id, f.data, f.layout, {responsive: true, displaylogo: false})
        .then(function () { done += 1; if (done === ids.length) { finished(); } },
              function (e) { errors.push(id + ': ' + e); note(); });
    } catch (e) { errors.push(id + ': ' + e); note(); }
  });
  if (!ids.length) { finished(); }
})();
"""


def _script_json(obj: Any) -> str:
    """JSON that can sit inside a <script> element: no '</' can close it early."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


def render_html(docs: list[dict[str, Any]], sources: list[str] | None = None) -> str:
    """The page for ``docs`` (each a redline JSON document), as one string."""
    if not docs:
        raise HtmlReportError("no document to show: give a redline JSON report")
    names = sources or [f"document {i + 1}" for i in range(len(docs))]
    kinds = [kind_of(document, doc_name) for document, doc_name in zip(docs, names, strict=True)]
    parts: list[str] = []
    figures: dict[str, Any] = {}
    for doc, kind, name in zip(docs, kinds, names, strict=True):
        heading = {"report": "Measured run", "trace": "Trace analysis",
                   "tune": "Tuning", "compare": "Comparison"}[kind]
        parts.append(f'<section class="doc" data-kind="{kind}"><h2>{html.escape(heading)}'
                     f'</h2>')
        for block in blocks_of(doc, name):
            if block.kind == "h2":
                parts.append(f"<h2>{html.escape(block.text)}</h2>")
            elif block.kind == "p":
                parts.append(f"<p>{html.escape(block.text)}</p>")
            elif block.kind == "table":
                head = "".join(f"<th>{html.escape(header)}</th>" for header in block.headers)
                body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row)
                               + "</tr>" for row in block.rows)
                parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
                             "</table>")
            elif block.kind == "chart":
                cid = f"chart-{len(figures) + 1}"
                figures[cid] = block.figure
                parts.append(f'<div class="chart" id="{cid}"></div>')
        parts.append("</section>")
    title = _title(kinds)
    sub = " · ".join(html.escape(shown_name) for shown_name in names)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
        f"<script>{_plotly_js()}</script></head><body>"
        f"<header><h1>{html.escape(title)}</h1><p>{sub}</p></header><main>"
        + "".join(parts)
        + "</main>"
        f'<script type="application/json" id="redline-data">{_script_json(docs)}</script>'
        f'<script type="application/json" id="redline-charts">{_script_json(figures)}</script>'
        f"<script>{RUNNER}</script></body></html>\n")


def write_html(docs: list[dict[str, Any]], path: str | os.PathLike[str],
               sources: list[str] | None = None) -> Path:
    """Write the page atomically (whole or absent)."""
    return write_text_atomic(render_html(docs, sources), path)


def read_documents(paths: list[str]) -> list[dict[str, Any]]:
    """Read redline JSON documents for ``redline report``; each error names the file."""
    docs: list[dict[str, Any]] = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise HtmlReportError(f"{path}: cannot read it ({e.strerror or e})") from None
        except UnicodeDecodeError:
            raise HtmlReportError(f"{path}: not UTF-8 text; expected a JSON file written by "
                                  "redline --json") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise HtmlReportError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: "
                                  f"{e.msg}); expected a file written by redline --json") \
                from None
        kind_of(doc, path)
        docs.append(doc)
    return docs
