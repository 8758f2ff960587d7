"""Read Kineto (Chrome-trace JSON) files into compact per-rank event lists.

Robust to what real traces contain: gzip or plain JSON; float nanosecond-resolution
timestamps; ROCm (``hip*``) runtime names; runtime events whose ``stream`` is a string
(``'0x0'`` in ROCm traces); missing ``distributedInfo`` (rank from the file name, else 0, with a
warning). A truncated or malformed file raises :class:`TraceError` naming the file and where
it broke.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import warnings
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from redline.core.record import record
from redline.trace.events import (
    GPU_CATEGORIES,
    KEPT_CATEGORIES,
    KEPT_NAME_PREFIXES,
    NO_DEVICE_WORK,
    RUNTIME_CATEGORIES,
    Event,
    RankTrace,
    ReadCounts,
    TraceError,
)
from redline.trace.kineto_fast import (
    COMPACT,
    ORJSON_MIN_BYTES,
    KinetoEvents,
    LayoutError,
    block_layout,
    gunzip_blocks,
    loads,
    plain_blocks,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from typing import Any

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def _read_bytes(path: Path) -> bytes:
    """The file's JSON text, gunzipped if needed."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot read the file ({e.strerror})") from e
    if raw[:2] == b"\x1f\x8b":
        import gzip  # here: files in Kineto's layout (most) are gunzipped through zlib alone

        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            got = zlib.decompressobj(wbits=31)
            try:
                n = len(got.decompress(raw))
                where = f"{n:,} bytes of JSON came out before it ends"
            except zlib.error:
                where = "it does not decompress"
            raise TraceError(f"{path}: the gzip stream is corrupt or truncated ({e}; {where}, "
                             f"{len(raw):,} bytes on disk); re-copy the trace or re-record "
                             "it") from e
    return raw


def _parse_json(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        doc = loads(raw, fast=len(raw) >= ORJSON_MIN_BYTES)
    except json.JSONDecodeError as e:
        # A cut-off file fails at (or in a string running to) its very end.
        truncated = e.pos >= len(raw) - 2 or e.msg.startswith("Unterminated")
        hint = " (the file ends early: truncated?)" if truncated else ""
        raise TraceError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno} "
                         f"(byte {e.pos} of {len(raw)}): {e.msg}{hint}") from e
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not a text JSON file ({e.reason} at byte {e.start})") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        got = type(doc).__name__ if not isinstance(doc, dict) else f"keys {sorted(doc)[:6]}"
        raise TraceError(f"{path}: expected a Chrome-trace object with a 'traceEvents' list "
                         f"(torch.profiler / Kineto JSON), got {got}")
    return doc


STREAM_MIN_BYTES = 64 * 2**20
"""Files at least this big on disk are streamed event by event (ijson's C backend) instead of
parsed whole, so memory follows the events kept, not the file size."""


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _text_bytes(path: Path, gz: bool, size: int) -> int:
    """The file's JSON text in bytes (``size``: on disk): a gzip file's ISIZE trailer (RFC
    1952, 2.3.1: the last member's input size modulo 2**32; a file larger on disk is larger
    still)."""
    if not gz or size < 4:
        return size
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        return max(size, int.from_bytes(f.read(4), "little"))


def _stream_meta(path: Path, gz: bool) -> dict[str, Any]:
    """The top-level keys written before 'traceEvents' (Kineto writes its metadata first)."""
    if gz:
        import gzip

        opener: Any = gzip.open
    else:
        opener = open
    try:
        with opener(path, "rb") as f:
            head = f.read(4 * 2**20)
    except (OSError, EOFError, zlib.error) as err:
        raise TraceError(f"{path}: the gzip stream is corrupt or truncated ({err}); re-copy "
                         "the trace or re-record it") from err
    k = head.find(b'"traceEvents"')
    if k < 0:
        raise TraceError(f"{path}: no 'traceEvents' in the first 4 MiB: expected a Chrome-trace "
                         "object (torch.profiler / Kineto JSON)")
    try:
        meta: dict[str, Any] = json.loads(head[:k] + b'"traceEvents": []}')
    except json.JSONDecodeError:
        return {}  # metadata we cannot read cheaply: rank from the file name
    meta.pop("traceEvents", None)
    if "distributedInfo" not in meta:
        # Written after the events by some producers: one more pass, in ijson's C parser.
        import ijson

        try:
            with opener(path, "rb") as f:
                info = next(ijson.items(f, "distributedInfo"), None)
        except (ijson.JSONError, OSError, EOFError, zlib.error) as err:
            raise TraceError(f"{path}: the trace is corrupt or truncated ({type(err).__name__}: "
                             f"{err})") from err
        if info is not None:
            meta["distributedInfo"] = info
    return meta


