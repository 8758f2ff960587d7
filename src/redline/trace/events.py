"""The trace event model: what a reader keeps of a Kineto (Chrome-trace JSON) file.

Only complete ('X') events of the categories the analyses read are kept, each as a compact
:class:`Event` with times in the trace's unit (microseconds); the readers in
:mod:`redline.trace.load` produce them, the analyses consume them.
"""

from __future__ import annotations

from redline.core.errors import RedlineError
from redline.core.record import field, record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from typing import Any

GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"})
"""Event categories that run on the device (Kineto names them the same for CUDA and ROCm)."""

RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
"""Host-side runtime calls (cudaLaunchKernel, hipLaunchKernel, cudaStreamSynchronize, ...)."""

KEPT_CATEGORIES = GPU_CATEGORIES | RUNTIME_CATEGORIES
"""Events the analyses read (plus the annotations of KEPT_NAME_PREFIXES, kept by name)."""

HOST_COLLECTIVE_PREFIX = "gloo:"
"""Host-side collectives: the gloo backend records one annotation per collective
(``gloo:all_reduce``, ...) on its own thread, lasting from the collective's start on this rank
to its end on all ranks; on jobs without NCCL kernels these give the arrival skew."""

KEPT_NAME_PREFIXES = ("ProfilerStep", HOST_COLLECTIVE_PREFIX)
"""Annotations kept whatever their category: step marks and host-side collectives."""


class TraceError(RedlineError, ValueError):
    """A trace file that cannot be read: the message names the file and where it broke."""


@record
class Event:
    """One complete ('X') event, times in microseconds (the trace's unit)."""

    name: str
    cat: str
    ts: float
    end: float
    stream: int
    """Device stream for device events; -1 for host events."""
    corr: int
    """Correlation id linking a runtime call to the device work it launched; -1 if none."""
    nbytes: int = -1
    """Bytes moved (memcpy / memset events), -1 when not recorded."""

    @property
    def dur(self) -> float:
        return self.end - self.ts


@record
class ReadCounts:
    """What the reader did with a file's events."""

    events: int = 0
    """Event blocks in the file."""
    parsed: int = 0
    """Blocks cut out and parsed (the kinds the analyses read); the others were skipped as
    text, never parsed into objects."""

    @property
    def skipped(self) -> int:
        return self.events - self.parsed


@record
class RankTrace:
    """The events of one rank's trace file."""

    path: str
    rank: int
    events: list[Event]
    device_name: str | None
    float_timestamps: bool
    """True when the file has fractional (nanosecond-resolution) timestamps."""
    metadata: dict[str, Any] = field(default_factory=dict)
    compute_capability: float | None = None
    """From deviceProperties (CUDA traces); None when the trace does not say."""
    left_out: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Device and runtime events left out of every statistic, by reason ('negative duration',
    'NaN or infinite start or duration', 'missing start or duration'): (count, first one)."""
    read_counts: ReadCounts | None = None
    """Event blocks seen and parsed by Kineto's block reader; None when the file was parsed
    whole (another layout)."""

    @property
    def gpu_events(self) -> list[Event]:
        return [e for e in self.events if e.stream != -1]


NO_DEVICE_WORK = frozenset({
    "cudaEventQuery", "cudaEventRecord", "cudaEventRecordWithFlags", "cudaStreamIsCapturing",
    "cudaStreamGetPriority", "cudaDeviceGetStreamPriorityRange", "cudaGetDevice",
    "cudaSetDevice", "cudaGetLastError", "cudaPeekAtLastError", "cudaFuncSetAttribute",
    "cudaFuncGetAttributes", "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", "cudaStreamGetCaptureInfo",
    "cudaStreamGetCaptureInfo_v2", "cudaEventElapsedTime", "cudaEventCreate",
    "cudaEventCreateWithFlags", "cudaEventDestroy", "cudaPointerGetAttributes",
    "cudaDeviceGetAttribute", "cudaGetDeviceCount", "cudaGetDeviceProperties",
    "hipEventQuery", "hipEventRecord", "hipStreamIsCapturing", "hipGetDevice", "hipSetDevice",
    "hipGetLastError", "hipFuncSetAttribute", "hipEventCreateWithFlags", "hipEventDestroy",
    "hipPointerGetAttributes", "hipDeviceGetAttribute", "hipStreamGetPriority",
})
"""Runtime calls that launch nothing on the device and block nothing: skipped when reading
(they are most runtime events — 9 of 15 thousand in the V100 trace — and no analysis reads
them). Unknown calls are kept."""
