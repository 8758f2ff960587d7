"""``redline plan``: arguments and the call into :mod:`redline.plan` (thin, like the rest of
the CLI)."""

from __future__ import annotations

import argparse
import sys

from redline.cli.args import count, flag_words, positive_float

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from typing import Any

FLAGS = {
    "params": "--params", "layers": "--layers", "hidden": "--hidden", "heads": "--heads",
    "seq": "--seq", "vocab": "--vocab", "ffn_hidden": "--ffn-hidden", "path": "--config",
    "gpus": "--gpus", "gpus_per_node": "--gpus-per-node", "gpu": "--gpu",
    "memory_gb": "--gpu-memory-gb", "peak_tflops": "--peak-tflops",
    "intra_node_gbps": "--intra-node-gbps", "inter_node_gbps": "--inter-node-gbps",
    "price_per_gpu_hour": "--price-per-gpu-hour", "global_batch": "--global-batch",
    "precision": "--precision", "optimizer": "--optimizer", "mfu": "--mfu", "steps": "--steps",
}
"""The planner's field names (as its functions take them) → this command's flags."""


def plan_words(message: str) -> str:
    """A planner message with its `field` names as this command's flags."""
    return flag_words(message, FLAGS)


HELP = ("plan the parallelism (DP, ZeRO/FSDP, TP, PP, recompute, offload) before renting "
        "GPUs: memory per GPU, step time, ranked layouts")
"""The sub-command's one-line help (``redline --help`` lists it without loading the planner)."""


def add_parser(sub: Any, help_text: str = HELP) -> None:
    from redline.plan.memory import OPTIMIZERS, PRECISIONS
    from redline.plan.timing import DEFAULT_MFU

    a = sub.add_parser(
        "plan", help=help_text,
        description="Rank every layout of N GPUs that reproduces the global batch: memory per "
        "GPU term by term (with formulas), predicted step time with the communication math, "
        "why the chosen one and why not the others, and how to run it. The model: a script "
        "with a redline tune factory (built on the meta device: no memory), a local "
        "config.json, or numbers.")
    a.add_argument("script", nargs="?", help="a Python file with a setup factory (as for "
                   "redline tune); its model and activations are counted on the meta device")
    a.add_argument("--factory", default="redline_setup", help="the factory's name")
    a.add_argument("--config", metavar="PATH", help="a local Hugging Face-style config.json")
    for name, meaning in (("params", "trainable parameters (e.g. 7e9 or 7B)"),
                          ("layers", "transformer layers"), ("hidden", "hidden size"),
                          ("heads", "attention heads"), ("vocab", "vocabulary size"),
                          ("ffn-hidden", "MLP inner width")):
        a.add_argument(f"--{name}", type=count(f"--{name}"), default=None, help=meaning)
    a.add_argument("--seq", type=count("--seq"), default=None,
                   help="tokens per sequence (default: the config's)")
    a.add_argument("--gpus", type=count("--gpus"), required=True, help="GPUs of the job")
    a.add_argument("--gpus-per-node", type=count("--gpus-per-node"), default=8,
                   help="GPUs per node (default 8)")
    a.add_argument("--gpu", default="H100", help="GPU kind (default H100): H200, H100, "
                   "A100-80GB, A100-40GB, L40S, L4, V100, MI300X")
    a.add_argument("--gpu-memory-gb", type=positive_float("--gpu-memory-gb"), default=None,
                   help="memory per GPU in GB (default: the GPU's)")
    a.add_argument("--peak-tflops", type=positive_float("--peak-tflops"), default=None,
                   help="dense peak TFLOP/s per GPU at the precision (default: the table's)")
    a.add_argument("--intra-node-gbps", type=positive_float("--intra-node-gbps"), default=None,
                   help="GB/s per GPU and direction within a node (default: the GPU's)")
    a.add_argument("--inter-node-gbps", type=positive_float("--inter-node-gbps"), default=None,
                   help="GB/s per GPU and direction across nodes (default: the GPU's)")
    a.add_argument("--global-batch", type=count("--global-batch"), required=True,
                   help="sequences per optimizer step over all GPUs")
    a.add_argument("--precision", choices=PRECISIONS, default="bf16",
                   help="training precision of weights and activations (default: bf16)")
    a.add_argument("--optimizer", choices=OPTIMIZERS, default="adam",
                   help="optimizer, for its states' bytes per parameter (default: adam)")
    a.add_argument("--fp32-grad-accumulation", action="store_true",
                   help="gradients accumulate in fp32 (4 bytes/parameter more)")
    a.add_argument("--no-flash-attention", action="store_true",
                   help="attention stores its s² scores (no FlashAttention/SDPA)")
    a.add_argument("--mfu", type=positive_float("--mfu"), default=DEFAULT_MFU,
                   help=f"model FLOPs utilization assumed for compute (default {DEFAULT_MFU})")
    a.add_argument("--price-per-gpu-hour", type=positive_float("--price-per-gpu-hour"),
                   default=None, help="price of one GPU-hour, for the job's cost (default: "
                   "cost not shown)")
    a.add_argument("--steps", type=count("--steps"), default=None,
                   help="optimizer steps of the job, for time, cost and energy")
    a.add_argument("--top", type=count("--top"), default=5, help="layouts to list (default 5)")
    a.add_argument("--json", metavar="PATH", help="also write the plan as JSON")
    a.set_defaults(func=run)