HEAD_BYTES = 2**18
"""Bytes read before choosing the reader: Kineto's metadata and first events fit in it."""


def _head(blocks: Iterator[bytes]) -> bytes:
    """At least :data:`HEAD_BYTES` of the file's text (all of it when shorter)."""
    parts: list[bytes] = []
    n = 0
    for block in blocks:
        parts.append(block)
        n += len(block)
        if n >= HEAD_BYTES:
            break
    return b"".join(parts)


def _kineto_events(path: Path, reader: KinetoEvents, raw: Any, size: int) -> Iterator[Any]:
    """The reader's events, with a failure said as where in the file it happened; closes the
    file when done."""
    n = 0
    try:
        for e in reader:
            n += 1
            yield e
    except (LayoutError, OSError, EOFError, zlib.error) as err:
        at = raw.tell()
        where = (f"after {n:,} device and runtime events, at byte {at:,} of {size:,} "
                 f"({at / max(1, size):.0%} of the file)")
        if isinstance(err, LayoutError) and reader.layout is COMPACT:
            raise  # a cut that broke a kept event: load_trace parses the file whole
        if isinstance(err, LayoutError):
            raise TraceError(f"{path}: {err} ({where})") from err
        if isinstance(err, (EOFError, zlib.error)):
            raise TraceError(f"{path}: the gzip stream is corrupt or truncated {where}; "
                             f"{reader.text_bytes:,} bytes of JSON came out before it ends "
                             f"({err}); re-copy the trace or re-record it") from err
        raise TraceError(f"{path}: the trace breaks {where} ({type(err).__name__}: {err}); "
                         "truncated or corrupt? Re-copy or re-record it") from err
    finally:
        raw.close()


def _open_kineto(path: Path, gz: bool,
                 fast: bool) -> tuple[dict[str, Any], Iterator[Any], ReadCounts] | None:
    """(metadata, kept events, counts) of a file in Kineto's layout, streamed from one open of
    the file (memory follows the events kept), parsed through orjson when ``fast``; None for
    another layout, or a file whose start does not read (the general reader says what is
    wrong with it)."""
    raw = open(path, "rb")  # noqa: SIM115 (closed by _kineto_events, or below)
    blocks = gunzip_blocks(raw) if gz else plain_blocks(raw)
    try:
        head = _head(blocks)
        if block_layout(head) is None:
            raw.close()
            return None
        reader = KinetoEvents(head, blocks, fast)
    except (OSError, EOFError, zlib.error, LayoutError):
        raw.close()
        return None
    return reader.meta, _kineto_events(path, reader, raw, path.stat().st_size), reader.counts


def _stream_events(path: Path, gz: bool) -> Iterator[Any]:
    """Every event of a big file in another layout, through ijson's C parser."""
    import gzip

    import ijson

    n = 0
    size = path.stat().st_size
    with open(path, "rb") as raw:
        f: Any = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
        try:
            for e in ijson.items(f, "traceEvents.item", use_float=True):
                n += 1
                yield e
        except (ijson.JSONError, OSError, EOFError, zlib.error) as err:
            at = raw.tell()
            raise TraceError(f"{path}: the trace breaks after {n:,} events, at byte {at:,} of "
                             f"{size:,} ({at / max(1, size):.0%} of the file) "
                             f"({type(err).__name__}: {err}); truncated or corrupt? Re-copy or "
                             "re-record it") from err


def _read_small(path: Path) -> tuple[dict[str, Any], Iterable[Any]]:
    """(metadata, events) of a file small enough to hold, in a layout other than Kineto's:
    a full JSON parse."""
    doc = _parse_json(path, _read_bytes(path))
    return doc, doc["traceEvents"]


def _as_int(v: Any, default: int = -1) -> int:
    if type(v) is int:  # the common case, first (runs for every kept event)
        return v
    if v is None or isinstance(v, bool):
        return default
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v, 0)  # '0x0' in ROCm traces
        except ValueError:
            return default
    return default


def _rank_of(path: Path, doc: dict[str, Any]) -> int:
    info = doc.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    m = _RANK_IN_NAME.search(path.name)
    rank = int(m.group(1)) if m else 0
    warnings.warn(f"{path.name}: no distributedInfo.rank in the trace; using rank {rank} "
                  f"({'from the file name' if m else 'default'})", stacklevel=3)
    return rank


_INF = math.inf
_EXACT_FLOAT_US = float(2**53)
"""Floats beyond 2**53 (µs) are 2 µs or more apart: a time written as one there has lost its
µs digits."""


