"""Run an unmodified ``python script.py args`` (or ``python -m module args``) under a watch.

The script runs in this process as ``__main__`` with its own ``sys.argv``, so its output goes
where it always went and its exit code is kept. After N measured steps a
:class:`StopMeasurement` (a ``BaseException``, so a script's ``except Exception`` does not eat
it) is raised from the step hook and the run ends there. A crash, ``sys.exit(n)``,
``os._exit(n)``, Ctrl-C or SIGTERM still produce the report of the steps so far
(:mod:`redline.doctor.exits`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import runpy
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redline.core.files import OutputPathError, output_problem, refuse_overwriting_inputs
from redline.core.report import Report
from redline.data.advise import tune_starved_loader
from redline.doctor.exits import (
    REAL_EXIT,
    STOP_ATTEMPTS,
    STUCK_GRACE_S,
    BlockedWatch,
    OsExitGuard,
    Signals,
    StderrConsole,
    StopMeasurement,
    Terminated,
    exit_now,
    to_stderr,
)
from redline.doctor.launch import rank_command, run_launcher
from redline.doctor.options import DoctorError, DoctorOptions
from redline.doctor.spawned import SpawnSettings, measure_spawned
from redline.measure.interrupts import forget_unhandled_interrupt
from redline.measure.ranks import JobStore, code_position, progress_line, rank_info, read_progress
from redline.measure.system import cpu_budget
from redline.report.html import HtmlReportError, write_html
from redline.report.html import check_available as check_html
from redline.report.json_io import to_dict, write_json
from redline.report.live_view import live_panel
from redline.report.terminal import print_report
from redline.runs.metrics_server import MetricsServerError
from redline.runs.watch import Watch


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    kind: str
    """'path' or 'module'."""
    target: str
    argv: list[str]
    """The script's sys.argv (argv[0] is the path, or the module name for -m)."""


_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_SKIPPED_FLAGS = {"-u", "-B", "-O", "-OO", "-s", "-E"}


def parse_command(cmd: list[str]) -> Target:
    """Understand ``python [flags] script.py args``, ``python -m mod args`` or ``script.py``."""
    usage = ("expected `redline doctor -- python train.py [args]` or "
             "`redline doctor -- python -m package.module [args]`")
    if not cmd:
        raise DoctorError(f"no command given after `--`: {usage}")
    rest = list(cmd)
    head = rest[0]
    if _PYTHON.match(Path(head).name) or os.path.abspath(head) == os.path.abspath(sys.executable):
        rest = rest[1:]
        while rest and rest[0] in _SKIPPED_FLAGS:
            rest = rest[1:]
        if not rest:
            raise DoctorError(f"`{head}` was given without a script or -m module: {usage}")
        if rest[0] == "-m":
            if len(rest) < 2:
                raise DoctorError(f"`-m` needs a module name: {usage}")
            return Target(kind="module", target=rest[1], argv=[rest[1], *rest[2:]])
        if rest[0].startswith("-"):
            raise DoctorError(f"python option {rest[0]!r} is not supported by redline doctor "
                              f"(it runs the script in its own interpreter): {usage}")
        return Target(kind="path", target=rest[0], argv=rest)
    if head.endswith(".py") or os.path.isfile(head):
        return Target(kind="path", target=head, argv=rest)
    raise DoctorError(f"redline doctor runs Python training scripts in its own process; got "
                      f"{' '.join(cmd)!r}: {usage}")


def check_target(t: Target) -> None:
    if t.kind == "path":
        p = Path(t.target)
        if not p.exists():
            raise DoctorError(f"script not found: {t.target!r} (looked at {p.resolve()}); "
                              "check the path relative to the current directory "
                              f"{Path.cwd()}")
        if p.is_dir() and not (p / "__main__.py").exists():
            raise DoctorError(f"{t.target!r} is a directory without __main__.py; give the "
                              "training script's path")
    else:
        try:
            spec = _module_spec(t.target)
        except (ImportError, ValueError) as e:
            spec = None
            detail = f" ({e})"
        else:
            detail = ""
        if spec is None:
            raise DoctorError(f"module not found: {t.target!r}{detail}; is its package "
                              "installed or the current directory its parent?")


