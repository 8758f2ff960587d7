"""Kineto's block reader: events no analysis uses are skipped as text while reading, never
parsed (so even malformed ones do not matter), and the reader says how many it skipped; the
numbers are those of a full parse; gzip is read as a stream, several members included."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from redline.trace import TraceError, analyze_paths, load_trace
from trace_fixtures import kineto_text, synthetic_events

KEPT_CATEGORIES = {"kernel", "gpu_memcpy", "cuda_runtime"}


def _unused(n: int) -> list[dict[str, object]]:
    """cpu_op events, the bulk of a real trace, which no analysis reads."""
    return [{"ph": "X", "cat": "cpu_op", "name": f"aten::op{i}", "pid": 1, "tid": 1,
             "ts": 1000 + i, "dur": 1, "args": {"External id": i}} for i in range(n)]


def _kept(events: list[dict[str, object]]) -> int:
    return sum(e["cat"] in KEPT_CATEGORIES or str(e["name"]).startswith("ProfilerStep")
               for e in events)


def test_unused_events_are_skipped_unparsed_and_counted(tmp_path: Path) -> None:
    events = synthetic_events() + _unused(50)
    clean = tmp_path / "clean.json"
    clean.write_text(kineto_text(events))
    # the same file with every cpu_op's text broken: a parser that read them would fail
    text = kineto_text(events).replace('"args": {"External id"', '"args": {External id BROKEN')
    assert text.count("BROKEN") == 50
    broken = tmp_path / "broken.json"
    broken.write_text(text)
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)

    t = load_trace(broken)
    assert t.read_counts is not None
    assert t.read_counts.events == len(events)
    assert t.read_counts.parsed == _kept(events) == len(t.events)
    assert t.read_counts.skipped == 50 + 2  # the cpu_ops, the one cpu_op of the fixture, a flow
    a, b = analyze_paths([clean]).ranks[0], analyze_paths([broken]).ranks[0]
    assert a.temporal == b.temporal and a.temporal is not None
    assert a.temporal.window_us == 170  # the hand-computed answer of tests/test_trace.py
    assert (a.kernel_types_us, a.idle_by_stream) == (b.kernel_types_us, b.idle_by_stream)


def test_the_block_reader_gives_the_numbers_of_a_full_parse(tmp_path: Path) -> None:
    events = synthetic_events() + _unused(20)
    kineto = tmp_path / "kineto.json"
    kineto.write_text(kineto_text(events, rank=3))
    doc = json.loads(kineto.read_text())
    compact = tmp_path / "compact.json"  # json.dump's one line: cut at '}, {"ph": '
    compact.write_text(json.dumps(doc))
    dense = tmp_path / "dense.json"  # no spaces: another layout, parsed whole
    dense.write_text(json.dumps(doc, separators=(",", ":")))
    k, c, d = load_trace(kineto), load_trace(compact), load_trace(dense)
    assert d.read_counts is None
    assert k.read_counts == c.read_counts and k.read_counts is not None
    assert k.read_counts.parsed == _kept(events)
    assert k.events == c.events == d.events and k.rank == c.rank == d.rank == 3
    assert k.device_name == d.device_name == "NVIDIA H100 80GB HBM3"


def test_names_holding_braces_quotes_and_separator_text_read_as_in_a_full_parse(
        tmp_path: Path) -> None:
    """A kept event's text is matched up to the layout's separator: braces, escaped quotes and
    the separators' own text inside a name do not end it; an event of a kept category but
    another phase (an instant) is not parsed, as the analyses read complete events only."""
    events = synthetic_events() + _unused(5)
    kernels = [e for e in events if e["cat"] == "kernel"]
    kernels[0]["name"] = 'void f<{1}, "q">() }, {"ph": "X", "cat": "kernel"} }'
    kernels[1]["name"] = "g\n  },\n  {\n    }"  # the Kineto separator, escaped in JSON
    events.append({"ph": "i", "cat": "kernel", "name": "instant", "pid": 1, "tid": 1,
                   "ts": 50, "s": "t"})
    doc_text = kineto_text(events)
    kineto = tmp_path / "kineto.json"
    kineto.write_text(doc_text)
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(json.loads(doc_text)))
    dense = tmp_path / "dense.json"
    dense.write_text(json.dumps(json.loads(doc_text), separators=(",", ":")))
    k, c, d = load_trace(kineto), load_trace(compact), load_trace(dense)
    assert k.read_counts is not None and c.read_counts is not None and d.read_counts is None
    assert k.events == c.events == d.events
    assert {e.name for e in k.events} >= {kernels[0]["name"], kernels[1]["name"]}
    assert k.read_counts.parsed == c.read_counts.parsed == _kept(events) - 1  # not the instant


def test_a_compact_file_cut_inside_a_kept_event_is_parsed_whole(tmp_path: Path) -> None:
    """An argument holding objects keyed "ph" puts the compact separator inside a kernel: the
    cut fails to parse, and the file is read whole instead, with the same numbers."""
    events = synthetic_events()
    odd = next(e for e in events if e["cat"] == "kernel")
    odd["args"]["launches"] = [{"ph": "inner"}, {"ph": "inner"}]
    p = tmp_path / "odd.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events,
                             "distributedInfo": {"rank": 0}}))
    assert '}, {"ph": "inner"' in p.read_text()
    t = load_trace(p)
    assert t.read_counts is None  # parsed whole
    assert len(t.events) == _kept(events)
    temporal = analyze_paths([p]).ranks[0].temporal
    assert temporal is not None and temporal.window_us == 170


def test_metadata_after_the_events_is_read_without_a_second_pass(tmp_path: Path) -> None:
    text = kineto_text(synthetic_events(), tail=',\n  "traceName": "t.json"').replace(
        '  "distributedInfo": {"rank": 0, "world_size": 1},\n', "")
    text = text.replace('"traceName": "t.json"',
                        '"traceName": "t.json",\n  "distributedInfo": {"rank": 5}')
    p = tmp_path / "late.json"
    p.write_text(text)
    t = load_trace(p)
    assert t.rank == 5 and t.metadata["traceName"] == "t.json"


def test_gzip_members_stream_and_a_cut_names_how_far_it_got(tmp_path: Path) -> None:
    events = synthetic_events() + _unused(12000)  # past the first MiB, read to pick a reader
    data = kineto_text(events).encode()
    whole = tmp_path / "whole.json.gz"
    whole.write_bytes(gzip.compress(data))
    members = tmp_path / "members.json.gz"  # `cat a.gz b.gz` is one gzip stream of both
    half = len(data) // 2
    members.write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]))
    w, m = load_trace(whole), load_trace(members)
    assert w.events == m.events and len(w.events) == _kept(events)
    cut = tmp_path / "cut.json.gz"
    raw = gzip.compress(data)
    cut.write_bytes(raw[: len(raw) * 3 // 4])
    with pytest.raises(TraceError, match=r"cut\.json\.gz: the gzip stream is corrupt or "
                                         r"truncated after \d+ device and runtime events, at "
                                         r"byte [\d,]+ of [\d,]+ .*; [\d,]+ bytes of JSON came "
                                         r"out before it ends"):
        load_trace(cut)


def test_a_malformed_event_of_a_kind_the_analyses_read_is_named(tmp_path: Path) -> None:
    text = kineto_text(synthetic_events())
    text = text.replace('"device": 0}', '"device": 0,}', 1)  # a trailing comma in a kernel
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(TraceError, match=r"bad\.json: the event .*sm90_xmma_gemm.* does not "
                                         r"parse"):
        load_trace(p)
