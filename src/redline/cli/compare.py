"""``redline compare BEFORE AFTER``: arguments, output files and exit codes over
:mod:`redline.compare` (thin, like the rest of the CLI). Runs without importing torch."""

from __future__ import annotations

import argparse
import sys

from redline.cli.args import flag_words

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from typing import Any

HELP = "compare two runs (reports, traces, or a plan and a report): verdict first"
FLAGS = {"min_effect_fraction": "--min-effect", "alpha": "--alpha"}
"""The comparison's field names → this command's flags."""
FAIL_ON = ("regression", "improvement", "unknown")
"""Verdicts ``--fail-on`` can name (``no significant change`` never fails)."""
EXIT_FAILED_ON = 3
"""Exit code when the verdict is one ``--fail-on`` names (0: compared; 1: an output could not
be written; 2: an input or flag that cannot be used)."""


def _percent(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--min-effect must be a number (percent), got "
                                         f"{text!r}") from None
    if not 0 <= v < 100:
        raise argparse.ArgumentTypeError(f"--min-effect must be in [0, 100) percent, got {text}")
    return v / 100


def _fail_on(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in FAIL_ON]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"--fail-on takes a comma-separated list of {', '.join(FAIL_ON)}; got {text!r}")
    return names


def add_parser(sub: Any, help_text: str = HELP) -> None:
    from redline.compare.model import ALPHA, MIN_EFFECT_FRACTION

    c = sub.add_parser(
        "compare", help=help_text,
        description="Compare BEFORE (the baseline) with AFTER: two doctor reports (redline "
        "doctor --json), two profiler traces (Kineto files or folders of per-rank files), or a "
        "plan (redline plan --json) and the doctor report of the run. Prints the verdict first "
        "(regression / improvement / no significant change), tested against each run's own "
        "step-time spread (Welch's t on batch means), then the phases, findings, host metrics, "
        "kernels and operators that changed, and every way the runs differ otherwise. Exit "
        f"codes: 0 compared, 1 an output could not be written, 2 an input or flag that cannot "
        f"be used, {EXIT_FAILED_ON} the verdict is one --fail-on names.")
    c.add_argument("before", metavar="BEFORE", help="the baseline: a report, a trace file or "
                   "folder, or a plan")
    c.add_argument("after", metavar="AFTER", help="the run judged against it: a report or a "
                   "trace")
    c.add_argument("--min-effect", dest="min_effect_fraction", type=_percent,
                   default=MIN_EFFECT_FRACTION, metavar="PCT",
                   help="smallest change of the step time (per sample when the batches differ), "
                   "in percent, called a regression or improvement; smaller ones, however "
                   f"certain, are no significant change (default: {MIN_EFFECT_FRACTION * 100:.0f} %%)")
    c.add_argument("--fail-on", dest="fail_on", type=_fail_on, default=None,
                   metavar="VERDICTS",
                   help=f"exit {EXIT_FAILED_ON} when the verdict is one of these "
                   f"(comma-separated: {', '.join(FAIL_ON)}), e.g. --fail-on regression in CI")
    c.add_argument("--json", dest="json_path", metavar="PATH",
                   help="also write the comparison as JSON to PATH")
    c.add_argument("--html", dest="html_path", metavar="PATH",
                   help="also write a self-contained HTML page of the comparison (charts "
                   "inline, opens offline) to PATH; needs redline[html]")
    c.set_defaults(func=run, alpha=ALPHA)


def _fail(message: str, code: int) -> int:
    print(f"redline compare: error: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console

    from redline.compare import compare_paths
    from redline.core.errors import RedlineError
    from redline.core.files import (
        OutputPathError,
        output_problem,
        refuse_overwriting_inputs,
        write_text_atomic,
    )
    from redline.report.compare_render import render, to_dict

    outputs = {"--json": args.json_path, "--html": args.html_path}
    try:
        refuse_overwriting_inputs(outputs, {"an input to compare": [args.before, args.after]})
        for flag, path in outputs.items():
            problem = None if path is None else output_problem(flag, path)
            if problem is not None:
                raise OutputPathError(problem)
        if args.html_path is not None:
            from redline.report.html import check_available

            check_available()
        comparison = compare_paths(args.before, args.after,
                                   min_effect_fraction=args.min_effect_fraction,
                                   alpha=args.alpha)
    except RedlineError as e:
        return _fail(flag_words(str(e), FLAGS), 2)
    render(comparison, Console())
    doc = to_dict(comparison)
    try:
        if args.json_path:
            write_text_atomic(json.dumps(doc, indent=1, allow_nan=False), args.json_path)
        if args.html_path:
            from redline.report.html import write_html

            page = write_html([doc], args.html_path, [f"{args.before} → {args.after}"])
            print(f"HTML report written to {page} (opens offline in a browser)")
    except (OSError, RedlineError) as e:
        return _fail(str(e), 1)
    if args.fail_on and comparison.verdict.verdict in args.fail_on:
        print(f"redline compare: the verdict is {comparison.verdict.verdict} "
              f"(--fail-on {','.join(args.fail_on)}): exit {EXIT_FAILED_ON}", file=sys.stderr)
        return EXIT_FAILED_ON
    return 0