def _module_spec(name: str) -> Any:
    """``importlib.util.find_spec`` as ``python -m`` sees it: the current directory first
    (``redline`` runs from its own entry point, whose folder is not the user's)."""
    import importlib.util

    sys.path.insert(0, os.getcwd())
    try:
        return importlib.util.find_spec(name)
    finally:
        sys.path.pop(0)


def script_file(t: Target) -> Path | None:
    """The file that runs: the script, its folder's ``__main__.py``, or the module's source."""
    if t.kind == "path":
        p = Path(t.target)
        return p / "__main__.py" if p.is_dir() else p
    try:
        spec = _module_spec(t.target)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None


def check_json_path(path: str | None, target: Target | None = None,
                    flag: str = "`json_path`") -> None:
    """Fail before running the script when an output (the report, ``flag``: its field in
    backticks) could not be written afterwards, or would replace the script."""
    if path is None:
        return
    problem = output_problem(flag, path)
    if problem is not None:
        raise DoctorError(problem)
    script = script_file(target) if target is not None else None
    if script is not None:
        try:
            refuse_overwriting_inputs({flag: path}, {"the script to run": [script]})
        except OutputPathError as e:
            raise DoctorError(str(e)) from None


def check_outputs(outputs: dict[str, str | None], target: Target | None = None) -> None:
    """:func:`check_json_path` for each output (by field name), and no two naming one file."""
    seen: dict[Path, str] = {}
    for name, path in outputs.items():
        flag = f"`{name}`"
        check_json_path(path, target, flag=flag)
        if path is None:
            continue
        resolved = Path(path).resolve()
        if resolved in seen:
            raise DoctorError(f"{flag} and {seen[resolved]} name the same file ({path!r}): "
                              "give each its own path")
        seen[resolved] = flag


@dataclass(slots=True, kw_only=True)
class DoctorResult:
    """The outcome of a ``redline doctor`` run: the report, the exit code, the JSON written and
    the script's error if it raised."""

    report: Report | None
    """The report (rank 0's merged one under a launcher); None for the launching process of
    ``redline doctor -- torchrun ...``, whose ranks report."""
    exit_code: int
    json_path: Path | None
    script_error: BaseException | None


def never_stepped_message(w: Watch) -> str:
    c = w.tracker.counts
    roots = w.inst.root_modules if w.inst else []
    seen = (f"{c['optimizer_step']} optimizer steps, {c['backward']} backward calls, "
            f"{c['forward']} forward calls of {len(roots)} top-level module(s)"
            f"{' (' + ', '.join(roots) + ')' if roots else ''}, {c['batches']} batches")
    if w.inst is not None and w.inst.other_thread_steps:
        seen += (f"; {w.inst.other_thread_steps} steps on another thread "
                 f"({', '.join(sorted(w.inst.other_threads))}), which redline does not measure: "
                 "run the training loop in the script's main thread")
    return (f"The script ended without a training step. Seen: {seen}. redline counts a step at "
            "each optimizer.step(), or, with no optimizer, at each outermost forward+backward; "
            "if your loop steps some other way, call `w.step()` at the end of each step "
            "(redline.watch API).")


def ranks_progress(w: Watch) -> str | None:
    """The job's ranks' progress from their beacons, the stuck one(s) named (see
    :func:`redline.measure.ranks.progress_line`); None when the store cannot be read."""
    try:
        store = JobStore(w.rank, timeout_s=5.0)
        return progress_line(read_progress(store, w.progress_key, w.rank.world_size))
    except Exception:  # best effort: the report stands without it
        return None


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1
    return 1


def _print_script_traceback(e: BaseException) -> None:
    """The script's traceback, without the frames of redline and runpy above it."""
    tb = e.__traceback__
    while tb is not None and (
        "/redline/" in tb.tb_frame.f_code.co_filename
        or tb.tb_frame.f_code.co_filename.endswith("runpy.py")
        or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
    ):
        tb = tb.tb_next
    print("\nredline doctor: the script raised an exception (report of the steps so far below):",
          file=sys.stderr)
    traceback.print_exception(type(e), e, tb, file=sys.stderr)


