"""The one exception base of redline.

Every error redline raises on purpose derives from :class:`RedlineError`, so a caller can catch
all of them in one clause. Each also keeps the built-in base it always had (``ValueError`` for
bad input, ``RuntimeError`` for a run that cannot go on), so existing ``except`` clauses still
match:

* ``RedlineError``
    * ``TraceError`` (also ``ValueError``): a trace file that cannot be read.
    * ``DoctorError``: a ``redline doctor`` command line that cannot be run.
    * ``SetupError`` (also ``RuntimeError``): a ``redline tune`` factory or what it returned.
    * ``BatchDoesNotFitError`` (also ``RuntimeError``): the model does not fit at batch 1.
    * ``NonFiniteLossError`` (also ``RuntimeError``): the loss is NaN/inf in fp32 already.
    * ``PlanError`` (also ``ValueError``): a plan file that cannot be used.
        * ``PlanMismatchError``: a plan applied to another model, device or inputs.
    * ``StoreFull``: a sample-cache store has no room left (handled inside the cache).
"""

from __future__ import annotations


class RedlineError(Exception):
    """Base of every error redline raises on purpose; the message says what was received,
    what was expected and what to do."""