def _left_out(counts: dict[str, list[Any]], why: str, e: Any) -> None:
    """Count an event with numbers no statistic may use, keeping the first as an example."""
    entry = counts.get(why)
    if entry is None:
        counts[why] = [1, f"{e.get('name')!r} at ts={e.get('ts')!r}, dur={e.get('dur')!r}"]
    else:
        entry[0] += 1


@record
class _Converted:
    """The kept events of one file, and what reading them noticed."""

    events: list[Event]
    left_out: dict[str, list[Any]]
    floaty: bool
    """Some timestamp is fractional (nanosecond resolution)."""
    origin: int | None
    coarse_ulp_us: float


def _convert(p: Path, raw_events: Iterable[Any]) -> _Converted:
    # One pass, converting as we go: a streamed file is never held, and no raw event dict
    # outlives its turn. cpu_op & co. (most events) are skipped unread beyond their category.
    kept_cats, gpu_cats = KEPT_CATEGORIES, GPU_CATEGORIES
    names: dict[str, str] = {}  # one string per distinct name: kernels repeat thousands of times
    events: list[Event] = []
    left_out: dict[str, list[Any]] = {}
    floaty = False
    origin: int | None = None
    """The first kept event's start, whole µs: every time is kept relative to it. Epoch-based
    timestamps (~1.7e15 µs, or ~1e18 from a nanosecond clock read as µs) leave a float too few
    digits for sub-µs differences, so the subtraction is done on the exact integer first."""
    coarse_ulp_us = 0.0
    """The largest spacing between representable times among timestamps the file wrote as
    floats beyond 2**53 µs: finer differences were lost when the file was parsed."""
    new_event, append = object.__new__, events.append
    for i, e in enumerate(raw_events):
        try:
            cat = e.get("cat")
        except AttributeError:
            raise TraceError(f"{p}: traceEvents[{i}] is {type(e).__name__}, expected an "
                             "object") from None
        if cat not in kept_cats:
            if cat is None or not str(e.get("name", "")).startswith(KEPT_NAME_PREFIXES):
                continue
        elif cat in RUNTIME_CATEGORIES and e.get("name") in NO_DEVICE_WORK:
            continue
        if e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if dur is None or ts is None:
            if cat is not None and cat in kept_cats:
                _left_out(left_out, "missing start or duration", e)
            continue
        try:
            ts_f = float(ts)
            dur_f = float(dur)
        except (TypeError, ValueError) as err:
            raise TraceError(f"{p}: traceEvents[{i}] ({e.get('name')!r}) has a non-numeric "
                             f"ts/dur: {ts!r}/{dur!r}") from err
        except OverflowError:  # an integer too large for a float (beyond ~1.8e308)
            ts_f = dur_f = _INF
        if not (0.0 <= dur_f < _INF and -_INF < ts_f < _INF):  # NaN fails both comparisons
            _left_out(left_out, "negative duration" if dur_f < 0 else
                      "NaN or infinite start or duration", e)
            continue
        if origin is None:
            origin = ts if type(ts) is int else math.floor(ts_f)
        if not -_EXACT_FLOAT_US < ts_f < _EXACT_FLOAT_US and type(ts) is int:
            ts_f = float(ts - origin)  # exact: the difference of two integers
            end_f = ts_f + dur_f
        else:
            if not -_EXACT_FLOAT_US < ts_f < _EXACT_FLOAT_US:
                coarse_ulp_us = max(coarse_ulp_us, math.ulp(ts_f))
            # the end as HTA computes it (absolute, then rounded), then moved: subtracting is
            # exact while the two are within a factor of two (Sterbenz's lemma), as the times
            # of one trace are
            end_f = ts_f + dur_f - origin
            ts_f -= origin
        if not floaty and isinstance(ts, float) and not ts.is_integer():
            floaty = True
        args = e.get("args") or {}
        name = e.get("name", "")
        if type(name) is not str:
            name = str(name)
        stream = args.get("stream", -1) if cat in gpu_cats else -1
        corr = args.get("correlation", -1)
        nbytes = args.get("bytes", -1)
        # Each field set by name on a bare instance: Event's generated __init__ called with
        # seven keywords costs 1.2 µs, this 0.4 µs (timeit, CPython 3.11), and it runs once
        # per kept event (a million in a 1 GB trace). Every field is set, none defaulted.
        ev = new_event(Event)
        ev.name = names.setdefault(name, name)
        ev.cat = cat
        ev.ts = ts_f
        ev.end = end_f
        ev.stream = stream if type(stream) is int else _as_int(stream)
        ev.corr = corr if type(corr) is int else _as_int(corr)
        ev.nbytes = nbytes if type(nbytes) is int else _as_int(nbytes)
        append(ev)
    return _Converted(events=events, left_out=left_out, floaty=floaty, origin=origin,
                      coarse_ulp_us=coarse_ulp_us)