def run_doctor(cmd: list[str], options: DoctorOptions | None = None, *,
               show: bool = True) -> DoctorResult:
    """Run ``cmd`` under a watch as ``options`` say, and report.

    ``cmd`` may start a launcher (``torchrun ...``, ``python -m torch.distributed.run ...``):
    every rank then runs under redline (:mod:`redline.doctor.launch`), each given ``options``
    as one JSON document. Under a launcher (``RANK``/``WORLD_SIZE`` set) rank 0 prints the
    job's merged report and writes the JSON; the other ranks print nothing of redline's.

    Args:
        cmd: ``python script.py args``, ``python -m module args``, or a launcher's command.
        options: what to measure and where to write; None = the defaults.
        show: print the report (and redline's notes) on stderr.

    Returns:
        The report, the exit code to end with, the JSON written and the script's exception.

    Raises:
        DoctorError: a usage error, before anything runs; the message names options by
            their field in backticks.
    """
    o = options if options is not None else DoctorOptions()
    steps, json_path, html_path, tune_loader = o.steps, o.json_path, o.html_path, o.tune_loader
    outputs = o.outputs()
    if html_path:
        try:
            check_html()
        except HtmlReportError as e:
            raise DoctorError(str(e)) from None
    try:
        launched = rank_command(list(cmd), o.to_json())
    except ValueError as e:
        raise DoctorError(f"{e}: expected `redline doctor -- torchrun [its options] train.py "
                          "[args]`") from None
    if launched is not None:
        check_outputs(outputs)
        return DoctorResult(report=None, exit_code=run_launcher(launched), json_path=None, script_error=None)
    info = rank_info()
    show = show and info.rank == 0
    target = parse_command(cmd)
    check_target(target)
    check_outputs(outputs, target)
    config = o.watch_config()
    stops = [0]
    end_here: list[Callable[[str, str | None, int], None]] = []
    """Set by _run_script: ends the run where the script is, after the report."""

    def stop() -> None:
        stops[0] += 1
        if stops[0] <= STOP_ATTEMPTS or not end_here:
            raise StopMeasurement
        # The script caught every stop (a bare `except:` around its step, its fetch, its epoch,
        # a loop without a DataLoader): end the run in place, as os._exit would, after the
        # report, rather than let it run its whole course.
        end_here[0]("step_limit", f"stopped at the limit of {steps} measured steps; "
                    f"the script caught redline's stop {STOP_ATTEMPTS} time(s) "
                    "(a bare `except:` "
                    "or `except BaseException:` around its step or its loop), so the run was "
                    "ended there, after this report, without running the rest of the script", 0)
        exit_now(0)

    spawned: list[int] = []
    forked: list[int] = []
    """Processes the script started through torch.multiprocessing, measured as ranks."""

    def spawn_settings(store: str) -> SpawnSettings:
        own = dataclasses.replace(config, metrics_port=None, trace_dir=None, keep_loaders=False)
        return SpawnSettings(config=own, store=store, json_path=json_path, command=list(cmd))

    w = Watch(config, on_limit=stop)
    finishing = threading.Lock()
    with Signals() as signals:

        def finish(status: str, detail: str | None, code: int,
                   error: BaseException | None) -> DoctorResult:
            """The report of what ran, printed and written (also called in place by
            ``os._exit``: see OsExitGuard). Once: a second caller (the main thread unwinding
            while a rank's run ends on another thread) waits for the first to end the
            process."""
            if not finishing.acquire(blocking=False):
                threading.Event().wait()
            signals.reporting()
            swallowed = 0 if stops[0] > STOP_ATTEMPTS else (
                stops[0] - (1 if status == "step_limit" else 0))
            if swallowed > 0:
                where = "its step" if status == "step_limit" else "its step or its loop"
                caught = (f"the script caught redline's stop {swallowed} time(s) (a bare "
                          f"`except:` or `except BaseException:` around {where})")
                detail = (f"{detail}; {caught} first" if status == "step_limit" else
                          f"the limit of {steps} measured steps was ignored: {caught} and "
                          "ran on, measured to its end" + (f"; {detail}" if detail else ""))
            if not w.steps and spawned:
                # the training ran in the spawned processes: rank 0 of them reported the job
                w.close()
                if show:
                    print(f"redline doctor: the script's {' + '.join(map(str, spawned))} "
                          "process(es) started with torch.multiprocessing were measured as "
                          "ranks; rank 0 printed the job's merged report", file=sys.stderr)
                return DoctorResult(report=None, exit_code=code, json_path=None, script_error=error)
            if status == "interrupted" and info.distributed and info.rank == 0:
                line = ranks_progress(w)  # at Ctrl-C or SIGTERM: which rank held the job up
                if line and detail and "blocked in native code" not in detail:
                    detail = f"{detail}; {line}"
            if not w.steps:
                status = "no_steps" if status in ("completed", "step_limit") else status
                msg = never_stepped_message(w)
                if forked:
                    msg += (f" The script started {sum(forked)} process(es) with "
                            "torch.multiprocessing's start_method='fork', which redline does "
                            "not measure (a forked child holds a copy of this process's "
                            "watch): start them with 'spawn' (mp.spawn) to have each measured "
                            "as a rank.")
                detail = msg if detail is None else f"{detail}. {msg}"
            # a signal during the close (the launcher stopping the job) ends the other ranks
            # too: rank 0 waits for them as for a failed run
            report = w.report(show=False, command=list(cmd), status=status, status_detail=detail,
                              job_stopping=signals.received is not None)
            if tune_loader and w.inst is not None and status != "interrupted" \
                    and info.rank == 0:
                if show and any(f.id == "data_starvation" and f.rank in (None, 0)
                                for f in report.findings):
                    print("redline doctor: the loop starves for data; timing DataLoader settings in "
                          "it...", file=sys.stderr)
                # Rank 0 times its own loader for the job; ranks on one host share its CPUs, so
                # its workers get its share of them.
                share = cpu_budget().cpus / info.local_world_size if info.distributed else None
                report, _ = tune_starved_loader(report, w.inst.loaders, cpus=share,
                                                rank=info.rank if info.distributed else None)
            if w.inst is not None:
                for li in w.inst.loaders:
                    li.loader = None  # release the user's loader and dataset
            if show:
                to_stderr(lambda: print_report(report, StderrConsole(stderr=True)))
            written = write_json(report, json_path) if json_path and info.rank == 0 else None
            if written is not None and show:
                to_stderr(f"redline: JSON report written to {written}")
            if html_path and info.rank == 0:
                page = write_html([to_dict(report)], html_path, [" ".join(cmd)])
                if show:
                    to_stderr(f"redline: HTML report written to {page} (opens offline in a "
                               "browser)")
            if w.timeline_written is not None and show:
                to_stderr(f"redline: timeline written to {w.timeline_written} (open it in "
                           "https://ui.perfetto.dev or chrome://tracing)")
            if signals.received is not None and code == 0:
                code = 128 + signals.received  # stopped while reporting: say so to the scheduler
            return DoctorResult(report=report, exit_code=code, json_path=written, script_error=error)

        def blocked(signum: int) -> None:
            # off the main thread, which is blocked in native code (see BlockedWatch)
            signals.reporting()
            name = signal.Signals(signum).name
            main = threading.main_thread().ident
            why = (f"{name} arrived while rank {info.rank}'s main thread was blocked in native "
                   f"code at {code_position(main) if main is not None else 'unknown'} (no "
                   f"Python ran for {STUCK_GRACE_S:g} s)")
            line = ranks_progress(w)
            print(f"redline doctor: {why}" + (f"; {line}" if line else ""), file=sys.stderr,
                  flush=True)
            if end_here:
                end_here[0]("interrupted", f"terminated ({name}); {why}"
                            + (f"; {line}" if line else ""), 128 + signum)
            exit_now(128 + signum)

        extra: list[AbstractContextManager[object]] = (
            [BlockedWatch(signals, blocked)] if info.distributed
            else [measure_spawned(spawn_settings, spawned, forked)])
        # Innermost: the script's end, however it ends, switches the signals to recording
        # before the watch closes. torchrun stops a survivor with SIGTERM just as its
        # collective fails on the dead rank, so the signal often lands while the watch closes;
        # raised there, it would cut the close short and lose the report of the error.
        extra.append(_ScriptEnds(signals))
        return finish(*_run_script(w, target, steps, live=o.live and show, on_end=finish,
                                   end_here=end_here, contexts=extra))


