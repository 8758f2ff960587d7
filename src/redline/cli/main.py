"""``redline`` command line: argument parsing and exit codes over the library.

Each sub-command's defaults come from the library's config dataclasses, its values are
validated there, and every error is printed by :func:`_fail` as ``redline CMD: error: …``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from redline._version import __version__
from redline.cli.args import (
    ArgumentParser,
    dest_flags,
    flag_words,
    int_at_least,
    non_negative_float,
    port,
)
from redline.core.errors import RedlineError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from typing import Any

DEMO_STEPS = 30
"""Measured steps of ``redline demo``'s naive run."""
HTML_HELP = ("also write a self-contained HTML report (charts inline, opens offline) to PATH; "
             "needs redline[html]")


def _fail(command: str, message: str, code: int) -> int:
    """Print an error the one way every sub-command does, and return its exit code."""
    print(f"redline {command}: error: {message}", file=sys.stderr)
    return code


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``command`` only that sub-command's arguments (the
    others listed by name and help): each sub-command's defaults come from its library's
    config, which need not be loaded to run another one (``redline trace`` loads neither the
    doctor's, the tuner's nor the planner's)."""
    p = ArgumentParser(prog="redline", description=(
        "Measure how busy the accelerator really is, say why it idles, and what to change."))
    p.add_argument("--version", action="version", version=f"redline {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, (help_text, add_arguments) in _commands().items():
        if command is None or command == name:
            add_arguments(sub, help_text)
        else:
            sub.add_parser(name, help=help_text)
    return p


def _commands() -> dict[str, tuple[str, Callable[[Any, str], None]]]:
    """Sub-command → (its one-line help, the function that adds its parser), in help order."""
    from redline.cli import compare as compare_cli
    from redline.cli import plan as plan_cli

    return {
        "doctor": ("measure and diagnose an unmodified training script", _add_doctor),
        "trace": ("analyse PyTorch profiler (Kineto) traces", _add_trace),
        "tune": ("tune a training script's setup: loader, batch, precision, kernels; "
                 "before/after table and a plan", _add_tune),
        "plan": (plan_cli.HELP, plan_cli.add_parser),
        "compare": (compare_cli.HELP, compare_cli.add_parser),
        "demo": ("run a built-in naive workload under redline and report", _add_demo),
        "report": ("make a self-contained HTML report from saved JSON", _add_report),
    }


def _add_doctor(sub: Any, help_text: str) -> None:
    from redline.doctor.options import DoctorOptions
    from redline.measure.config import WatchConfig

    defaults = DoctorOptions()
    watch_defaults = WatchConfig()
    d = sub.add_parser("doctor", help=help_text,
                       description="Run `python script.py args` (or `python -m module args`) "
                       "unchanged under redline's instrumentation and print the report.")
    d.add_argument("--steps", dest="steps",
                   type=int_at_least("--steps", 1, "measured steps after warm-up"),
                   default=defaults.steps,
                   help=f"measured steps after warm-up, then stop (default: {defaults.steps})")
    d.add_argument("--warmup", dest="warmup",
                   type=int_at_least("--warmup", 0, "steps left out at the start"),
                   default=defaults.warmup,
                   help=f"steps left out of the statistics at the start (default: "
                   f"{defaults.warmup})")
    d.add_argument("--json", dest="json_path", metavar="PATH", default=defaults.json_path,
                   help="also write the report as JSON to PATH")
    d.add_argument("--no-flops", dest="count_flops", action="store_false",
                   default=defaults.count_flops,
                   help="do not count FLOPs (MFU is then unknown)")
    d.add_argument("--tune-loader", dest="tune_loader", action="store_true",
                   default=defaults.tune_loader,
                   help="when the loop starves for data, time DataLoader settings in it "
                   "(rebuilding your loader) and put the measured best in the fix")
    d.add_argument("--trace", dest="trace_dir", nargs="?", const="redline-trace", metavar="DIR",
                   default=defaults.trace_dir,
                   help=f"also record a short torch.profiler trace ({watch_defaults.trace_steps} steps, "
                   "excluded from the statistics) into DIR (default ./redline-trace), analyse "
                   "it and add its findings")
    d.add_argument("--metrics-port", dest="metrics_port", type=port("--metrics-port"),
                   metavar="PORT", default=defaults.metrics_port,
                   help="serve live Prometheus metrics (redline_*) on PORT while the script "
                   "runs (each rank of a job: PORT + LOCAL_RANK); needs redline[metrics]")
    d.add_argument("--metrics-address", dest="metrics_address", metavar="ADDR",
                   default=defaults.metrics_address,
                   help="address the metrics endpoint binds to (default: "
                   f"{defaults.metrics_address}, this machine only; 0.0.0.0 = every interface)")
    d.add_argument("--timeline", dest="timeline_path", metavar="PATH",
                   default=defaults.timeline_path,
                   help="also write the steps (a track per phase, per rank) and the sampled "
                   "CPU/GPU counters as a Chrome-trace JSON for Perfetto UI to PATH")
    d.add_argument("--html", dest="html_path", metavar="PATH", default=defaults.html_path,
                   help=HTML_HELP)
    d.add_argument("--live", dest="live", action="store_true", default=defaults.live,
                   help="while the script runs, show a live panel on stderr (steps, step time, "
                   "phase bars, data wait, the leading issue so far), redrawn twice a second; "
                   "the script's output goes above it; erased at exit")
    d.add_argument("--device", dest="device", metavar="DEVICE", default=defaults.device,
                   help="the device the script trains on ('cuda', 'cuda:1', 'cpu'; default: "
                   "CUDA if available, else CPU)")
    d.add_argument("cmd", nargs=argparse.REMAINDER, help="-- python train.py [args]")
    d.set_defaults(func=_doctor, parser=d)


def _add_trace(sub: Any, help_text: str) -> None:
    t = sub.add_parser("trace", help=help_text,
                       description="Where GPU time goes and why the GPU idles, from "
                       "torch.profiler traces: one file, or a folder of per-rank files "
                       "(.json or .json.gz).")
    t.add_argument("paths", nargs="+", metavar="PATH",
                   help="trace files (.json, .json.gz) or folders of them, one per rank")
    t.add_argument("--json", metavar="PATH", help="also write the analysis as JSON to PATH")
    t.add_argument("--html", metavar="PATH", help=HTML_HELP)
    t.add_argument("--hta-compat", action="store_true",
                   help="round fractional timestamps as Holistic Trace Analysis does "
                   "(to compare numbers with it)")
    t.set_defaults(func=_trace)


def _add_tune(sub: Any, help_text: str) -> None:
    from redline.tune.config import TuneConfig

    defaults = TuneConfig()
    u = sub.add_parser("tune", help=help_text,
                       description="Load SCRIPT (its __main__ block does not run), call its "
                       "factory (default redline_setup(), returning redline.tune.TrainSetup) "
                       "once per trial and walk the path data pipeline → batch size → "
                       "precision → kernels, keeping what measured faster and numerically "
                       "safe. Your files are only read. Under torchrun (torchrun "
                       "--nproc_per_node=N --no-python redline tune SCRIPT) every rank runs the "
                       "same trials on its shard, DDP bucket settings are measured too, and "
                       "rank 0 prints the result and writes the plan.")
    u.add_argument("script", help="a Python file that defines the factory")
    u.add_argument("--factory", default="redline_setup",
                   help="name of the factory function (default: redline_setup)")
    u.add_argument("--steps", type=int_at_least("--steps", 1, "measured steps per trial"),
                   default=defaults.steps_per_trial,
                   help=f"measured optimizer steps per trial (default: {defaults.steps_per_trial})")
    u.add_argument("--rounds", type=int_at_least(
                       "--rounds", 1, "times each comparison alternates current and candidate"),
                   default=defaults.rounds,
                   help="times each comparison alternates current and candidate (default: "
                   f"{defaults.rounds})")
    u.add_argument("--run-steps", type=int_at_least(
                       "--run-steps", 1, "optimizer steps of the planned job"), default=None,
                   help="optimizer steps of the planned job, for compile amortization and "
                   "the time/cost/energy projection (default: the setup's, else 10,000)")
    u.add_argument("--price-per-hour", type=non_negative_float("--price-per-hour"),
                   default=None, metavar="PRICE",
                   help="price of one device-hour, for the cost projection")
    u.add_argument("--plan", metavar="PATH", default="redline-plan.json",
                   help="where to write the plan (default: ./redline-plan.json)")
    u.add_argument("--json", metavar="PATH", help="also write the whole result as JSON")
    u.add_argument("--html", metavar="PATH", help=HTML_HELP)
    u.add_argument("--no-compile", action="store_true", help="do not try torch.compile")
    u.add_argument("--fresh", action="store_true",
                   help="search again even if a plan for this model/device/inputs is remembered")
    u.add_argument("--allow-batch-change", action="store_true",
                   help="let the effective batch grow (up to what memory allows, at most 8×) "
                   "with the learning rate rescaled (linear with warm-up for SGD, square root "
                   "for Adam-family optimizers) after a check of the loss over the same "
                   "samples: this changes the optimization (docs/tune.md)")
    u.add_argument("--settings-for", choices=("lightning", "hf"), default=None,
                   help="also print the plan as Lightning Trainer/DataLoader arguments or "
                   "Hugging Face TrainingArguments (docs/integrations.md)")
    u.set_defaults(func=_tune)


def _add_demo(sub: Any, help_text: str) -> None:
    m = sub.add_parser("demo", help=help_text,
                       description="Train a built-in workload (no download) with its naive "
                       "defaults under redline.watch and print the report.")
    m.add_argument("--workload", choices=["vision", "vision-storage", "vision-large", "lm",
                                          "lm-large"],
                   default=None,
                   help="vision: small CNN on JPEGs decoded per sample (CPU-sized); "
                   "vision-storage: the same, its JPEGs read from files after SIMULATED "
                   "storage latency (storage-bound); "
                   "vision-large: ResNet-50 on the same data (GPU-sized); lm: a small "
                   "transformer language model; lm-large: GPT-2-small-shaped (GPU-sized) "
                   "(default: lm-large on a GPU, else vision)")
    m.add_argument("--steps", type=int_at_least("--steps", 1, "measured steps"),
                   default=DEMO_STEPS, help=f"measured steps (default: {DEMO_STEPS})")
    m.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    m.add_argument("--html", metavar="PATH",
                   help="also write a self-contained HTML report of the naive run and of what "
                   "tuning made of it, side by side, to PATH; needs redline[html]")
    m.add_argument("--no-tune", action="store_true",
                   help="only measure and diagnose the naive workload; do not tune it")
    m.add_argument("--simulated-accelerator", action="store_true",
                   help="run the vision model on a SIMULATED accelerator (device time slept, "
                   "GIL released, the model's math a CPU stand-in) to show what tuning does "
                   "for a GPU job on a CPU-only machine; labelled in every output")
    m.add_argument("--allow-batch-change", action="store_true",
                   help="let the tuning grow the effective batch (at most 8×, learning rate "
                   "rescaled by a stated rule, checked on the loss), as `redline tune "
                   "--allow-batch-change`: this changes the optimization (docs/tune.md)")
    m.set_defaults(func=_demo)


def _add_report(sub: Any, help_text: str) -> None:
    r = sub.add_parser("report", help=help_text,
                       description="Read JSON documents written by redline (doctor, demo, "
                       "trace or tune --json) and write one HTML page with their charts; a "
                       "report and a tuning result given together are shown side by side.")
    r.add_argument("paths", nargs="+", metavar="JSON",
                   help="JSON documents written by redline (doctor, demo, tune, trace)")
    r.add_argument("--html", metavar="PATH", required=True,
                   help="the HTML file to write (charts inline, opens offline)")
    r.set_defaults(func=_report)


def _doctor(args: argparse.Namespace) -> int:
    import dataclasses

    from redline.doctor.options import DoctorError, DoctorOptions
    from redline.doctor.runner import run_doctor

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    flags = dest_flags(args.parser)
    try:
        options = DoctorOptions(**{f.name: getattr(args, f.name)
                                   for f in dataclasses.fields(DoctorOptions)})
        result = run_doctor(cmd, options)
    except DoctorError as e:
        return _fail("doctor", flag_words(str(e), flags), 2)
    except (OSError, RedlineError) as e:  # a report could not be written (disk full, …)
        return _fail("doctor", flag_words(str(e), flags), 1)
    return result.exit_code


def _trace(args: argparse.Namespace) -> int:
    import json
    import warnings

    from redline.core.files import OutputPathError, refuse_overwriting_inputs, write_text_atomic
    from redline.diagnose.trace_rules import diagnose_trace
    from redline.report.json_io import plain
    from redline.report.trace_render import render, to_dict
    from redline.trace import TraceError, analyze_paths, trace_files

    try:
        refuse_overwriting_inputs({"--json": args.json, "--html": args.html},
                                  {"a trace to analyse": trace_files(args.paths)})
        _check_outputs({"--json": args.json})
        _check_html(args.html)
    except (OutputPathError, TraceError, RedlineError) as e:
        return _fail("trace", str(e), 2)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            analysis = analyze_paths(args.paths, hta_compat=args.hta_compat)
        analysis.warnings[:0] = [str(w.message) for w in caught]
    except TraceError as e:
        return _fail("trace", str(e), 2)
    findings = diagnose_trace(analysis)
    render(analysis, findings)
    if not (args.json or args.html):
        return 0
    doc = to_dict(analysis, findings)  # only for the files asked: ~1 ms on a 2-rank trace
    try:
        if args.json:
            write_text_atomic(json.dumps(doc, indent=1, default=str, allow_nan=False), args.json)
        _write_html(args.html, [plain(doc)],
                    [" ".join(str(x) for x in args.paths)])
    except (OSError, RedlineError) as e:
        return _fail("trace", str(e), 1)
    return 0


TUNE_FLAGS = {"steps_per_trial": "--steps", "rounds": "--rounds", "run_steps": "--run-steps",
              "price_per_device_hour": "--price-per-hour",
              "allow_batch_change": "--allow-batch-change", "name": "--factory"}
"""The tuner's field names (of ``TuneConfig``, and ``load_factory``'s ``name``) that its
messages and progress lines name → this command's flags."""


def _tune_words(message: str) -> str:
    """A tuner's message or progress line with its fields shown as ``redline tune``'s flags;
    other quoted words (code, such as an `` `if` ``) are left as they are."""
    return flag_words(message, TUNE_FLAGS, keep_unknown=True)


def _tune(args: argparse.Namespace) -> int:
    import json

    from redline.core.files import refuse_overwriting_inputs, write_text_atomic
    from redline.measure.ranks import rank_info
    from redline.report.json_io import plain
    from redline.report.tune_render import render, to_dict
    from redline.tune import BatchDoesNotFitError, TuneConfig, load_factory, save_plan, tune

    try:
        refuse_overwriting_inputs({"--plan": args.plan, "--json": args.json, "--html": args.html},
                                  {"the script to tune": [args.script]})
        _check_outputs({"--plan": args.plan, "--json": args.json})
        _check_html(args.html)
        factory = load_factory(args.script, args.factory)
        cfg = TuneConfig(steps_per_trial=args.steps, rounds=args.rounds,
                         run_steps=args.run_steps, price_per_device_hour=args.price_per_hour,
                         try_compile=not args.no_compile, reuse=not args.fresh,
                         allow_batch_change=args.allow_batch_change)
        result = tune(factory, cfg, log=lambda line: print(_tune_words(line), flush=True))
    except BatchDoesNotFitError as e:
        hint = ""
        if e.params is not None and e.global_batch is not None:
            hint = (f" To spread it over more devices, plan it: redline plan {args.script} "
                    f"--gpus N --gpu GPU --global-batch {e.global_batch} (or --params "
                    f"{e.params} with its shape instead of the script)")
        return _fail("tune", _tune_words(str(e)) + hint, 2)
    except RedlineError as e:
        return _fail("tune", _tune_words(str(e)), 2)
    except KeyboardInterrupt:
        from redline.measure.interrupts import forget_unhandled_interrupt

        forget_unhandled_interrupt()  # caught: the command ends with 130, not a signal
        return _fail("tune", "interrupted; no plan written", 130)
    if rank_info().rank != 0:
        return 0  # rank 0 speaks and writes for the job (every rank took the same path)
    render(result)
    if args.settings_for is not None:
        from redline.integrations.settings import hf_settings, lightning_settings

        export = lightning_settings if args.settings_for == "lightning" else hf_settings
        print(f"as {args.settings_for} settings:\n{export(result.plan).snippet()}")
    try:
        save_plan(result.plan, args.plan)
        print(f"plan written to {args.plan}")
        doc = plain(to_dict(result))
        if args.json:
            write_text_atomic(json.dumps(doc, indent=1), args.json)
        _write_html(args.html, [doc], [args.script])
    except (OSError, RedlineError) as e:
        return _fail("tune", str(e), 1)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from redline.demo import default_workload, run_demo
    from redline.tune.config import TuneConfig
    from redline.workloads.simulated import SimulatedAccelerator

    if args.simulated_accelerator and args.workload not in (None, "vision"):
        return _fail("demo", "--simulated-accelerator paces the 'vision' workload only (its "
                     f"data path is what the simulation shows); got --workload {args.workload}",
                     2)
    try:
        _check_outputs({"--json": args.json})
        _check_html(args.html)
    except RedlineError as e:
        return _fail("demo", str(e), 2)
    try:
        ran = run_demo(
            args.workload or default_workload(args.simulated_accelerator), steps=args.steps,
            json_path=args.json, tune_after=not args.no_tune,
            tune_config=TuneConfig(try_compile=False, reuse=False,
                                   allow_batch_change=args.allow_batch_change),
            simulated=SimulatedAccelerator() if args.simulated_accelerator else None)
        if args.html:
            from redline.report.json_io import plain, to_dict
            from redline.report.tune_render import to_dict as tune_dict

            report, result = ran
            docs = [to_dict(report)]
            if result is not None:
                docs.append(plain(tune_dict(result)))
            _write_html(args.html, docs, ["naive run", "tuned"][:len(docs)])
    except (OSError, RedlineError) as e:
        return _fail("demo", str(e), 1)
    return 0


def _check_html(path: str | None) -> None:
    """Before the work: plotly is there and PATH can take the page."""
    if path is None:
        return
    from redline.report.html import HtmlReportError, check_available

    check_available()
    _check_outputs({"--html": path}, HtmlReportError)


def _check_outputs(outputs: dict[str, str | None],
                   error: type[RedlineError] | None = None) -> None:
    """Before the work: each output (flag → path) can be written at its end (not a directory,
    in an existing writable folder); raises ``error`` (default OutputPathError) saying which
    flag, which path and what to do."""
    from redline.core.files import OutputPathError, output_problem

    for flag, path in outputs.items():
        problem = None if path is None else output_problem(flag, path)
        if problem is not None:
            raise (error or OutputPathError)(problem)


def _write_html(path: str | None, docs: list[dict[str, object]], sources: list[str]) -> None:
    if path is None:
        return
    from redline.report.html import write_html

    page = write_html(docs, path, sources)
    print(f"HTML report written to {page} (opens offline in a browser)")


def _report(args: argparse.Namespace) -> int:
    from redline.core.files import OutputPathError, refuse_overwriting_inputs
    from redline.report.html import read_documents

    try:
        refuse_overwriting_inputs({"--html": args.html}, {"a JSON document": list(args.paths)})
        _check_html(args.html)
        docs = read_documents(list(args.paths))
    except (OutputPathError, RedlineError) as e:
        return _fail("report", str(e), 2)
    try:
        _write_html(args.html, docs, list(args.paths))
    except (OSError, RedlineError) as e:
        return _fail("report", str(e), 1)
    return 0


def _printable_streams() -> None:
    """Reports use µ, →, ×, box and bar characters: where the terminal's encoding cannot show
    them (LANG=C, PYTHONIOENCODING=ascii, a pipe to a legacy tool), print a stand-in rather
    than fail after the work is done."""
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None) or "ascii"
        try:
            "µ→×█─".encode(encoding)
        except (UnicodeEncodeError, LookupError):
            reconfigure = getattr(stream, "reconfigure", None)
            if reconfigure is not None:
                reconfigure(errors="replace")


def _command_named(argv: list[str]) -> str | None:
    """The sub-command ``argv`` runs (its first word, past ``--version`` / ``-h``), or None
    when it names none (then the whole parser reports what is missing)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in _commands() else None
    return None


def main(argv: list[str] | None = None) -> int:
    _printable_streams()
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(_command_named(words)).parse_args(words)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
