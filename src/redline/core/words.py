"""Numbers in the report's sentences."""

from __future__ import annotations


def ordinal(n: int) -> str:
    """``n`` as an English ordinal: 1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st, 102nd."""
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
