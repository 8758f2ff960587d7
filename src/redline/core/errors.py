"""The one exception base of redline.

Every error redline raises on purpose derives from :class:`RedlineError`, so a caller can catch
all of them in one clause. Each also keeps the built-in base it always had (``ValueError`` for
bad input, ``RuntimeError`` for a run that cannot go on), so existing ``except`` clauses still
match. The whole tree, each class with its bases and when it is raised, is in docs/architecture.md
("Errors"), checked against the package by ``tests/test_errors_documented.py``.
"""

from __future__ import annotations


class RedlineError(Exception):
    """Base of every error redline raises on purpose; the message says what was received,
    what was expected and what to do."""
