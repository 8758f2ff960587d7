"""The peers' two code changes for the diagnosis benchmark, off unless ``DIAG_PEER`` names one.

redline needs no change to a script, traceml-ai and gpuprof each need the lines their READMEs
tell a user to add: traceml ``traceml.init(mode="auto")`` once and the step body under
``with traceml.trace_step(model):``; gpuprof ``with gpuprof.profile(name):`` around the loop.
A job calls ``training(name)`` around its loop and ``step(model)`` around each step; with
``DIAG_PEER`` unset (redline, or a plain run) both are no-ops.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

PEER = os.environ.get("DIAG_PEER", "")


@contextlib.contextmanager
def training(name: str) -> Iterator[None]:
    """Around the training loop: traceml's init, or gpuprof's profile context."""
    if PEER == "traceml":
        import traceml_ai as traceml

        traceml.init(mode="auto")
        yield
    elif PEER == "gpuprof":
        import gpuprof

        with gpuprof.profile(name):
            yield
    else:
        yield


def step(model: Any) -> contextlib.AbstractContextManager[None]:
    """Around one step's body: traceml's step wrapper; nothing for the others."""
    if PEER == "traceml":
        import traceml_ai as traceml

        return traceml.trace_step(model)  # type: ignore[no-any-return]
    return contextlib.nullcontext()
