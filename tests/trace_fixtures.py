"""A small Kineto trace with hand-computed answers (see test_trace.py for the arithmetic)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def _x(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}


def synthetic_events(offset: float = 0.0) -> list[dict[str, Any]]:
    o = offset
    ev = [
        _x("user_annotation", "ProfilerStep#1", o + 0, 100),
        _x("user_annotation", "ProfilerStep#2", o + 100, 100),
        _x("user_annotation", "ProfilerStep#3", o + 200, 100),
        _x("cpu_op", "aten::mm", o + 4, 3),
    ]
    # (corr, launch ts, stream, name, cat, start, end)
    kernels = [
        (1, 5, 7, "sm90_xmma_gemm_f32f32", "kernel", 10, 30),
        (2, 12, 7, "sm90_xmma_gemm_f32f32", "kernel", 35, 55),
        (3, 80, 7, "Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 90, 100),
        (4, 20, 9, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 40, 70),
        (5, 150, 7, "void at::native::vectorized_elementwise_kernel", "kernel", 160, 180),
        (6, 250, 7, "sm90_xmma_gemm_f32f32", "kernel", 260, 270),  # last step: dropped
        (8, 30, 9, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 110, 130),
    ]
    for corr, launch, stream, name, cat, s, e in kernels:
        rt = "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaLaunchKernel"
        ev.append(_x("cuda_runtime", rt, o + launch, 2, correlation=corr))
        ev.append(_x(cat, name, o + s, e - s, stream=stream, correlation=corr, device=0))
    ev.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": 1, "tid": 1, "ts": o + 5})
    return ev


def write_trace(path: Path, events: list[dict[str, Any]] | None = None, rank: int | None = 0,
                gz: bool = True, device: str = "NVIDIA H100 80GB HBM3",
                cc: tuple[int, int] | None = (9, 0)) -> Path:
    props: dict[str, Any] = {"name": device}
    if cc is not None:
        props.update(computeMajor=cc[0], computeMinor=cc[1])
    doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [props],
                           "traceEvents": events if events is not None else synthetic_events()}
    if rank is not None:
        doc["distributedInfo"] = {"rank": rank, "world_size": 1}
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def kineto_text(events: list[dict[str, Any]], rank: int = 0, tail: str = "") -> str:
    """``events`` in the block layout torch.profiler's Kineto writes (one event per indented
    block, ``"ph"`` and ``"cat"`` first), metadata before the events and ``tail`` (top-level
    keys, each ``,\\n  "key": value``) after them."""
    blocks = "\n  },\n  {\n    ".join(json.dumps(e)[1:-1] for e in events)
    head = ('{\n  "schemaVersion": 1,\n  "deviceProperties": [{"name": "NVIDIA H100 80GB HBM3", '
            '"computeMajor": 9, "computeMinor": 0}],\n  "distributedInfo": {"rank": '
            + str(rank) + ', "world_size": 1},\n  "traceEvents": [\n  {\n    ')
    return head + blocks + "\n  }\n]" + tail + "\n}\n"
