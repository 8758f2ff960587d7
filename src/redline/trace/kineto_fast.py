"""A fast path for files in Kineto's own layout (what torch.profiler writes).

Kineto writes one event per block, blocks separated by exactly ``"\\n  },\\n  {"``, and starts
each with ``"ph": ..., "cat": ..., "name": ...``. A JSON string cannot hold a raw newline, so
that separator never occurs inside a name. Instead of parsing every event, one regular
expression per layout matches the whole text of the complete ('X') events of the few
categories the analyses read (kernels, copies, syncs, runtime calls, ProfilerStep marks,
gloo's host-side collectives), from its ``"ph"`` to the next separator; only those are parsed,
one JSON array per block of the file. cpu_op events and flow arrows — most of a trace — are
never parsed, so their text may even be malformed: :class:`~redline.trace.events.ReadCounts`
says how many blocks were seen and how many parsed. Other layouts (compact JSON, other producers) go
through the general parsers in :mod:`redline.trace.load`.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterator

from redline.core.errors import RedlineError
from redline.core.record import record
from redline.trace.events import KEPT_NAME_PREFIXES, NO_DEVICE_WORK, ReadCounts

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from typing import Any, Protocol

    class Readable(Protocol):
        def read(self, n: int = ..., /) -> bytes: ...

SEP = b"\n  },\n  {"
OPEN = b'"traceEvents": [\n  {'
COMPACT_SEP = b'}, {"ph": '
COMPACT_OPEN = b'"traceEvents": [{"ph": '
BLOCK = 2**19
"""Bytes read (or decompressed) and scanned at a time: peak memory beyond the kept events is a
few blocks."""
GZIP_BLOCK = 2**15
"""Compressed bytes read at a time (a trace's JSON compresses ~10×: about a block comes out)."""

_SKIP_RUNTIME = b"|".join(re.escape(n.encode()) for n in sorted(NO_DEVICE_WORK))
_MARKS = b"|".join(re.escape(p.encode()) for p in KEPT_NAME_PREFIXES)
_HEAD = (rb'"X", "cat": "(?:(?:kernel|gpu_mem(?:cpy|set)|cuda_sync|cuda_(?:runtime|driver))", '
         rb'"name": "(?!(?:' + _SKIP_RUNTIME + rb')")|[^"]*", "name": "(?:' + _MARKS + rb'))')
"""The start of a kept event after its ``"ph": ``: a complete event of a category the analyses
read, but not a runtime call that does no device work (its name, which never holds a quote, is
one of NO_DEVICE_WORK), or an annotation of any category named by KEPT_NAME_PREFIXES (step
marks, host collectives). Events of other phases ('i', 'f', 's', 'M') no analysis reads."""

# Each pattern starts with a literal, so the engine searches ahead in C for the next event's
# start; the rest of the event is matched up to the layout's separator, so ``findall`` hands
# back whole events and no Python code runs per event of the file (~30 % of the reading time
# of a 15 MB trace went to cutting them out in Python).
_KINETO_KEPT = rb'"ph": ' + _HEAD + rb'[^\n]*(?:\n(?!  \},\n  \{)[^\n]*)*'
"""One kept event of Kineto's layout, from its ``"ph"`` to the line before the separator."""
_COMPACT_KEPT = _HEAD + rb'[^}]*(?:\}(?!, \{"ph": )[^}]*)*'
"""One kept event of the compact layout, from its ``"ph"``'s value (the separator ends with
``"ph": ``) to the ``}`` before the next separator (a string cannot hold the separator's
unescaped quotes)."""


ORJSON_MIN_BYTES = 2**20
"""Files of at least this much JSON text are parsed by orjson, shorter ones by the standard
library: orjson parses kept events ~1.3x faster (~2 ms less per MB of text), but importing it
(it loads uuid, platform and datetime) costs ~3 ms, more than it saves below a MB and ~5 % of
``redline trace`` on a small trace."""


def loads(text: bytes, fast: bool = True) -> Any:
    """Parse JSON ``text`` as the standard library does, through orjson when ``fast``.

    orjson refuses some of what ``json`` reads (NaN and Infinity, which some producers write,
    integers beyond 64 bits): then ``json`` parses it, so a file reads the same at any size.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``), or not UTF-8 (``UnicodeDecodeError``).
    """
    if fast:
        import orjson

        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


class LayoutError(RedlineError, ValueError):
    """The bytes are not in Kineto's layout, or an event block did not parse."""


@record
class Layout:
    """How a writer lays out the events array: the text that opens it (up to the first event's
    body), the text between two events, and the start of a body the separator took along."""

    name: str
    open: bytes
    sep: bytes
    body_start: bytes
    kept: bytes
    """A regular expression matching the text of one kept event, from ``body_start`` on,
    without its closing brace; compiled on first use (through ``re``'s cache: compiling both
    layouts' costs ~1.3 ms, 2 % of ``redline trace`` on a small trace)."""


KINETO = Layout(name="kineto", open=OPEN, sep=SEP, body_start=b"", kept=_KINETO_KEPT)
"""torch.profiler's Kineto: one event per indented block. A JSON string holds no raw newline,
so the separator never occurs inside a name."""
COMPACT = Layout(name="compact", open=COMPACT_OPEN, sep=COMPACT_SEP, body_start=b'"ph": ',
                 kept=_COMPACT_KEPT)
"""``json.dump``'s one line (traces re-written by tools, HTA's sampler), each event starting
with ``"ph"``. The separator's quotes cannot occur unescaped inside a string; it could occur
only in an argument holding a list of objects keyed ``"ph"``, which would cut a kept event in
two and fail its parse (then the whole file is parsed instead), never change a number."""


def plain_blocks(f: Readable) -> Iterator[bytes]:
    """The file's bytes, :data:`BLOCK` at a time."""
    while block := f.read(BLOCK):
        yield block


def gunzip_blocks(f: Readable) -> Iterator[bytes]:
    """The decompressed bytes of a gzip file (members one after the other, as ``gzip`` reads
    them), in pieces of a few MiB; zlib checks each member's CRC-32 and length.

    Raises:
        EOFError: the stream ends inside a member (a truncated file).
        zlib.error: the bytes are not gzip, or fail the check.
    """
    member = zlib.decompressobj(wbits=31)
    pending = False  # inside a member that has not ended yet
    while chunk := f.read(GZIP_BLOCK):
        while chunk:
            if member.eof:
                member = zlib.decompressobj(wbits=31)
            pending = True
            out = member.decompress(chunk)
            if out:
                yield out
            if member.eof:
                pending = False
                chunk = member.unused_data
            else:
                chunk = b""
    if pending:
        raise EOFError("the gzip stream ends early: truncated?")


def _find_close(buf: bytes, layout: Layout) -> tuple[int, int] | None:
    """(start, end) of the events array's closing ``\\n  }\\n]`` (Kineto indents the ']' by 0
    or 2 spaces) or ``}]`` (compact), searching from the end."""
    if layout is COMPACT:
        pos = len(buf)
        while (j := buf.rfind(b"}]", 0, pos)) >= 0:
            try:  # a '}]' inside a string of the metadata after the events leaves no object
                _meta(b'{"traceEvents": []' + buf[j + 2:], "after")
            except LayoutError:
                pos = j
                continue
            return j, j + 2
        return None
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


def _extract(body: bytes, counts: ReadCounts, layout: Layout, fast: bool) -> list[Any]:
    """Parsed events of the kept kinds in ``body`` (whole event bodies joined by the layout's
    separator), through orjson when ``fast`` (see :func:`loads`)."""
    if not body:
        return []
    start = b"{" + layout.body_start
    counts.events += body.count(layout.sep) + 1
    spans: list[bytes] = re.findall(layout.kept, body)
    if not spans:
        return []
    counts.parsed += len(spans)
    try:  # one parse per block: the kept events as one array
        events: list[Any] = loads(b"[" + start + (b"}," + start).join(spans) + b"}]", fast)
    except ValueError as joined:
        for span in spans:  # find the one that breaks, for the message
            try:
                loads(start + span + b"}", fast=False)
            except ValueError as err:
                raise LayoutError(f"the event {span[:120].decode(errors='replace')!r}… does "
                                  f"not parse: {err}") from err
        raise LayoutError(f"the kept events parse one by one but not together: not "
                          f"{layout.name} blocks after all ({joined})") from joined
    return events


def _meta(text: bytes, where: str) -> dict[str, Any]:
    try:
        meta = loads(text, fast=False)  # a few keys
    except ValueError as e:
        raise LayoutError(f"the metadata {where} the events does not parse: {e}") from e
    if not isinstance(meta, dict):
        raise LayoutError("top level is not an object")
    meta.pop("traceEvents", None)
    return meta


class KinetoEvents:
    """The kept events of one file in a known layout (Kineto's, or compact JSON), read block by
    block (memory follows the events kept, not the file). Iterate once; :attr:`meta` holds the
    top-level keys written before the events from the start, and those written after them once
    iterated."""

    def __init__(self, head: bytes, rest: Iterator[bytes], fast: bool = True) -> None:
        """``head``: the file's first bytes of text; ``rest``: the bytes after it; ``fast``:
        parse the events through orjson (see :func:`loads`)."""
        layout = block_layout(head)
        if layout is None:
            raise LayoutError("not in Kineto's layout")
        k = head.find(layout.open)
        self.layout = layout
        self.meta = _meta(head[:k] + b'"traceEvents": []}', "before")
        self.counts = ReadCounts()
        self.fast = fast
        self._buf = head[k + len(layout.open):]
        self._rest = rest
        self.text_bytes = len(head)
        """Bytes of the file's text read so far."""

    def __iter__(self) -> Iterator[Any]:
        buf, counts, layout = self._buf, self.counts, self.layout
        sep = layout.sep
        self._buf = b""
        for block in self._rest:
            self.text_bytes += len(block)
            buf += block
            cut = buf.rfind(sep)
            if cut >= 0:  # everything before the last separator is whole events
                yield from _extract(buf[:cut], counts, layout, self.fast)
                buf = buf[cut + len(sep):]
        close = _find_close(buf, layout)
        if close is None:
            raise LayoutError("the trace ends inside an event: truncated?")
        yield from _extract(buf[:close[0]], counts, layout, self.fast)
        self.meta.update(_meta(b'{"traceEvents": []' + buf[close[1]:], "after"))


def block_layout(head: bytes) -> Layout | None:
    """The layout whose events the block reader can cut out, from the file's first bytes."""
    k = head.find(b'"traceEvents": [')
    if k < 0:
        return None
    for layout in (KINETO, COMPACT):
        if head.startswith(layout.open, k):
            return layout
    return None


def is_kineto_head(head: bytes) -> bool:
    return OPEN in head
