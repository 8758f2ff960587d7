"""The factory contract of ``redline tune``: what a training script hands over to be tuned.

A script exposes a function (default name ``redline_setup``) that takes no arguments and
returns a :class:`TrainSetup`. ``redline tune`` calls it once per isolated trial, so it must
build everything afresh (model, optimizer, loader) and should seed its RNGs: trials are then
compared from the same initial weights and data.

    def redline_setup() -> redline.tune.TrainSetup:
        torch.manual_seed(0)
        model = Net()
        return redline.tune.TrainSetup(
            model=model,
            optimizer=torch.optim.AdamW(model.parameters(), lr=3e-4),
            loader=DataLoader(ds, batch_size=32, shuffle=True),
            loss_fn=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
            accumulation_steps=2,
        )

The script is loaded with ``__name__ == "__redline_tune__"``, so a ``if __name__ ==
"__main__":`` training block does not run; the user's files are only read, never written. A
script that would run work on import (a training loop, a call, a ``with`` block outside any
function and outside that block) is refused before any of it runs (:func:`unguarded_line`).
"""

from __future__ import annotations

import ast
import os
import runpy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from redline.core.errors import RedlineError
from redline.data.cache_split import CacheSplit
from redline.data.device_decode import JpegSplit

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]


class SetupError(RedlineError, RuntimeError):
    """The factory or what it returned cannot be used; the message says what to change."""


