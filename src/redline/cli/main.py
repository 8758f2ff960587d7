"""``redline`` command line: a thin layer over the library (argument parsing and exit codes)."""

from __future__ import annotations

import argparse
import sys

from redline._version import __version__


def _positive(name: str) -> type[int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if v < 1:
            raise argparse.ArgumentTypeError(
                f"{name} must be >= 1 (the number of measured steps after warm-up), got {v}")
        return v

    return parse  # type: ignore[return-value]


def _non_negative(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"--warmup must be >= 0, got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="redline", description=(
        "Measure how busy the accelerator really is, say why it idles, and what to change."))
    p.add_argument("--version", action="version", version=f"redline {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("doctor", help="measure and diagnose an unmodified training script",
                       description="Run `python script.py args` (or `python -m module args`) "
                       "unchanged under redline's instrumentation and print the report.")
    d.add_argument("--steps", type=_positive("--steps"), default=50,
                   help="measured steps after warm-up, then stop (default: 50)")
    d.add_argument("--warmup", type=_non_negative, default=5,
                   help="steps left out of the statistics at the start (default: 5)")
    d.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    d.add_argument("--no-flops", action="store_true",
                   help="do not count FLOPs (MFU is then unknown)")
    d.add_argument("--tune-loader", action="store_true",
                   help="when the loop starves for data, time DataLoader settings in it "
                   "(rebuilding your loader) and put the measured best in the fix")
    d.add_argument("--trace", nargs="?", const="redline-trace", metavar="DIR",
                   help="also record a short torch.profiler trace (5 steps, excluded from the "
                   "statistics) into DIR (default ./redline-trace), analyse it and add its "
                   "findings")
    d.add_argument("cmd", nargs=argparse.REMAINDER, help="-- python train.py [args]")

    t = sub.add_parser("trace", help="analyse PyTorch profiler (Kineto) traces",
                       description="Where GPU time goes and why the GPU idles, from "
                       "torch.profiler traces: one file, or a folder of per-rank files "
                       "(.json or .json.gz).")
    t.add_argument("paths", nargs="+", metavar="PATH")
    t.add_argument("--json", metavar="PATH", help="also write the analysis as JSON to PATH")
    t.add_argument("--hta-compat", action="store_true",
                   help="round fractional timestamps as Holistic Trace Analysis does "
                   "(to compare numbers with it)")

    u = sub.add_parser("tune", help="tune a training script's setup: loader, batch, precision, "
                       "kernels; before/after table and a plan",
                       description="Load SCRIPT (its __main__ block does not run), call its "
                       "factory (default redline_setup(), returning redline.tune.TrainSetup) "
                       "once per trial and walk the path data pipeline → batch size → "
                       "precision → kernels, keeping what measured faster and numerically "
                       "safe. Your files are only read.")
    u.add_argument("script", help="a Python file that defines the factory")
    u.add_argument("--factory", default="redline_setup",
                   help="name of the factory function (default: redline_setup)")
    u.add_argument("--steps", type=_positive("--steps"), default=6,
                   help="measured optimizer steps per trial (default: 6)")
    u.add_argument("--rounds", type=_positive("--rounds"), default=2,
                   help="times each comparison alternates current and candidate (default: 2)")
    u.add_argument("--run-steps", type=_positive("--run-steps"), default=None,
                   help="optimizer steps of the planned job, for compile amortization and "
                   "the time/cost/energy projection (default: the setup's, else 10,000)")
    u.add_argument("--price-per-hour", type=float, default=None, metavar="PRICE",
                   help="price of one device-hour, for the cost projection")
    u.add_argument("--plan", metavar="PATH", default="redline-plan.json",
                   help="where to write the plan (default: ./redline-plan.json)")
    u.add_argument("--json", metavar="PATH", help="also write the whole result as JSON")
    u.add_argument("--no-compile", action="store_true", help="do not try torch.compile")
    u.add_argument("--fresh", action="store_true",
                   help="search again even if a plan for this model/device/inputs is remembered")

    m = sub.add_parser("demo", help="run a built-in naive workload under redline and report",
                       description="Train a built-in workload (no download) with its naive "
                       "defaults under redline.watch and print the report.")
    m.add_argument("--workload", choices=["vision", "vision-large", "lm", "lm-large"],
                   default=None,
                   help="vision: small CNN on JPEGs decoded per sample (CPU-sized); "
                   "vision-large: ResNet-50 on the same data (GPU-sized); lm: a small "
                   "transformer language model; lm-large: GPT-2-small-shaped (GPU-sized) "
                   "(default: lm-large on a GPU, else vision)")
    m.add_argument("--steps", type=_positive("--steps"), default=30,
                   help="measured steps (default: 30)")
    m.add_argument("--json", metavar="PATH", help="also write the report as JSON to PATH")
    m.add_argument("--no-tune", action="store_true",
                   help="only measure and diagnose the naive workload; do not tune it")
    m.add_argument("--simulated-accelerator", action="store_true",
                   help="run the vision model on a SIMULATED accelerator (device time slept, "
                   "GIL released, the model's math a CPU stand-in) to show what tuning does "
                   "for a GPU job on a CPU-only machine; labelled in every output")
    return p


