"""Optional sections of the measurements: a failure makes the section unknown, never the report.

A section that only some runs have (DDP's and FSDP2's statistics, the evaluation inside the
loop) reads framework internals that may be absent, changed in another torch, or — after a
Ctrl-C during a lazy import — half-initialised. Decorated with :func:`optional_section`, such a
function returns None (the section is unknown, as when the run had none) and warns with
:class:`SectionUnknown`; ``build_report`` turns the warning into a note of the report.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class SectionUnknown(UserWarning):
    """An optional section of the measurements could not be built (see the module)."""


def optional_section(name: str) -> Callable[[Callable[P, T | None]], Callable[P, T | None]]:
    """``fn`` returns None, with a :class:`SectionUnknown` warning naming the section
    ``name`` and the error, instead of raising."""

    def wrap(fn: Callable[P, T | None]) -> Callable[P, T | None]:
        @functools.wraps(fn)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> T | None:
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                warnings.warn(SectionUnknown(
                    f"the {name} section could not be built ({type(e).__name__}: {e}); it is "
                    "unknown in this report"), stacklevel=2)
                return None

        return guarded

    return wrap