@dataclass(kw_only=True, slots=True)
class TrainSetup:
    """One training configuration, as the user's loop runs it."""

    model: torch.nn.Module
    """The model, already on ``device``."""
    optimizer: torch.optim.Optimizer
    """Its optimizer, built over ``model.parameters()`` and not yet stepped."""
    loader: DataLoader[Any]
    """The training DataLoader, with the user's settings (rebuilt with tuned ones)."""
    loss_fn: LossFn
    """``loss_fn(model, batch) -> loss``: forward and a *mean-reduced* loss for one batch that
    is already on ``device`` (the mean is what makes micro-batch weighting exact)."""
    device: str = "cpu"
    """Where the model trains: 'cpu', 'cuda', 'cuda:1'."""
    accumulation_steps: int = 1
    """Micro-batches per optimizer step in the user's loop: the effective batch is
    ``loader.batch_size × accumulation_steps`` and is kept exactly."""
    run_steps: int | None = None
    """Optimizer steps of the planned job: amortizes compile time and projects job time, cost
    and energy. None = 10,000 (said in the report)."""
    memory_limit_bytes: int | None = None
    """Device memory the batch finder may use. On CPU it is enforced by a simulated budget
    (:class:`redline.tune.MemoryBudget`); None on CPU = no memory limit (the micro-batch is
    then bounded only by the effective batch); None on CUDA = the device's free memory."""
    cache_split: CacheSplit | None = None
    """Which part of the dataset's per-sample work is deterministic (decode, resize) and which
    is random (:class:`redline.data.CacheSplit`): the path then tries serving the loader from
    a cache of the deterministic part (filled once, the fill counted against the planned
    run). None: the decode cache is not tried (it is not tried either for a dataset that is
    already a ``CachedDataset``)."""
    jpeg_split: JpegSplit | None = None
    """How the dataset's samples are made from JPEGs (:class:`redline.data.JpegSplit`: the
    encoded images and labels, the random resized crop, flip and normalization): on CUDA the
    path then tries decoding and augmenting on the device (nvJPEG), checked against the CPU
    path's pixels and kept only when faster end to end. None: not tried."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, torch.nn.Module):
            raise SetupError(f"TrainSetup.model must be a torch.nn.Module, got "
                             f"{type(self.model).__name__}")
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise SetupError(f"TrainSetup.optimizer must be a torch.optim.Optimizer, got "
                             f"{type(self.optimizer).__name__}")
        if not isinstance(self.loader, DataLoader):
            raise SetupError(f"TrainSetup.loader must be a torch DataLoader, got "
                             f"{type(self.loader).__name__}")
        if self.loader.batch_size is None:
            raise SetupError("TrainSetup.loader has batch_size=None (a custom batch sampler): "
                             "redline needs a DataLoader built with batch_size=N to change the "
                             "micro-batch")
        if not callable(self.loss_fn):
            raise SetupError("TrainSetup.loss_fn must be callable as loss_fn(model, batch)")
        if self.accumulation_steps < 1:
            raise SetupError(f"accumulation_steps must be >= 1, got {self.accumulation_steps}")
        if self.run_steps is not None and self.run_steps < 1:
            raise SetupError(f"run_steps must be >= 1 or None, got {self.run_steps}")
        if self.memory_limit_bytes is not None and self.memory_limit_bytes <= 0:
            raise SetupError(f"memory_limit_bytes must be > 0 or None, got "
                             f"{self.memory_limit_bytes}")
        torch.device(self.device)  # raises on a malformed device string
        if self.cache_split is not None and not isinstance(self.cache_split, CacheSplit):
            raise SetupError(f"TrainSetup.cache_split must be a redline.data.CacheSplit, got "
                             f"{type(self.cache_split).__name__}")
        if self.jpeg_split is not None and not isinstance(self.jpeg_split, JpegSplit):
            raise SetupError(f"TrainSetup.jpeg_split must be a redline.data.JpegSplit, got "
                             f"{type(self.jpeg_split).__name__}")

    @property
    def micro_batch(self) -> int:
        assert self.loader.batch_size is not None
        return int(self.loader.batch_size)

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.accumulation_steps


Factory = Callable[[], TrainSetup]


def check_tunable_loader(loader: DataLoader[Any]) -> None:
    """Refuse, before any trial, a loader redline tune cannot rebuild at other batch sizes and
    settings: one over an IterableDataset, or with a sampler other than shuffle=True/False or
    a DistributedSampler."""
    from torch.utils.data import IterableDataset, RandomSampler, SequentialSampler
    from torch.utils.data.distributed import DistributedSampler

    if isinstance(loader.dataset, IterableDataset):
        raise SetupError(
            f"TrainSetup.loader reads an IterableDataset ({type(loader.dataset).__name__}): "
            "redline tune rebuilds the loader at other batch sizes and reads samples by index, "
            "which needs a map-style dataset (__len__ and __getitem__). Give the factory one, "
            "or measure this loop as it is with redline doctor")
    if not isinstance(loader.sampler, (RandomSampler, SequentialSampler, DistributedSampler)):
        raise SetupError(
            f"TrainSetup.loader uses a {type(loader.sampler).__name__}: redline tune rebuilds "
            "the loader at other batch sizes with shuffle=True/False or a DistributedSampler "
            "only. Build the factory's loader with one of them, or measure this loop as it is "
            "with redline doctor")


def _frames(e: BaseException) -> list[Any]:
    out = []
    trace = e.__traceback__
    while trace is not None:
        out.append(trace.tb_frame)
        trace = trace.tb_next
    return out


def dataset_failure(e: BaseException) -> SetupError | None:
    """Where ``e`` was raised reading a sample of a torch Dataset (in this process, or in a
    DataLoader worker, which re-raises it here), the error saying which sample and what it
    raised; None for any other error (and for redline's own)."""
    if isinstance(e, RedlineError) or not isinstance(e, Exception):
        return None
    from torch.utils.data import Dataset

    reads = [frame for frame in _frames(e) if frame.f_code.co_name == "__getitem__"
             and isinstance(frame.f_locals.get("self"), Dataset)]
    what = f"{type(e).__name__}: {e}"
    if reads:
        frame = reads[-1]  # the innermost: the user's dataset under wrappers (Subset, a cache)
        names = frame.f_code.co_varnames
        index = frame.f_locals.get(names[1]) if frame.f_code.co_argcount > 1 else None
        where = f"{type(frame.f_locals['self']).__name__}[{index!r}]"
        line = f" ({frame.f_code.co_filename}:{frame.f_lineno})"
    else:
        text = e.args[0] if e.args and isinstance(e.args[0], str) else str(e)
        if not text.startswith("Caught ") or "DataLoader worker" not in text:
            return None
        # torch re-raises a worker's error with its traceback as text: the index is not in it
        lines = [text_line for text_line in text.splitlines() if text_line.strip()]
        file_lines = [text_line.strip() for text_line in lines
                      if text_line.strip().startswith("File ")]
        where = "a sample (read in a DataLoader worker, which does not say its index)"
        line = f" ({file_lines[-1]})" if file_lines else ""
        what = lines[-1].strip() if lines else what
    return SetupError(
        f"reading {where} raised {what}{line}. redline reads the samples the way your loop "
        "does; fix the dataset (run the script alone to see the full traceback), or leave "
        "the failing samples out of the dataset the factory returns")


def call_factory(factory: Factory, what: str = "the factory") -> TrainSetup:
    """Call ``factory`` and check what it returned; any error becomes a :class:`SetupError`
    that names the factory and the original error."""
    try:
        setup = factory()
    except SetupError:
        raise
    except Exception as e:
        raise SetupError(f"{what} raised {type(e).__name__}: {e}. redline calls it with no "
                         "arguments once per trial; fix the error (run the script alone to "
                         "see the full traceback)") from e
    if not isinstance(setup, TrainSetup):
        raise SetupError(f"{what} returned {type(setup).__name__}, expected "
                         "redline.tune.TrainSetup(model=..., optimizer=..., loader=..., "
                         "loss_fn=...)")
    return setup


SAFE_CALLS = frozenset({
    "torch.device", "torch.manual_seed", "torch.set_float32_matmul_precision",
    "torch.cuda.is_available", "torch.backends.mps.is_available", "random.seed",
    "np.random.seed", "numpy.random.seed", "logging.getLogger", "getLogger", "TypeVar",
    "typing.TypeVar", "NewType", "typing.NewType", "namedtuple", "collections.namedtuple",
    "field", "dataclasses.field", "partial", "functools.partial", "Path", "pathlib.Path",
    "os.getenv", "os.environ.get", "os.environ.setdefault", "os.path.join", "os.path.dirname",
    "os.path.abspath", "os.path.expanduser", "sys.path.insert", "sys.path.append",
    "warnings.filterwarnings", "warnings.simplefilter", "int", "float", "str", "bool", "len",
    "range", "tuple", "list", "dict", "set", "frozenset", "object", "getattr", "isinstance",
})
"""Calls a script may make outside any function: they set things up (a device, a seed, a
logger, a path) and neither train nor write. Any other call there is taken as work."""

_PATH_METHODS = frozenset({"resolve", "absolute", "expanduser", "joinpath", "with_name",
                           "with_suffix"})


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _calls_only_safe(node: ast.AST) -> bool:
    """Whether every call ``node`` makes when evaluated is in :data:`SAFE_CALLS` (a lambda's
    body runs later, when called: not looked into)."""
    if isinstance(node, ast.Lambda):
        return True
    if isinstance(node, ast.Call):
        func = node.func
        safe = (_dotted(func) in SAFE_CALLS if not isinstance(func, ast.Attribute)
              or not isinstance(func.value, ast.Call) else func.attr in _PATH_METHODS)
        if not safe:
            return False
    return all(_calls_only_safe(child) for child in ast.iter_child_nodes(node))


def _main_guard(node: ast.If) -> bool:
    test = node.test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = {ast.unparse(test.left), ast.unparse(test.comparators[0])}
    return sides in ({"__name__", "'__main__'"}, {"__name__", '"__main__"'})


def _at_import_is_setup(node: ast.stmt) -> bool:
    """Whether a top-level statement only defines or sets up (runs no training, no I/O)."""
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.Pass, ast.Global, ast.Nonlocal)):
        return True
    if isinstance(node, ast.ClassDef):
        # its decorators, bases and body run at import (its methods' bodies do not)
        return (all(_calls_only_safe(expr) for expr in (*node.decorator_list, *node.bases,
                                                  *(keyword.value for keyword in node.keywords)))
                and all(_at_import_is_setup(stmt) for stmt in node.body))
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        # decorators and defaults run at import; the body does not
        return all(_calls_only_safe(expr) for expr in (*node.decorator_list, *node.args.defaults,
                                                 *node.args.kw_defaults) if expr is not None)
    if isinstance(node, ast.If):
        return _main_guard(node) or (_calls_only_safe(node.test) and all(
            _at_import_is_setup(stmt) for stmt in (*node.body, *node.orelse)))
    if isinstance(node, ast.Try):
        return all(_at_import_is_setup(stmt) for stmt in (
            *node.body, *node.orelse, *node.finalbody, *(stmt for handler in node.handlers
                                                         for stmt in handler.body)))
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.Assert,
                         ast.Delete)):
        return _calls_only_safe(node)
    return False  # a loop, a with block, a match, a raise...