def _check_json_output(args: argparse.Namespace) -> None:
    """Before planning: ``--json`` names a file that can be written and that is not the
    config or the script the plan is made from."""
    import os

    from redline.core.files import OutputPathError, output_problem, refuse_overwriting_inputs

    if args.json is None:
        return
    problem = output_problem("--json", args.json)
    if problem is not None:
        raise OutputPathError(problem)
    inputs: dict[str, list[str]] = {}
    if args.config:
        inputs["the config"] = [args.config, os.path.join(args.config, "config.json")]
    if args.script:
        inputs["the script"] = [args.script]
    refuse_overwriting_inputs({"--json": args.json}, inputs)


def run(args: argparse.Namespace) -> int:
    import json

    from redline.core.errors import RedlineError
    from redline.core.files import write_text_atomic
    from redline.plan.hardware import cluster
    from redline.plan.hf_config import from_config_json
    from redline.plan.limits import PlanInputError
    from redline.plan.memory import Training
    from redline.plan.outcome import plan_outcome
    from redline.plan.search import search
    from redline.plan.spec import from_numbers
    from redline.report.plan_render import render, to_dict

    def fail(msg: str, code: int = 2) -> int:
        print(f"redline plan: error: {plan_words(msg)}", file=sys.stderr)
        return code

    numbers = any(getattr(args, k) is not None for k in
                  ("params", "layers", "hidden", "heads", "vocab"))
    given = [n for n, v in (("SCRIPT", args.script), ("--config", args.config),
                            ("numbers", numbers)) if v]
    if len(given) != 1:
        return fail("give the model one way: a SCRIPT with a setup factory, --config "
                    "config.json, or numbers (--params, or --layers/--hidden/--heads/--vocab); "
                    f"got {', '.join(given) or 'none'}")
    measured = None
    try:
        _check_json_output(args)
        if args.script:
            from redline.plan.factory import from_factory
            from redline.tune.setup import SetupError, load_factory

            try:
                factory = load_factory(args.script, args.factory)
            except SetupError as e:
                raise PlanInputError(str(e)) from None
            spec, measured, why_not, _ = from_factory(factory, args.precision)
            if why_not:
                print(f"redline plan: activations not counted: {why_not}", file=sys.stderr)
            if args.seq:
                import dataclasses
                spec = dataclasses.replace(spec, seq=args.seq)
        elif args.config:
            spec = from_config_json(args.config, seq=args.seq)
        else:
            spec = from_numbers(params=args.params, layers=args.layers, hidden=args.hidden,
                                heads=args.heads, seq=args.seq, vocab=args.vocab,
                                ffn_hidden=args.ffn_hidden)
        tr = Training(global_batch=args.global_batch, seq=args.seq or spec.seq,
                      precision=args.precision, optimizer=args.optimizer,
                      fp32_grad_accumulation=args.fp32_grad_accumulation,
                      flash_attention=not args.no_flash_attention)
        cl = cluster(args.gpus, args.gpu, gpus_per_node=args.gpus_per_node,
                     precision=args.precision, memory_gb=args.gpu_memory_gb,
                     peak_tflops=args.peak_tflops, intra_node_gbps=args.intra_node_gbps,
                     inter_node_gbps=args.inter_node_gbps,
                     price_per_gpu_hour=args.price_per_gpu_hour)
        res = search(spec, tr, cl, args.mfu, measured=measured)
        # computed once, before anything prints: the JSON lists at least 10 layouts
        out = plan_outcome(res, steps=args.steps, top=max(args.top, 10),
                           script=args.script or "train.py")
    except RedlineError as e:
        return fail(str(e))
    render(out, top=args.top)
    if args.json:
        try:
            write_text_atomic(json.dumps(to_dict(out), indent=1, default=str) + "\n",
                              args.json)
        except OSError as e:
            return fail(str(e), 1)
        print(f"plan written to {args.json}")
    return 0 if res.best is not None else 1
