"""Numbers in the report's sentences."""

from __future__ import annotations

import pytest

from redline.core.words import ordinal


@pytest.mark.parametrize(("n", "word"), [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"),
                                          (11, "11th"), (12, "12th"), (13, "13th"), (21, "21st"),
                                          (102, "102nd"), (111, "111th"), (1024, "1024th")])
def test_ordinals(n: int, word: str) -> None:
    assert ordinal(n) == word