def unguarded_line(source: str, filename: str = "<script>") -> tuple[int, str] | None:
    """The first top-level statement of ``source`` that would do work when the script is
    imported — anything but imports, definitions, assignments and calls of
    :data:`SAFE_CALLS`, docstrings and ``if __name__ == "__main__":`` — as (line, its first
    line of text); None when the script only defines and sets up.

    Raises:
        SyntaxError: ``source`` is not valid Python.
    """
    tree = ast.parse(source, filename)
    lines = source.splitlines()
    for node in tree.body:
        if not _at_import_is_setup(node):
            line = min([node.lineno, *(decorator.lineno
                                       for decorator in getattr(node, "decorator_list", []))])
            return line, lines[line - 1].strip()
    return None


def check_script_guard(script: str) -> None:
    """Refuse, before any of it runs, a script whose import would run work (training,
    writing files): redline imports it to call its factory."""
    try:
        with open(script, encoding="utf-8") as file:
            source = file.read()
        found = unguarded_line(source, script)
    except (OSError, UnicodeDecodeError) as e:
        raise SetupError(f"cannot read {script}: {e}") from None
    except SyntaxError as e:
        raise SetupError(f"{script} is not valid Python: line {e.lineno}: {e.msg}") from None
    if found is not None:
        line, text = found
        raise SetupError(
            f"{script}:{line} runs when the script is imported: `{text}` is outside any "
            "function and outside `if __name__ == \"__main__\":`. redline imports the script "
            "to call its factory, so this line would run (training, overwriting your files) "
            "before anything is measured; nothing was run. Put the training under "
            "`if __name__ == \"__main__\":` (and build what the factory needs inside the "
            "factory), then run the command again.")


