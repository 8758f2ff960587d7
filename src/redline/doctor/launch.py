"""``redline doctor -- torchrun ...``: every rank runs under redline, not only the launcher.

The launcher's command is rewritten so that torchrun starts ``redline doctor`` on each rank,
which then runs the user's script: ``torchrun [its options] --no-python <python> -m
redline.doctor OPTIONS_JSON -- python script.py args`` (doctor's options as one JSON
document, see :mod:`redline.doctor.options`). torchrun keeps its own
options (processes per node, nodes, rendezvous), restarts and exit code; rank 0 prints the
merged report and writes the JSON.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

_MODULES = ("torch.distributed.run", "torch.distributed.launch")


def _launcher_argv(cmd: list[str]) -> list[str] | None:
    """The launcher's own arguments when ``cmd`` starts torchrun (or ``python -m
    torch.distributed.run``), else None."""
    if not cmd:
        return None
    if Path(cmd[0]).name == "torchrun":
        return cmd[1:]
    if Path(cmd[0]).name.startswith("python") and len(cmd) > 2 and cmd[1] == "-m" \
            and cmd[2] in _MODULES:
        return cmd[3:]
    return None


def rank_command(cmd: list[str], options_json: str) -> list[str] | None:
    """The rewritten command (see the module docstring), or None when ``cmd`` is no launcher;
    ``options_json``: doctor's options, one JSON document (``DoctorOptions.to_json``).

    Raises:
        ValueError: the launcher's arguments do not parse, or name no script.
    """
    argv = _launcher_argv(cmd)
    if argv is None:
        return None
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.exit_on_error = False
    try:
        args: Any = parser.parse_args(argv)
    except (SystemExit, Exception) as e:
        raise ValueError(f"the launcher's arguments do not parse ({e})") from None
    if not args.training_script:
        raise ValueError("the launcher command names no training script")
    n_after = len(args.training_script_args)
    script_at = len(argv) - n_after - 1
    own = [a for a in argv[:script_at]
           if a not in ("-m", "--module", "--no-python", "--no_python", "--run-path",
                        "--run_path")]
    if args.no_python:
        inner = [args.training_script, *args.training_script_args]
    elif args.module:
        inner = ["python", "-m", args.training_script, *args.training_script_args]
    else:
        inner = ["python", args.training_script, *args.training_script_args]
    return [sys.executable, "-m", "torch.distributed.run", *own, "--no-python", sys.executable,
            "-m", "redline.doctor", options_json, "--", *inner]


def run_launcher(command: list[str]) -> int:
    """Run the rewritten launcher; forward SIGINT and SIGTERM to it (it stops the ranks, which
    write their reports); return its exit code."""
    proc = subprocess.Popen(command)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def forward(signum: int, frame: object) -> None:
        proc.send_signal(signum)

    for s in previous:
        signal.signal(s, forward)
    try:
        return proc.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
