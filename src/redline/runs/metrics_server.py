"""Live metrics in Prometheus' text format while the job runs (``redline.watch(metrics_port=)``,
``redline doctor --metrics-port``).

Nothing runs per step: a scrape reads the watch's step records (the last
``window_steps`` measured steps, :func:`redline.measure.live.live_snapshot`) on the server's
own thread, so the always-on cost of the training loop is unchanged. Served by the official
client library (``prometheus_client``, the optional extra ``redline[metrics]``), on
127.0.0.1 by default: the numbers describe the job, and opening them to the network is the
user's choice (``metrics_address``). Each process of a multi-process job serves on
``port + LOCAL_RANK`` with its ``rank`` as a label.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from redline._version import __version__
from redline.core.errors import RedlineError
from redline.measure.live import live_snapshot

if TYPE_CHECKING:
    from redline.measure.recorder import Recorder

WINDOW_STEPS = 50
"""Measured steps each scrape's values are over (the most recent ones)."""


class MetricsServerError(RedlineError, OSError):
    """The metrics endpoint could not start (library missing, port taken, bad address)."""


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise MetricsServerError(
            "the metrics endpoint needs the Prometheus client library, which is not "
            "installed; install it with: pip install 'redline[metrics]'") from None
    return prometheus_client


class WatchCollector:
    """A Prometheus collector over one running watch (called on each scrape)."""

    def __init__(self, w: Recorder, window_steps: int = WINDOW_STEPS) -> None:
        self._w = w
        self._window = window_steps
        self._labels = {"rank": str(w.rank.rank)}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        names, values = list(self._labels), list(self._labels.values())

        def gauge(name: str, doc: str, value: float, **extra: str) -> Any:
            family = GaugeMetricFamily(f"redline_{name}", doc, labels=[*names, *extra])
            family.add_metric([*values, *extra.values()], value)
            return family

        info = GaugeMetricFamily("redline_info", "redline's version and the measured device",
                                 labels=[*names, "version", "device", "world_size"])
        info.add_metric([*values, __version__, str(self._w.device),
                         str(self._w.rank.world_size)], 1.0)
        yield info
        snap = live_snapshot(self._w, self._window)
        steps = CounterMetricFamily("redline_steps", "Training steps closed (warm-up included)",
                                    labels=names)
        steps.add_metric(values, float(snap.steps_total if snap else self._w.tracker.closed))
        yield steps
        mem = self._w.memory.latest()
        if mem is not None:
            _, _, rss, alloc, reserved, workers = mem
            g = GaugeMetricFamily("redline_memory_bytes",
                                  "Memory at the last sample: host RSS of the training process "
                                  "and of each DataLoader worker, the device's allocated and "
                                  "reserved bytes (CUDA caching allocator)",
                                  labels=[*names, "kind", "process", "pid"])
            g.add_metric([*values, "host_rss", "main", str(self._w.cpu.pid)], float(rss))
            for pid, wrss in sorted(workers.items()):
                g.add_metric([*values, "host_rss", "worker", str(pid)], float(wrss))
            if alloc is not None and reserved is not None:
                g.add_metric([*values, "cuda_allocated", "main", ""], float(alloc))
                g.add_metric([*values, "cuda_reserved", "main", ""], float(reserved))
            yield g
        if snap is None:
            return  # warm-up: no measured step yet, nothing else is known
        yield gauge("steps_measured", "Measured steps so far (after warm-up)",
                    float(snap.steps_measured))
        yield gauge("window_steps", "Measured steps the other values are over",
                    float(snap.window_steps))
        yield gauge("step_time_seconds", "Mean wall time per step over the window",
                    snap.step_time_mean_s)
        yield gauge("data_wait_share", "Share of step time waiting for the next batch",
                    snap.data_wait_fraction)
        shares = GaugeMetricFamily("redline_phase_share",
                                   "Share of step time in each phase (exclusive)",
                                   labels=[*names, "phase"])
        for phase, frac in snap.phase_fractions.items():
            shares.add_metric([*values, phase], frac)
        yield shares
        if snap.samples_per_s is not None:
            yield gauge("samples_per_second", "Samples per second over the window",
                        snap.samples_per_s)
        if snap.device_busy_fraction is not None:
            yield gauge("device_busy_share", "Device busy time ÷ step time (CUDA events)",
                        snap.device_busy_fraction)
        if snap.mfu is not None:
            yield gauge("mfu", "Model FLOPs utilization over the window", snap.mfu)


class MetricsServer:
    """The endpoint of one watch: started on enter, shut down (port released) on close."""

    def __init__(self, w: Recorder, port: int, address: str = "127.0.0.1") -> None:
        self.requested_port = port
        self.port = port + (w.rank.local_rank if w.rank.distributed and port else 0)
        self.address = address
        self._w = w
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        client = _client()
        registry = client.CollectorRegistry(auto_describe=False)
        registry.register(WatchCollector(self._w))
        try:
            self._server, self._thread = client.start_http_server(self.port, addr=self.address,
                                                               registry=registry)
        except OSError as e:
            raise MetricsServerError(
                f"cannot serve metrics on {self.address}:{self.port} ({e.strerror or e}); "
                "pick a free port with `metrics_port` (each process of a job uses port + its "
                "LOCAL_RANK)") from e
        if self.port == 0:
            self.port = int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/metrics"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
