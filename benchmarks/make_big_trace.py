"""Scale a real Kineto trace up to a given size by repeating its events shifted in time.

Copies of the events are shifted by the trace's span each time, and correlation ids by a fixed
stride, so every copy is a valid continuation (launches still match their kernels). Written in
Kineto's own layout (one event per indented block), streamed, so making a 1 GB file needs
little memory.

    python benchmarks/make_big_trace.py SRC.json.gz [OUT.json] [--mb 1100]

OUT defaults to /tmp/redline-big-trace/big-1100MB.json (the size in its name): a file this big
belongs in /tmp, never in the repository. ``benchmarks/trace_vs_hta.py --big 1100`` makes one,
times both tools on it and deletes it.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any


def make_big_trace(src: Path, out: Path, mb: int) -> int:
    if src.is_dir():
        src = sorted([*src.glob("*.json.gz"), *src.glob("*.json")])[0]
    opener = gzip.open if src.suffix == ".gz" else open
    with opener(src, "rt") as f:
        doc: dict[str, Any] = json.load(f)
    events = [e for e in doc["traceEvents"] if "ts" in e]
    t0 = min(float(e["ts"]) for e in events)
    span = max(float(e["ts"]) + float(e.get("dur", 0)) for e in events) - t0 + 1000.0
    corr_stride = 1 + max(int(e.get("args", {}).get("correlation", 0) or 0) for e in events)
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    target = mb * 1_000_000
    written = 0
    with open(out, "w") as f:
        head = json.dumps(meta)[:-1] + ', "traceEvents": [\n'
        f.write(head)
        written += len(head)
        sep = ",\n"
        k = 0
        first = True
        while written < target:
            for e in events:
                c = dict(e)
                c["ts"] = float(e["ts"]) + k * span
                a = e.get("args")
                if a and "correlation" in a:
                    c["args"] = {**a, "correlation": int(a["correlation"]) + k * corr_stride}
                s = ("" if first else sep) + "  {\n    " + json.dumps(c)[1:-1] + "\n  }"
                first = False
                f.write(s)
                written += len(s)
            k += 1
        f.write("\n]}\n")  # Kineto closes the array the same way (']' at column 0 or 2)
    return out.stat().st_size


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path, nargs="?", default=None)
    ap.add_argument("--mb", type=int, default=1100, help="size in MB (10^6 bytes), at least")
    a = ap.parse_args()
    out = a.out or Path("/tmp/redline-big-trace") / f"big-{a.mb}MB.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"wrote {make_big_trace(a.src, out, a.mb) / 1e9:.2f} GB to {out}")