def load_factory(script: str, name: str = "redline_setup") -> Factory:
    """The factory function ``name`` of the script at ``script`` (run as a module whose
    ``__name__`` is ``"__redline_tune__"``: its ``__main__`` block does not run).

    Args:
        script: path of the Python file that defines the factory.
        name: the factory function's name (default ``redline_setup``).

    Returns:
        The factory: called with no argument, it returns a :class:`TrainSetup`.

    Raises:
        SetupError: no such script, a script that would run work when imported (checked
            before it is: :func:`unguarded_line`), an import that fails, or no factory.
    """
    if not os.path.isfile(script):
        raise SetupError(f"no such script: {script!r} (expected a Python file that defines "
                         f"{name}() returning a redline.tune.TrainSetup)")
    check_script_guard(script)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        namespace = runpy.run_path(script, run_name="__redline_tune__")
    except SystemExit as e:
        raise SetupError(f"{script} called sys.exit({e.code}) while being imported; move the "
                         "training code under `if __name__ == \"__main__\":`") from None
    except Exception as e:
        raise SetupError(f"importing {script} raised {type(e).__name__}: {e}") from e
    finally:
        sys.path.pop(0)
    factory = namespace.get(name)
    if factory is None or not callable(factory):
        found = sorted(key for key, value in namespace.items() if callable(value) and not key.startswith("_")
                       and getattr(value, "__module__", None) == "__redline_tune__")
        raise SetupError(f"{script} defines no function {name}(); expected one that returns "
                         f"redline.tune.TrainSetup (functions found: {', '.join(found) or 'none'}"
                         "; pick one with `name`)")
    return factory  # type: ignore[no-any-return]
