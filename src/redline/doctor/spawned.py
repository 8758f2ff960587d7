"""The processes a script starts with ``torch.multiprocessing.spawn`` are measured as ranks.

``redline doctor -- python train.py`` where ``train.py`` calls ``mp.spawn(train, nprocs=N)``:
the training runs in N fresh interpreters, not in the process doctor watches. While the script
runs, doctor replaces ``torch.multiprocessing.start_processes`` (what ``spawn`` calls) so that
each process runs ``train(i, *args)`` inside a watch of its own, as rank ``i`` of ``N``: the
ranks exchange their summaries through a store doctor serves (``REDLINE_STORE``), and rank 0
prints and writes the job's merged report, as under torchrun. The ``fork`` start method is
left alone: a forked child holds a copy of the parent's watch, hooks and all.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from redline.doctor.exits import StderrConsole, StopMeasurement, to_stderr
from redline.measure.config import WatchConfig
from redline.measure.ranks import STORE_ENV
from redline.report.json_io import write_json
from redline.report.terminal import print_report
from redline.runs.watch import Watch

MEASURED_METHODS = ("spawn", "forkserver")
"""Start methods whose processes begin fresh, so a watch of their own measures them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SpawnSettings:
    """What each spawned process needs to measure itself (pickled to it)."""

    config: WatchConfig
    """The watch's settings, doctor's own (steps, warm-up, FLOPs, timeline)."""
    store: str
    """``host:port`` of the store doctor serves for the ranks' exchange."""
    json_path: str | None = None
    """Where rank 0 writes the merged report's JSON; None = not written."""
    command: list[str] = field(default_factory=list)
    """The command doctor ran, for the report."""


class MeasuredProcess:
    """``fn(i, *args)`` as rank ``i`` of ``nprocs`` under a watch (picklable: what spawn
    sends each process)."""

    def __init__(self, fn: Callable[..., Any], nprocs: int, settings: SpawnSettings) -> None:
        self.fn, self.nprocs, self.settings = fn, nprocs, settings

    def __call__(self, i: int, *args: Any) -> None:
        s = self.settings
        # Rank i of nprocs for redline (the user's init_process_group takes its own rank and
        # world size as arguments, which come before these).
        os.environ.update({"RANK": str(i), "WORLD_SIZE": str(self.nprocs), "LOCAL_RANK": str(i),
                           "LOCAL_WORLD_SIZE": str(self.nprocs), STORE_ENV: s.store})
        stops = [0]

        def stop() -> None:
            stops[0] += 1
            raise StopMeasurement

        w = Watch(s.config, on_limit=stop)
        status, detail = "completed", None
        error: BaseException | None = None
        try:
            with w:
                self.fn(i, *args)
        except StopMeasurement:
            status = "step_limit"
            detail = f"stopped after {s.config.max_steps} measured steps (the limit)"
        except KeyboardInterrupt as e:
            status, detail, error = "interrupted", "interrupted (Ctrl-C)", e
        except BaseException as e:
            status, detail, error = "script_error", f"the process raised {type(e).__name__}: {e}", e
        if not w.steps and status in ("completed", "step_limit"):
            status, detail = "no_steps", f"rank {i} ended without a training step"
        report = w.report(show=False, command=s.command, status=status, status_detail=detail)
        if i == 0:
            to_stderr(lambda: print_report(report, StderrConsole(stderr=True)))
            if s.json_path:
                written = write_json(report, s.json_path)
                to_stderr(f"redline: JSON report written to {written}")
        if error is not None and not isinstance(error, KeyboardInterrupt):
            raise error  # spawn hands it to the parent, as without redline


@contextlib.contextmanager
def measure_spawned(settings: Callable[[str], SpawnSettings], started: list[int],
                    forked: list[int] | None = None) -> Iterator[None]:
    """While the block runs, ``torch.multiprocessing.start_processes`` (and so ``spawn``)
    runs each process under :class:`MeasuredProcess`; ``settings(store)`` builds what they
    get; ``started`` gets the number of processes of each measured start, ``forked`` those of
    each start left unmeasured (the ``fork`` method)."""
    try:
        import torch.multiprocessing as tmp
    except ImportError:  # torch without multiprocessing: nothing to measure
        yield
        return
    tms = sys.modules.get("torch.multiprocessing.spawn")  # the module: `.spawn` is the function
    original = getattr(tms, "start_processes", None)
    if tms is None or original is None:  # another torch layout: left alone
        yield
        return
    server: list[Any] = []

    def start_processes(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int = 1,
                        join: bool = True, daemon: bool = False,
                        start_method: str = "spawn") -> Any:
        if start_method not in MEASURED_METHODS or isinstance(fn, MeasuredProcess):
            if forked is not None and not isinstance(fn, MeasuredProcess):
                forked.append(nprocs)
            return original(fn, args, nprocs, join, daemon, start_method)
        if not server:
            from torch._C._distributed_c10d import TCPStore

            server.append(TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=30)))
        started.append(nprocs)
        measured = MeasuredProcess(fn, nprocs, settings(f"127.0.0.1:{server[0].port}"))
        return original(measured, args, nprocs, join, daemon, start_method)

    name = "start_processes"  # spawn's own global, and the package's name for it
    for module in (tms, tmp):
        setattr(module, name, start_processes)
    try:
        yield
    finally:
        for module in (tms, tmp):
            setattr(module, name, original)