class _ScriptEnds:
    """``with``: on exit (the script has ended), a first signal is only recorded."""

    def __init__(self, signals: Signals) -> None:
        self._signals = signals

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._signals.reporting()


class _Locked:
    """``with stack:`` whose exit holds ``lock``."""

    def __init__(self, stack: ExitStack, lock: threading.Lock) -> None:
        self._stack, self._lock = stack, lock

    def __enter__(self) -> ExitStack:
        return self._stack

    def __exit__(self, *exc: Any) -> bool:
        with self._lock:
            return bool(self._stack.__exit__(*exc))


def _run_script(w: Watch, target: Target, steps: int, live: bool = False,
                on_end: Callable[[str, str | None, int, BaseException | None], object]
                | None = None,
                end_here: list[Callable[[str, str | None, int], None]] | None = None,
                contexts: Sequence[AbstractContextManager[object]] = (),
                ) -> tuple[str, str | None, int, BaseException | None]:
    """Run the target under ``w``: (status, detail, exit code, the script's exception);
    ``live``: with the live panel on stderr while it runs; ``on_end``: called with the same,
    in place, when the run ends where the script is (``os._exit``, or ``end_here[0]``, which
    this sets); the process exits after it; ``contexts``: entered around the script."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    saved_main = sys.modules.get("__main__")

    def restore() -> None:
        sys.argv, sys.path[:] = saved_argv, saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main

    sys.argv = list(target.argv)
    if target.kind == "path":
        sys.path.insert(0, str(Path(target.target).resolve().parent))
    else:
        sys.path.insert(0, os.getcwd())
    status, detail, code = "completed", None, 0
    error: BaseException | None = None
    running = ExitStack()
    closing = threading.Lock()
    """Held while ``running`` closes: the run may end in place on another thread (a rank's
    main thread blocked in native code) while the main thread unwinds."""

    def end_in_place(status: str, detail: str | None, code: int) -> None:
        with closing:  # the live panel, then the watch: every hook removed, readings taken
            running.close()
        restore()
        if on_end is not None:
            on_end(status, detail, code, None)

    def os_exit(n: int) -> None:
        end_in_place("completed" if n == 0 else "script_error",
                     f"the script ended with os._exit({n})", n)

    if end_here is not None:
        end_here[:] = [end_in_place]

    guard = OsExitGuard(os_exit)
    try:
        with _Locked(running, closing):
            running.enter_context(w)
            if w.metrics_server is not None and w.rank.rank == 0:
                print(f"redline: live metrics at {w.metrics_server.url}", file=sys.stderr,
                      flush=True)
            shown = running.enter_context(live_panel(w, enabled=live))
            if live and not shown:
                print("redline: the live panel needs a terminal on stderr; running without the "
                      "panel", file=sys.stderr, flush=True)
            for c in contexts:
                running.enter_context(c)
            with guard:
                if target.kind == "path":
                    # Absolute, as Python (3.9+) makes a script's __file__: a script that
                    # changes directory still finds the files beside it.
                    runpy.run_path(os.path.abspath(target.target), run_name="__main__")
                else:
                    runpy.run_module(target.target, run_name="__main__", alter_sys=True)
    except MetricsServerError as e:  # before the script ran: a usage error, not the script's
        raise DoctorError(str(e)) from None
    except StopMeasurement:
        status, detail = "step_limit", f"stopped after {steps} measured steps (the limit)"
    except SystemExit as e:
        code = _exit_code(e.code)
        if code != 0:
            status, detail = "script_error", f"the script exited with code {code}"
    except KeyboardInterrupt as e:
        forget_unhandled_interrupt()  # caught: the run ends with 130, not a signal
        status, detail, code, error = "interrupted", "interrupted (Ctrl-C)", 130, e
    except Terminated as e:
        left = w.inst.data.stop_workers() if w.inst is not None else None
        status, code, error = "interrupted", 128 + e.signum, e
        detail = (f"terminated ({signal.Signals(e.signum).name})"
                  + ("" if left is None else "; DataLoader workers stopped" if left == 0 else
                     f"; {left} DataLoader worker(s) could not be stopped"))
    except BaseException as e:
        status = "script_error"
        detail = f"the script raised {type(e).__name__}: {e}"
        code, error = 1, e
        _print_script_traceback(e)
    finally:
        # Normally closed already, by the `with` above; not where a signal raised in redline's
        # own exit code before the stack's exit ran (then the watch is closed here).
        with closing:
            running.close()
        if os._exit == guard._exit:  # a signal cut the guard's own exit short
            os._exit = REAL_EXIT
        restore()
    return status, detail, code, error
