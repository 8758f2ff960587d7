"""Read Kineto (Chrome-trace JSON) files into compact per-rank event lists.

Robust to what real traces contain: gzip or plain JSON; float nanosecond-resolution
timestamps; ROCm (``hip*``) runtime names; runtime events whose ``stream`` is a string
(``'0x0'`` in ROCm traces); missing ``distributedInfo`` (rank from the file name, else 0, with a
warning). A truncated or malformed file raises :class:`TraceError` naming the file and where
it broke.
"""

from __future__ import annotations

import errno
import gzip
import json
import math
import os
import re
import warnings
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from redline.trace.events import (
    GPU_CATEGORIES,
    KEPT_CATEGORIES,
    KEPT_NAME_PREFIXES,
    NO_DEVICE_WORK,
    RUNTIME_CATEGORIES,
    Event,
    RankTrace,
    TraceError,
)
from redline.trace.kineto_fast import (
    OPEN,
    LayoutError,
    is_kineto_head,
    split_stream,
    split_whole,
)

_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def _read_bytes(path: Path) -> bytes:
    """The file's JSON text, gunzipped if needed."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot read the file ({e.strerror})") from e
    if raw[:2] == b"\x1f\x8b":
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
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass  # re-parse with the stdlib for its line/column error message
    else:
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            got = type(doc).__name__ if not isinstance(doc, dict) else f"keys {sorted(doc)[:6]}"
            raise TraceError(f"{path}: expected a Chrome-trace object with a 'traceEvents' list "
                             f"(torch.profiler / Kineto JSON), got {got}")
        return doc
    try:
        doc = json.loads(raw)
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


def _stream_meta(path: Path, gz: bool) -> dict[str, Any]:
    """The top-level keys written before 'traceEvents' (Kineto writes its metadata first)."""
    opener = gzip.open if gz else open
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


def _kineto_layout(path: Path, gz: bool) -> bool:
    opener = gzip.open if gz else open
    try:
        with opener(path, "rb") as f:
            return is_kineto_head(f.read(2**20))
    except (OSError, EOFError, zlib.error):
        return False  # the general reader reports what is wrong with the file


def _stream_events(path: Path, gz: bool) -> Iterator[Any]:
    import ijson

    n = 0
    size = path.stat().st_size
    with open(path, "rb") as raw:
        f: Any = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw

        def where() -> str:
            """How far reading got: events read, and the position in the file on disk."""
            at = raw.tell()
            return (f"after {n:,} device and runtime events, at byte {at:,} of {size:,} "
                    f"({at / max(1, size):.0%} of the file)")

        try:
            if is_kineto_head(f.read(len(OPEN) + 4 * 2**20)):
                f.seek(0)
                for e in split_stream(f, str(path)):
                    n += 1
                    yield e
                return
            f.seek(0)
            for e in ijson.items(f, "traceEvents.item", use_float=True):
                n += 1
                yield e
        except LayoutError as err:
            raise TraceError(f"{path}: {err} ({where()})") from err
        except (ijson.JSONError, OSError, EOFError, zlib.error) as err:
            raise TraceError(f"{path}: the trace breaks {where()} ({type(err).__name__}: "
                             f"{err}); truncated or corrupt? Re-copy or re-record it") from err


def _read_small(path: Path) -> tuple[dict[str, Any], Iterable[Any]]:
    """(metadata, events) of a file small enough to hold: Kineto's layout through the fast
    splitter, anything else (or anything odd) through a full JSON parse."""
    raw = _read_bytes(path)
    try:
        meta, events = split_whole(raw)
        return meta, list(events)
    except LayoutError:
        doc = _parse_json(path, raw)
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


def load_trace(path: str | Path, hta_compat: bool = False) -> RankTrace:
    """Read one trace file.

    Args:
        path: a ``.json`` or ``.json.gz`` Kineto trace.
        hta_compat: round times as Holistic Trace Analysis 0.5.0 does when any timestamp is
            fractional — start up (ceil), end down (floor) — which shortens every event by up to
            2 µs (HTA's workaround for pytorch#122425). Off by default: redline keeps the exact
            times (see docs/trace-parity.md for what this changes).
    """
    p = Path(path)
    try:
        big = p.stat().st_size >= STREAM_MIN_BYTES
    except OSError as err:
        if err.errno == errno.ELOOP or (p.is_symlink() and not p.exists()):
            raise TraceError(_missing(p)) from err
        raise TraceError(f"{p}: cannot read the file ({err.strerror})") from err
    raw_events: Iterable[Any]
    gz = _is_gzip(p)
    if big or _kineto_layout(p, gz):
        # Streamed: Kineto's own layout block by block at any size (memory follows the events
        # kept), other layouts through ijson when big.
        doc = _stream_meta(p, gz)
        raw_events = _stream_events(p, gz)
    else:
        doc, raw_events = _read_small(p)
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
        events.append(Event(  # positional, int fast paths: this runs once per kept event
            names.setdefault(name, name), cat, ts_f, end_f,
            stream if type(stream) is int else _as_int(stream),
            corr if type(corr) is int else _as_int(corr),
            nbytes if type(nbytes) is int else _as_int(nbytes),
        ))
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
    return RankTrace(str(p), _rank_of(p, doc), events, device, floaty, meta, cc,
                     {why: (n, ex) for why, (n, ex) in left_out.items()})


def trace_files(paths: list[str | Path]) -> list[Path]:
    """Expand folders into their ``*.json`` / ``*.json.gz`` files (one per rank)."""
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
