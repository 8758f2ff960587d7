"""A fast path for files in Kineto's own layout (what torch.profiler writes).

Kineto writes one event per block, blocks separated by exactly ``"\\n  },\\n  {"``, and starts
each with ``"ph": ..., "cat": ..., "name": ...``. A JSON string cannot hold a raw newline, so
that separator never occurs inside a name. Instead of parsing every event, a regular expression
finds the few categories the analyses read (kernels, copies, syncs, runtime calls, ProfilerStep
marks, gloo's host-side collectives); only those blocks are cut out and parsed. cpu_op events
and flow arrows — most of a trace — are never parsed. Other layouts (compact JSON, other
producers) go through the general parsers in :mod:`redline.trace.load`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Protocol

import orjson

from redline.core.errors import RedlineError
from redline.trace.events import KEPT_NAME_PREFIXES, NO_DEVICE_WORK

SEP = b"\n  },\n  {"
OPEN = b'"traceEvents": [\n  {'
BLOCK = 4 * 2**20
"""Bytes decompressed and scanned at a time: peak memory beyond the kept events is ~2 blocks."""

_KEPT = re.compile(
    rb'"cat": "(?:(kernel|gpu_mem(?:cpy|set)|cuda_sync)|(cuda_runtime|cuda_driver)", '
    rb'"name": "([^"]*))')
"""Starts with a literal so the regex engine skips ahead fast; runtime calls capture their
name (API names never hold quotes) to drop those that do no device work."""
_MARKS = tuple(b'"name": "' + p.encode() for p in KEPT_NAME_PREFIXES)
"""Annotations kept by name (a handful per step), whatever their category."""
_SKIP_RUNTIME = frozenset(n.encode() for n in NO_DEVICE_WORK)


class Readable(Protocol):
    def read(self, n: int = ..., /) -> bytes: ...


class LayoutError(RedlineError, ValueError):
    """The bytes are not in Kineto's layout, or an event block did not parse."""


def _find_close(buf: bytes) -> tuple[int, int] | None:
    """(start, end) of the events array's closing ``\\n  }\\n]`` (Kineto indents the ']' by 0
    or 2 spaces), searching from the end."""
    pos = len(buf)
    while True:
        j = buf.rfind(b"\n  }\n", 0, pos)
        if j < 0:
            return None
        k = j + 5
        while k < len(buf) and buf[k] in b" \t":
            k += 1
        if buf[k:k + 1] == b"]":
            return j, k + 1
        pos = j


def _starts(body: bytes) -> list[int]:
    """Positions of the kept events' category (or ProfilerStep name) marks, in file order."""
    pos = [m.start() for m in _KEPT.finditer(body)
           if m.group(2) is None or m.group(3) not in _SKIP_RUNTIME]
    found = False
    for mark in _MARKS:  # step marks and host collectives, whatever their category
        k = body.find(mark)
        while k >= 0:
            found = True
            pos.append(k)
            k = body.find(mark, k + 1)
    if found:
        pos.sort()
    return pos


def _extract(body: bytes) -> Iterator[Any]:
    """Parsed events of the kept kinds in ``body`` (whole blocks joined by SEP)."""
    loads = orjson.loads
    last = -1
    for pos in _starts(body):
        s = body.rfind(SEP, 0, pos)
        s = 0 if s < 0 else s + len(SEP)
        if s == last:
            continue  # a second mark inside the same event (a kept name in a kept category)
        last = s
        e = body.find(SEP, pos)
        chunk = body[s:] if e < 0 else body[s:e]
        try:
            yield loads(b"{" + chunk + b"}")
        except orjson.JSONDecodeError as err:
            raise LayoutError(f"an event near byte {s} does not parse: {err}") from err


def split_whole(text: bytes) -> tuple[dict[str, Any], Iterator[Any]]:
    """(metadata, kept events) of a whole file in memory."""
    k = text.find(OPEN)
    close = _find_close(text)
    if k < 0 or close is None or close[0] < k:
        raise LayoutError("not in Kineto's layout")
    end, after = close
    try:
        meta = orjson.loads(text[:k] + b'"traceEvents": []' + text[after:])
    except orjson.JSONDecodeError as e:
        raise LayoutError(f"metadata does not parse: {e}") from e
    if not isinstance(meta, dict):
        raise LayoutError("top level is not an object")
    meta.pop("traceEvents", None)
    return meta, _extract(text[k + len(OPEN):end])


def is_kineto_head(head: bytes) -> bool:
    return OPEN in head


def split_stream(f: Readable, name: str) -> Iterator[Any]:
    """Kept events of a file in Kineto's layout, read block by block (bounded memory)."""
    buf = f.read(BLOCK)
    k = buf.find(OPEN)
    if k < 0:
        raise LayoutError("not in Kineto's layout")
    buf = buf[k + len(OPEN):]
    while True:
        cut = buf.rfind(SEP)
        if cut >= 0:  # everything before the last separator is whole events
            yield from _extract(buf[:cut])
            buf = buf[cut + len(SEP):]
        block = f.read(BLOCK)
        if not block:
            break
        buf += block
    close = _find_close(buf)
    if close is None:
        raise LayoutError("the trace ends inside an event: truncated?")
    yield from _extract(buf[:close[0]])