def _doctor(args: argparse.Namespace) -> int:
    from redline.doctor.runner import DoctorError, run_doctor

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    try:
        result = run_doctor(cmd, steps=args.steps, warmup=args.warmup, json_path=args.json,
                            count_flops=not args.no_flops, trace_dir=args.trace,
                            tune_loader=args.tune_loader)
    except DoctorError as e:
        print(f"redline doctor: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the JSON report could not be written (disk full, permissions)
        print(f"redline doctor: error: {e}", file=sys.stderr)
        return 1
    return result.exit_code


def _trace(args: argparse.Namespace) -> int:
    import json
    import warnings

    from rich.console import Console

    from redline.report.json_io import write_text_atomic
    from redline.trace import TraceError, analyze_paths
    from redline.trace.render import render, to_dict

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            analysis = analyze_paths(args.paths, hta_compat=args.hta_compat)
        analysis.warnings[:0] = [str(w.message) for w in caught]
    except TraceError as e:
        print(f"redline trace: error: {e}", file=sys.stderr)
        return 2
    render(analysis, Console())
    if args.json:
        try:
            write_text_atomic(json.dumps(to_dict(analysis), indent=1, default=str), args.json)
        except OSError as e:
            print(f"redline trace: error: {e}", file=sys.stderr)
            return 1
    return 0


def _tune(args: argparse.Namespace) -> int:
    import json
    import os

    from redline.report.json_io import write_text_atomic
    from redline.report.tune_render import render, to_dict
    from redline.tune import (
        BatchDoesNotFitError,
        NonFiniteLossError,
        SetupError,
        TuneConfig,
        load_factory,
        save_plan,
        tune,
    )

    if args.price_per_hour is not None and args.price_per_hour < 0:
        print(f"redline tune: error: --price-per-hour must be >= 0, got {args.price_per_hour}",
              file=sys.stderr)
        return 2
    script = os.path.abspath(args.script)
    for out in (args.plan, args.json):
        if out and os.path.abspath(out) == script:
            print(f"redline tune: error: refusing to overwrite the script {args.script} with "
                  "output", file=sys.stderr)
            return 2
    try:
        factory = load_factory(args.script, args.factory)
        cfg = TuneConfig(steps_per_trial=args.steps, rounds=args.rounds,
                         run_steps=args.run_steps, price_per_device_hour=args.price_per_hour,
                         try_compile=not args.no_compile, reuse=not args.fresh)
        result = tune(factory, cfg, log=lambda s: print(s, flush=True))
    except (SetupError, BatchDoesNotFitError, NonFiniteLossError) as e:
        print(f"redline tune: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("redline tune: interrupted; no plan written", file=sys.stderr)
        return 130
    render(result)
    try:
        save_plan(result.plan, args.plan)
        print(f"plan written to {args.plan}")
        if args.json:
            write_text_atomic(json.dumps(to_dict(result), indent=1, default=str), args.json)
    except OSError as e:
        print(f"redline tune: error: {e}", file=sys.stderr)
        return 1
    return 0


def _demo(args: argparse.Namespace) -> int:
    from redline.demo import default_workload, run_demo
    from redline.workloads.simulated import SimulatedAccelerator

    if args.simulated_accelerator and args.workload not in (None, "vision"):
        print(f"redline demo: error: --simulated-accelerator paces the 'vision' workload only "
              f"(its data path is what the simulation shows); got --workload {args.workload}",
              file=sys.stderr)
        return 2
    try:
        run_demo(args.workload or default_workload(args.simulated_accelerator),
                 steps=args.steps, json_path=args.json,
                 tune_after=not args.no_tune,
                 simulated=SimulatedAccelerator() if args.simulated_accelerator else None)
    except OSError as e:
        print(f"redline demo: error: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "trace":
        return _trace(args)
    if args.command == "tune":
        return _tune(args)
    return _demo(args)


if __name__ == "__main__":
    sys.exit(main())