def load_trace(path: str | Path, hta_compat: bool = False) -> RankTrace:
    """Read one trace file.

    Args:
        path: a ``.json`` or ``.json.gz`` Kineto trace.
        hta_compat: round times as Holistic Trace Analysis 0.5.0 does when any timestamp is
            fractional — start up (ceil), end down (floor) — which shortens every event by up to
            2 µs (HTA's workaround for pytorch#122425). Off by default: redline keeps the exact
            times (see docs/trace-parity.md for what this changes).

    Returns:
        The file's :class:`RankTrace`: its events (times in µs), rank, device name and compute
        capability (None when the trace does not say), metadata, and the events left out.

    Raises:
        TraceError: the file is missing, unreadable or malformed.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as err:
        if err.errno == errno.ELOOP or (p.is_symlink() and not p.exists()):
            raise TraceError(_missing(p)) from err
        raise TraceError(f"{p}: cannot read the file ({err.strerror})") from err
    big = size >= STREAM_MIN_BYTES
    gz = _is_gzip(p)
    kineto = _open_kineto(p, gz, _text_bytes(p, gz, size) >= ORJSON_MIN_BYTES)
    counts: ReadCounts | None = None
    done: _Converted | None = None
    if kineto is not None:  # a known layout, block by block at any size
        doc, raw_events, counts = kineto
        try:
            done = _convert(p, raw_events)
        except LayoutError:  # a compact file whose separator cut a kept event: parse it whole
            counts = None
    if done is None:
        if big:  # other layouts: streamed through ijson when big, else parsed whole
            doc = _stream_meta(p, gz)
            done = _convert(p, _stream_events(p, gz))
        else:
            doc, whole = _read_small(p)
            done = _convert(p, whole)
    events, left_out, floaty = done.events, done.left_out, done.floaty
    origin, coarse_ulp_us = done.origin, done.coarse_ulp_us
    if coarse_ulp_us:
        warnings.warn(f"{p.name}: timestamps near {origin:.3g} µs are written as floating-point "
                      f"numbers, which resolve only {coarse_ulp_us:g} µs there: shorter "
                      "durations and gaps are not resolved. Write integer (or relative) "
                      "timestamps to keep their precision.", stacklevel=2)
    if hta_compat and floaty:
        # HTA rounds when the ts column is float, i.e. when the file has fractional timestamps.
        for ev in events:
            ev.ts, ev.end = float(math.ceil(ev.ts)), float(math.floor(ev.end))
    props = doc.get("deviceProperties")
    device, cc = None, None
    if isinstance(props, list) and props and isinstance(props[0], dict):
        device = props[0].get("name")
        if isinstance(props[0].get("computeMajor"), int):
            cc = float(f"{props[0]['computeMajor']}.{props[0].get('computeMinor', 0)}")
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    return RankTrace(path=str(p), rank=_rank_of(p, doc), events=events, device_name=device,
                     float_timestamps=floaty, metadata=meta, compute_capability=cc,
                     left_out={why: (n, ex) for why, (n, ex) in left_out.items()},
                     read_counts=counts)


def trace_files(paths: list[str | Path]) -> list[Path]:
    """Expand folders into their ``*.json`` / ``*.json.gz`` files (one per rank).

    Args:
        paths: trace files and folders of them.

    Returns:
        The files, in the order given; a folder's files sorted by name.

    Raises:
        TraceError: a path does not exist, or a folder holds no trace file.
    """
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted([*p.glob("*.json"), *p.glob("*.json.gz")])
            if not found:
                raise TraceError(f"{p}: folder holds no *.json or *.json.gz trace")
            out.extend(found)
        elif p.exists():
            out.append(p)
        else:
            raise TraceError(_missing(p))
    return out


def _missing(p: Path) -> str:
    """Why ``p`` cannot be read: not there, a broken symlink, or a symlink loop."""
    if not p.is_symlink():
        return f"{p}: no such file or folder"
    try:
        p.resolve(strict=True)
    except RuntimeError:  # Python < 3.13 reports a loop so
        return f"{p}: a symlink loop (it points back to itself through {os.readlink(p)!r})"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"{p}: a symlink loop (it points back to itself through {os.readlink(p)!r})"
    return f"{p}: a symlink to {os.readlink(p)!r}, which does not exist"
