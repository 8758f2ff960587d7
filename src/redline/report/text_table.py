"""Plain-text tables and styled lines for a terminal, in the look of the rich tables the other
reports print (heavy header rule, light body), from the standard library alone.

``redline trace`` prints with these: importing rich costs ~30 ms and ~7 MB, as much as the
analysis of a small trace. Colour and bold are ANSI codes, written only to a terminal and not
when ``NO_COLOR`` is set (https://no-color.org).
"""

from __future__ import annotations

import os
import sys
import textwrap

from redline.core.record import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from typing import TextIO

STYLES = {"bold": "1", "dim": "2", "italic": "3", "red": "31", "green": "32", "yellow": "33",
          "cyan": "36"}
"""Style words → ANSI SGR codes (ECMA-48 §8.3.117)."""

DEFAULT_WIDTH = 80
"""Columns when the output is no terminal and ``COLUMNS`` is unset (as rich assumes)."""
MIN_WRAPPED_WIDTH = 12
"""A wrapped column is never made narrower than this."""


@record
class Column:
    """A table column: its header, justification and whether its text wraps."""

    header: str
    right: bool = False
    """Right-justified (numbers)."""
    wrap: bool = False
    """Long text wraps inside the column when the table is wider than the terminal."""


@record
class Cell:
    """A cell's text (lines split on newlines) and the style of each line ("bold red", ...;
    the last one holds for the lines after it)."""

    text: str
    styles: tuple[str, ...] = ()


class Output:
    """Where a report is printed: the stream, its width, and whether it takes ANSI styles."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = sys.stdout if stream is None else stream
        is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.color = (is_tty and "NO_COLOR" not in os.environ
                      and os.environ.get("TERM") != "dumb")
        self.width = _width(self.stream, is_tty)

    def style(self, text: str, style: str) -> str:
        codes = [STYLES[word] for word in style.split() if word in STYLES]
        if not self.color or not codes or not text:
            return text
        return f"\x1b[{';'.join(codes)}m{text}\x1b[0m"

    def line(self, text: str = "", style: str = "") -> None:
        """``text`` wrapped at the width (text holding ANSI codes is written as it is)."""
        if len(text) > self.width and "\x1b" not in text:
            text = "\n".join(textwrap.wrap(text, self.width, break_on_hyphens=False))
        self.stream.write(self.style(text, style) + "\n")

    def rule(self, title: str) -> None:
        """A full-width line with ``title`` in its middle."""
        side = max(2, self.width - len(title) - 2)
        left = side // 2
        self.line("─" * left + " " + self.style(title, "bold") + " " + "─" * (side - left))

    def table(self, title: str, columns: list[Column], rows: list[list[str | Cell]],
              lines_between: bool = False) -> None:
        for text in _table(self, title, columns, rows, lines_between):
            self.stream.write(text + "\n")


def _width(stream: TextIO, is_tty: bool) -> int:
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if is_tty:
        try:
            return os.get_terminal_size(stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            pass
    return DEFAULT_WIDTH


def _cell(value: str | Cell) -> Cell:
    return value if isinstance(value, Cell) else Cell(text=value)


def _fit(columns: list[Column], natural: list[int], floor: list[int], width: int) -> list[int]:
    """Column widths: each its natural width, narrowed (widest first) until the table fits
    ``width``: wrapped columns down to :data:`MIN_WRAPPED_WIDTH`, then any column down to its
    ``floor`` (its widest cell, or its header's longest word: the header wraps)."""
    widths = list(natural)
    frame = 3 * len(columns) + 1  # "│ " before each cell, " " after, the last "│"
    least = [MIN_WRAPPED_WIDTH if column.wrap else floor[i] for i, column in enumerate(columns)]
    while sum(widths) + frame > width:
        narrowable = [i for i in range(len(columns)) if widths[i] > least[i]]
        if not narrowable:
            break
        widest = max(narrowable, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


def _lines(cell: Cell, width: int, wrap: bool) -> list[tuple[str, str]]:
    """(text, style) per printed line of a cell."""
    out: list[tuple[str, str]] = []
    for k, part in enumerate(cell.text.split("\n")):
        style = cell.styles[min(k, len(cell.styles) - 1)] if cell.styles else ""
        pieces = textwrap.wrap(part, width) if wrap and len(part) > width else [part]
        out.extend((piece, style) for piece in pieces or [""])
    return out


def _table(out: Output, title: str, columns: list[Column], rows: list[list[str | Cell]],
           lines_between: bool) -> list[str]:
    cells = [[_cell(value) for value in row] for row in rows]
    widest_cell = [max([0] + [len(line) for row in cells for line in row[i].text.split("\n")])
                   for i in range(len(columns))]
    natural = [max(len(column.header), widest_cell[i]) for i, column in enumerate(columns)]
    floor = [max([widest_cell[i]] + [len(word) for word in column.header.split()])
             for i, column in enumerate(columns)]
    widths = _fit(columns, natural, floor, out.width)

    def border(left: str, fill: str, mid: str, right: str) -> str:
        return left + mid.join(fill * (width + 2) for width in widths) + right

    def printed(row_lines: list[list[tuple[str, str]]], bar: str) -> list[str]:
        height = max(len(lines) for lines in row_lines)
        text = []
        for k in range(height):
            parts = []
            for i, lines in enumerate(row_lines):
                piece, style = lines[k] if k < len(lines) else ("", "")
                padded = piece.rjust(widths[i]) if columns[i].right else piece.ljust(widths[i])
                parts.append(" " + out.style(padded, style) + " ")
            text.append(bar + bar.join(parts) + bar)
        return text

    lines = [out.style(title, "italic")] if title else []
    lines.append(border("┏", "━", "┳", "┓"))
    lines += printed([_lines(Cell(text=column.header, styles=("bold",)), widths[i], True)
                      for i, column in enumerate(columns)], "┃")
    lines.append(border("┡", "━", "╇", "┩"))
    for row_index, row in enumerate(cells):
        if row_index and lines_between:
            lines.append(border("├", "─", "┼", "┤"))
        lines += printed([_lines(cell, widths[i], columns[i].wrap) for i, cell in enumerate(row)], "│")
    lines.append(border("└", "─", "┴", "┘"))
    return lines
