"""A fast path for files in Kineto's own layout (what torch.profiler writes).

Kineto writes one event per block, blocks separated by exactly ``"\\n  },\\n  {"``. A JSON string
cannot hold a raw newline, so that separator never occurs inside a name: splitting on it yields
each event's text. Events of the categories no analysis reads (cpu_op, flow arrows — most of a
trace) are recognised by a byte search and never parsed. Other layouts (compact JSON, other
producers) go through the general parsers in :mod:`redline.trace.load`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import orjson

from redline.trace.select import NO_DEVICE_WORK

SEP = b"\n  },\n  {"
OPEN = b'"traceEvents": [\n  {'
SKIP_CATS = frozenset({b"cpu_op", b"ac2g", b"fwdbwd", b"python_function"})
RUNTIME_CATS = frozenset({b"cuda_runtime", b"cuda_driver"})
"""Categories no analysis reads; a ProfilerStep annotation is kept whatever its category."""

BLOCK = 4 * 2**20
"""Bytes decompressed and split at a time: peak memory beyond the kept events is ~2 blocks."""


class Readable(Protocol):
    def read(self, n: int = ..., /) -> bytes: ...


class LayoutError(ValueError):
    """The bytes are not in Kineto's layout, or an event block did not parse."""


def _find_close(buf: bytes) -> tuple[int, int] | None:
    """(start, end) of the events array's closing ``\n  }\n]`` (Kineto indents the ']' by 0
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


def _keep(chunk: bytes) -> bool:
    # Kineto writes '"ph": "X", "cat": "<category>", "name": ...' at the start of each event.
    i = chunk.find(b'"cat": "', 0, 96)
    if i < 0:
        return True  # unusual event: let the general filter decide
    j = chunk.find(b'"', i + 8, i + 64)
    cat = chunk[i + 8:j]
    if cat in SKIP_CATS:
        return b'"name": "ProfilerStep#' in chunk[:256]
    if cat in RUNTIME_CATS:
        k = chunk.find(b'"name": "', j, j + 32)
        if k >= 0:
            m = chunk.find(b'"', k + 9, k + 128)
            return chunk[k + 9:m].decode() not in NO_DEVICE_WORK
    return True


def _parse(chunks: list[bytes], first_index: int) -> Iterator[Any]:
    loads = orjson.loads
    for n, c in enumerate(chunks):
        if _keep(c):
            try:
                yield loads(b"{" + c + b"}")
            except orjson.JSONDecodeError as e:
                raise LayoutError(f"event #{first_index + n} does not parse: {e}") from e


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
    return meta, _parse(text[k + len(OPEN):end].split(SEP), 0)


def is_kineto_head(head: bytes) -> bool:
    return OPEN in head


def split_stream(f: Readable, name: str) -> Iterator[Any]:
    """Kept events of a file in Kineto's layout, read block by block (bounded memory)."""
    buf = f.read(BLOCK)
    k = buf.find(OPEN)
    if k < 0:
        raise LayoutError("not in Kineto's layout")
    buf = buf[k + len(OPEN):]
    seen = 0
    while True:
        parts = buf.split(SEP)
        buf = parts.pop()  # the last block may be incomplete
        yield from _parse(parts, seen)
        seen += len(parts)
        block = f.read(BLOCK)
        if not block:
            break
        buf += block
    close = _find_close(buf)
    if close is None:
        raise LayoutError(f"the trace ends inside event #{seen}: truncated?")
    yield from _parse([buf[:close[0]]], seen)
