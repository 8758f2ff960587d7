"""What the planner accepts: every numeric input finite, positive and within a stated limit, and
the error it raises otherwise.

The limits are far above any machine or model built so far, so that they refuse only a typo
or a value that cannot be physical (``inf``, ``1e30``), and low enough that the arithmetic
stays exact and the search stays short. Messages name the input by its field (the keyword of
the function that takes it, in backquotes: `` `gpus` ``); the CLI turns them into its
flags.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from redline.core.errors import RedlineError


class PlanInputError(RedlineError, ValueError):
    """A planning input that cannot be used; the message names the field, the value received,
    what was expected and what to do."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limit:
    """The largest value a field accepts and why that bound."""

    maximum: float
    """Inclusive upper bound, in the field's own unit."""
    why: str
    """What the bound is measured against (the largest such thing known)."""
    minimum: float = 0.0
    """Inclusive lower bound of a rate or size (0: any value > 0); counts start at 1."""
    low_why: str = ""
    """What the lower bound is measured against."""


MAX_GPUS = 1_048_576
"""2²⁰ GPUs: about five times the largest training clusters announced (xAI Colossus, 200,000
GPUs, 2025)."""

MAX_LAYOUTS = 10_000
"""Layouts one search evaluates at most (about 0.3 s): past it the micro-batch sizes, then the
pipeline degrees, are thinned to a geometric ladder and the result says so."""

LIMITS: dict[str, Limit] = {
    "params": Limit(maximum=1e14, why="100 T parameters, 50 times the largest published "
                    "models"),
    "layers": Limit(maximum=100_000, why="100,000 layers (the deepest published transformers "
                    "have about 1,000)"),
    "hidden": Limit(maximum=1_048_576, why="a hidden size of 2²⁰ (the widest published: "
                    "about 25,600)"),
    "heads": Limit(maximum=1_048_576, why="2²⁰ attention heads"),
    "seq": Limit(maximum=100_000_000, why="100 M tokens per sequence, 100 times the longest "
                 "published training contexts"),
    "vocab": Limit(maximum=100_000_000, why="100 M tokens of vocabulary (the largest "
                   "published: about 256,000)"),
    "kv_heads": Limit(maximum=1_048_576, why="2²⁰ key/value heads"),
    "head_dim": Limit(maximum=1_048_576, why="a head width of 2²⁰"),
    "ffn_hidden": Limit(maximum=16_777_216, why="an MLP width of 2²⁴"),
    "largest_layer_params": Limit(maximum=1e14, why="as for `params`"),
    "gpus": Limit(maximum=MAX_GPUS, why="about five times the largest training clusters "
                  "announced"),
    "gpus_per_node": Limit(maximum=1_024, why="1,024 GPUs in one node's fast domain (NVL72 "
                           "racks join 72)"),
    "global_batch": Limit(maximum=1e9, why="10⁹ sequences per step (published LLM runs use "
                          "about 10³–10⁴)"),
    "memory_gb": Limit(maximum=10_000, why="10 TB per GPU (the largest GPUs hold 288 GB)",
                       minimum=0.001, low_why="1 MB"),
    "peak_tflops": Limit(maximum=100_000, why="100 PFLOP/s per GPU (a B200's dense FP4 is "
                         "about 9 PFLOP/s)", minimum=0.001,
                         low_why="1 GFLOP/s, less than one CPU core"),
    "intra_node_gbps": Limit(maximum=100_000, why="100 TB/s per GPU and direction (NVLink 5: "
                             "900 GB/s)", minimum=0.001, low_why="1 MB/s"),
    "inter_node_gbps": Limit(maximum=100_000, why="100 TB/s per GPU and direction (8 × 800 "
                             "Gb/s NICs: 800 GB/s per node)", minimum=0.001, low_why="1 MB/s"),
    "price_per_gpu_hour": Limit(maximum=100_000, why="100,000 per GPU-hour"),
    "steps": Limit(maximum=1e12, why="10¹² optimizer steps"),
    "mfu": Limit(maximum=1.0, why="the peak itself: a fraction of it", minimum=0.001,
                 low_why="0.1 % of the peak; published training runs reach 20–60 %"),
}
"""Field → its limit. Every count is also a whole number ≥ 1, every rate > 0 and at least its
``minimum`` (a smaller one would make times overflow to infinity)."""


def _fmt(v: float) -> str:
    if isinstance(v, bool):
        return repr(v)
    if isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v.is_integer()
                              and abs(v) < 1e18):
        return f"{int(v):,}"
    return f"{v:g}" if isinstance(v, float) else repr(v)


def _limit_text(field: str) -> str:
    lim = LIMITS[field]
    return f"at most {_fmt(lim.maximum)} ({lim.why})"


def whole(field: str, value: object, *, what: str) -> int:
    """``value`` as a count: a whole number from 1 to the field's limit.

    Args:
        field: the input's field name, as the limit table and the messages name it.
        value: what was received (a float is accepted when it is whole, e.g. ``7e9``).
        what: what the field counts, in words, for the message.

    Returns:
        The value as an ``int``.

    Raises:
        PlanInputError: not a number, not finite, not whole, below 1 or above the limit.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PlanInputError(f"`{field}` ({what}) must be a whole number, got {value!r}")
    if not math.isfinite(value):
        raise PlanInputError(f"`{field}` ({what}) must be a finite whole number, got {value}: "
                             "give the real count")
    if value < 1 or value != int(value):
        raise PlanInputError(f"`{field}` ({what}) must be a whole number >= 1, got "
                             f"{_fmt(value)}")
    if value > LIMITS[field].maximum:
        raise PlanInputError(f"`{field}` ({what}) is {_fmt(value)}, {_limit_text(field)}: "
                             "check the value")
    return int(value)


def positive(field: str, value: object, *, what: str) -> float:
    """``value`` as a rate or size: a finite number > 0 up to the field's limit.

    Args:
        field: the input's field name, as the limit table and the messages name it.
        value: what was received.
        what: what the field measures, with its unit, for the message.

    Returns:
        The value as a ``float``.

    Raises:
        PlanInputError: not a number, not finite, not > 0 or above the limit.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PlanInputError(f"`{field}` ({what}) must be a number, got {value!r}")
    if not math.isfinite(value):
        raise PlanInputError(f"`{field}` ({what}) must be a finite number, got {value}: give "
                             "the measured or datasheet value")
    if value <= 0:
        raise PlanInputError(f"`{field}` ({what}) must be > 0, got {_fmt(value)}")
    lim = LIMITS[field]
    if value < lim.minimum:
        raise PlanInputError(f"`{field}` ({what}) is {_fmt(value)}, at least "
                             f"{_fmt(lim.minimum)} ({lim.low_why}): check the unit and the "
                             "value")
    if value > LIMITS[field].maximum:
        raise PlanInputError(f"`{field}` ({what}) is {_fmt(value)}, {_limit_text(field)}: "
                             "check the unit and the value")
    return float(value)
