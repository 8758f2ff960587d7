"""The plain-text tables ``redline trace`` prints: they fit the width, wrap long text inside
its column, keep numbers whole, and write ANSI styles only to a terminal."""

from __future__ import annotations

import io

import pytest

from redline.report.text_table import Cell, Column, Output

SENTENCE = "a sentence much longer than the forty columns the table may take"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_table_fits_the_width_and_wraps_only_its_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    buf = io.StringIO()
    out = Output(buf)
    out.table("Findings", [Column(header="#", right=True), Column(header="what", wrap=True),
                           Column(header="total ms", right=True)],
              [["1", SENTENCE, "12,345.67"]])
    lines = buf.getvalue().splitlines()
    assert lines[0] == "Findings"
    assert max(len(line) for line in lines) <= 40
    assert sum("12,345.67" in line for line in lines) == 1  # numbers are never cut
    words = [w for line in lines[4:-1] for w in line.split("│")[2].split()]
    assert words == SENTENCE.split()  # wrapped inside its column, every word kept, in order
    assert len(lines) > 6  # on several lines
    assert "\x1b" not in buf.getvalue()  # not a terminal: no ANSI codes


def test_styles_go_to_a_terminal_unless_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    tty = _Tty()
    Output(tty).table("", [Column(header="id")], [[Cell(text="host_sync", styles=("bold red",))]])
    assert "\x1b[1;31mhost_sync" in tty.getvalue()
    monkeypatch.setenv("NO_COLOR", "1")
    plain = _Tty()
    Output(plain).table("", [Column(header="id")], [[Cell(text="host_sync", styles=("bold",))]])
    assert "\x1b" not in plain.getvalue() and "host_sync" in plain.getvalue()
