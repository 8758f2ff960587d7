"""The instrumentation a watch installs on entry and removes on exit.

Every hook and patch is registered on an ``ExitStack`` so that nothing survives the watch
(no global state across calls). Costs are kept to a few microseconds per step: per-module
global hooks are used only during warm-up to discover the outermost ("root") modules, then
replaced by hooks on those roots alone, because global module hooks force every submodule call
of the model through ``Module._call_impl``'s slow path.
"""

from __future__ import annotations

import copy
import gc
import operator
import sys
import threading
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.modules.module as nn_module
import torch.optim.optimizer as optim_module

from redline.measure.comm_hooks import install_collectives
from redline.measure.data_hooks import DataHooks, H2DStats
from redline.measure.loader import LoaderInfo
from redline.measure.patching import COMPILE_HOOK_WARNING, compiling, patch
from redline.measure.step_record import BACKWARD, EVALUATION, FORWARD, OPTIMIZER
from redline.measure.timeline import StepTracker

T = TypeVar("T")

_EVAL_GRAD = -2
"""Kind of an outermost forward in eval mode with gradients enabled: timed as evaluation until
a backward follows it in the same step (then it was training; timeline.StepTracker)."""
_EVAL_TRAIN_MODE = -3
"""An outermost forward of evaluation under no_grad of a module left in training mode (an RL
policy choosing actions, a teacher or EMA net that is not frozen): timed as evaluation, but
never bridged to the next one (:meth:`StepTracker.bridge_evaluation`), and it ends a bridge."""


def _frozen(module: torch.nn.Module) -> bool:
    """A module with parameters none of which requires a gradient (a frozen encoder, a
    teacher): its forwards are part of training however they run, never an evaluation. Read
    once, when the module is first seen as an outermost one."""
    params = list(module.parameters())
    return bool(params) and not any(param.requires_grad for param in params)


@dataclass(slots=True, kw_only=True)
class PrecisionSeen:
    """What the outermost forwards ran under (how many there were: the tracker's
    ``counts["forward"]``)."""

    autocast: Counter[str] | None = None
    param_dtypes: Counter[str] | None = None


class _TimedForward:
    """A root module's forward, timed. It never leaks into what the user keeps: a pickled
    module (``torch.save(model)``) stores the plain forward, and ``copy.deepcopy(model)`` (an
    EMA copy) gets its own plain forward, bound to the copy."""

    __slots__ = ("_enter", "_exit", "_frozen", "_module", "_tid", "orig")

    def __init__(self, orig: Callable[..., Any], enter: Callable[[torch.nn.Module, bool], None],
                 exit_: Callable[[], None], tid: int, module: torch.nn.Module,
                 frozen: bool) -> None:
        self.orig, self._enter, self._exit, self._tid = orig, enter, exit_, tid
        self._module, self._frozen = module, frozen

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if compiling() or threading.get_ident() != self._tid:
            return self.orig(*args, **kwargs)
        self._enter(self._module, self._frozen)
        try:
            return self.orig(*args, **kwargs)
        finally:
            self._exit()

    def __reduce__(self) -> tuple[Any, ...]:
        return (operator.itemgetter(0), ((self.orig,),))

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return copy.deepcopy(self.orig, memo)


def _optimized_module_type() -> type | None:
    """torch.compile's module wrapper class, None while Dynamo is not imported (then no module
    can be compiled yet, and importing it here would cost a second)."""
    mod = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(mod, "OptimizedModule", None) if mod is not None else None


def _always() -> bool:
    return True


def _short_dtype(dt: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
            torch.float64: "fp64"}.get(dt, str(dt).replace("torch.", ""))


class Instrumentation:
    """Hooks feeding a :class:`StepTracker`.

    Args:
        tracker: receives phases and boundaries.
        device_type: 'cuda', 'cpu', ... (autocast queries and whether H2D copies exist).
        on_work: called when device work of a step may begin (root forward, H2D copy).
        on_data: called when the host starts waiting for a batch (device work pauses).
    """

    def __init__(self, tracker: StepTracker, device_type: str,
                 on_work: Callable[[], None] | None = None, keep_loaders: bool = False,
                 on_data: Callable[[], None] | None = None) -> None:
        self.tracker = tracker
        self.device_type = device_type
        self._on_work = on_work
        self._on_data = on_data
        self.after_backward: Callable[[], None] | None = None
        """Called on the training thread when an outermost backward returns (the FLOP count
        ends its slice there, see :class:`redline.measure.flops.FlopWindow`); None = nothing."""
        self._tid = threading.get_ident()
        self._clock = time.perf_counter
        self._depth = 0
        """Outermost forwards in flight. Every enter has its exit (a try/finally around the
        patched forward, hooks with ``always_call``; switch_to_roots starts again at 0), so
        nothing resets it at step ends: a step can end inside a forward (a module whose
        forward steps an optimizer)."""
        self._roots: weakref.WeakKeyDictionary[torch.nn.Module, bool] = (
            weakref.WeakKeyDictionary()
        )
        """The outermost modules seen, each with whether it is frozen (:func:`_frozen`)."""
        self._root_kind = FORWARD
        """FORWARD, EVALUATION, _EVAL_GRAD or _EVAL_TRAIN_MODE: how the outermost forward in
        flight is timed."""
        self._eval_grad_pending = False
        """A forward in eval mode with gradients was timed as evaluation since the last
        training forward or backward (the next backward makes it training)."""
        self._global_handles: list[Any] = []
        self._compiled_seen = False
        """A torch.compile'd module ran during discovery: the global hooks stay (see
        switch_to_roots)."""
        self._scanned_for_compiled = False
        self._stack: ExitStack | None = None
        self._gc_scanned = False
        self.precision = PrecisionSeen(autocast=Counter(), param_dtypes=Counter())
        self.data = DataHooks(tracker, self._tid, on_work, on_data, keep_loaders)
        self._backward_depth = 0
        self._other_thread_events: Counter[str] = Counter()
        """Optimizer steps and backward passes seen on threads other than the one that entered
        the watch: not measured, said in the report."""
        self.other_threads: set[str] = set()
        self._enter_root, self._exit_root = self._lean_root_timing()

    # -- install ---------------------------------------------------------------------------
    def install(self, stack: ExitStack) -> None:
        self._stack = stack
        self.data.install(stack)
        self._install_modules_global(stack)
        self._install_autograd(stack)
        self._install_optim(stack)
        install_collectives(stack, self.tracker, self._tid)
        if self.device_type != "cpu":
            self.data.install_h2d(stack)

    @property
    def loaders(self) -> list[LoaderInfo]:
        """Every DataLoader the loop iterated, in order of first use."""
        return self.data.loaders

    @property
    def h2d(self) -> H2DStats:
        return self.data.h2d

    @property
    def wrapped_iterables(self) -> int:
        return self.data.wrapped_iterables

    def wrap(self, iterable: Iterable[T]) -> Iterator[T]:
        """Time ``next()`` on any iterable as data wait (for loops without a DataLoader)."""
        return self.data.wrap(iterable)

    # -- modules ---------------------------------------------------------------------------
    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        """Global pre-hook, warm-up only: learns the outermost modules while timing them."""
        if compiling() or threading.get_ident() != self._tid:
            return
        if not self._compiled_seen:
            compiled = _optimized_module_type()
            self._compiled_seen = compiled is not None and isinstance(module, compiled)
        frozen = False
        if self._depth == 0:
            seen = self._roots.get(module)
            if seen is None:
                frozen = self._roots[module] = _frozen(module)
                param = next(module.parameters(), None)
                if param is not None:
                    assert self.precision.param_dtypes is not None
                    self.precision.param_dtypes[_short_dtype(param.dtype)] += 1
            else:
                frozen = seen
        self._enter_root(module, frozen)

    def _post(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if not compiling() and threading.get_ident() == self._tid:
            self._exit_root()

    def _install_modules_global(self, stack: ExitStack) -> None:
        self._global_handles = [
            nn_module.register_module_forward_pre_hook(self._pre),
            nn_module.register_module_forward_hook(self._post, always_call=True),
        ]
        stack.callback(self._remove_global)
        # torch warns, at each call of a compiled module, that global hooks fire again inside
        # it; ours do nothing while Dynamo traces (compiling), so the warning would only
        # alarm the user about redline. One filter for that message, removed on exit (not
        # catch_warnings, which would also drop filters the user adds meanwhile).
        warnings.filterwarnings("ignore", message=COMPILE_HOOK_WARNING, category=UserWarning)
        entry = warnings.filters[0]

        def drop_filter() -> None:
            filters: list[Any] = warnings.filters  # type: ignore[assignment]  # a list at runtime
            if entry in filters:
                filters.remove(entry)

        stack.callback(drop_filter)

    def _remove_global(self) -> None:
        for handle in self._global_handles:
            handle.remove()
        self._global_handles = []

    @property
    def discovering(self) -> bool:
        """True while global module hooks are still looking for the root modules."""
        return bool(self._global_handles) and not self._compiled_seen

    def switch_to_roots(self) -> None:
        """Replace the global module hooks by a timing wrapper on each root module's
        ``forward`` (no-op until a root module has been seen).

        A wrapper on the instance's ``forward`` keeps ``Module.__call__`` on its fast path (any
        hook sends it down the slow one, ~3 µs more per call here); it is removed on exit.
        Modules whose ``forward`` cannot be replaced (TorchScript) get forward hooks instead.

        Where a torch.compile'd module ran, the global hooks stay for the whole watch: Dynamo
        guards on the global hook dicts and on the module's ``forward``, so changing either
        recompiles the model once more (a second full compile time). Inside compiled code the
        hooks are traced away (they return early while Dynamo traces), so they cost only on
        the eager modules left.
        """
        if not self._global_handles or self._stack is None or self._compiled_seen:
            return
        if not len(self._roots):
            # A whole step ran and no module forward was seen outside compiled code: a model
            # compiled in place (``model.compile()``) runs its hooks inside Dynamo's frames,
            # where they step aside. Time those modules from outside instead (one scan; a loop
            # with no module at all keeps the global hooks, as before).
            if not self._scanned_for_compiled:
                self._time_compiled_in_place()
            return
        self._remove_global()
        self._depth = 0
        enter_root, exit_root = self._enter_root, self._exit_root
        tid, get_ident = self._tid, threading.get_ident
        for root, frozen in list(self._roots.items()):
            # A module with hooks of its own runs them outside ``forward`` (FSDP's root waits
            # for its parameters' all-gather in a pre-forward hook): time around its hooks,
            # first in and last out, instead of patching ``forward``.
            if not (root._forward_pre_hooks or root._forward_hooks):
                try:
                    patch(self._stack, root, "forward",
                          _TimedForward(root.forward, enter_root, exit_root, tid, root, frozen),
                          raw=True)
                    continue
                except (AttributeError, TypeError, RuntimeError):  # TorchScript and the like
                    pass
            self._stack.callback(root.register_forward_pre_hook(
                lambda _m, _a, fz=frozen: (enter_root(_m, fz) if get_ident() == tid
                                           and not compiling() else None),
                prepend=True).remove)
            self._stack.callback(root.register_forward_hook(
                lambda _m, _a, _o: exit_root() if get_ident() == tid and not compiling() else None,
                always_call=True).remove)

    def _time_compiled_in_place(self) -> None:
        """Find modules compiled in place (``Module.compile()`` sets ``_compiled_call_impl``,
        which ``Module.__call__`` calls instead of the hooks' path) and wrap that callable on
        the outermost ones, outside the compiled code. Once, by a scan of live objects (as for
        optimizers built before the watch); the global hooks stay, or Dynamo recompiles."""
        self._scanned_for_compiled = True
        assert self._stack is not None
        found: list[torch.nn.Module] = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for obj in gc.get_objects():
                if issubclass(type(obj), torch.nn.Module) and \
                        vars(obj).get("_compiled_call_impl") is not None:
                    found.append(obj)
        inner = {id(sub) for module in found for sub in module.modules() if sub is not module}
        for module in found:
            if id(module) in inner:
                continue
            orig = vars(module)["_compiled_call_impl"]
            frozen = _frozen(module)
            patch(self._stack, module, "_compiled_call_impl",
                  _TimedForward(orig, self._enter_root, self._exit_root, self._tid, module, frozen),
                  raw=True)
            self._roots[module] = frozen
            self._compiled_seen = True
            param = next(module.parameters(), None)
            if param is not None:
                assert self.precision.param_dtypes is not None
                self.precision.param_dtypes[_short_dtype(param.dtype)] += 1

    def _lean_root_timing(
        self,
    ) -> tuple[Callable[[torch.nn.Module, bool], None], Callable[[], None]]:
        """Enter/exit of an outermost forward for the steady state, lookups bound once (they
        run on every outermost forward, and each µs here is a µs per step).

        An outermost forward of a module that is not frozen is evaluation when gradients are
        disabled (``torch.no_grad``/``inference_mode``) or the module is in eval mode; one in
        eval mode with gradients becomes training again if a backward follows it in the same
        step (docs/report.md, "Definitions"). The test is one C call and one attribute read
        per outermost forward."""
        clock = self._clock
        tracker, counts = self.tracker, self.tracker.counts
        autocast_on, dev, on_work = torch.is_autocast_enabled, self.device_type, self._on_work
        push, exit_ = tracker.push, tracker.exit
        fetch_used, evaluation_began = tracker.fetch_used, tracker.evaluation_forward_began
        bridge, evaluation_ended = tracker.bridge_evaluation, tracker.evaluation_forward_ended
        end_bridge, frozen_began = tracker.end_evaluation_bridge, tracker.frozen_forward_began
        grad_on = torch.is_grad_enabled
        # One C call with no argument to parse: where no autocast is on for any device (an
        # fp32 loop), the per-device query (a device string parsed at each call) is skipped.
        # Private in torch (2.1+), so only where it exists, and only for the devices it reads
        # (it answers False for an autocast on MPS).
        any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)
        if any_autocast is None or dev not in ("cpu", "cuda"):
            any_autocast = _always
        autocast = self.precision.autocast
        assert autocast is not None

        def enter_root(module: torch.nn.Module, frozen: bool) -> None:
            self._depth += 1
            if self._depth == 1:
                if frozen or (module.training and grad_on()):
                    self._root_kind = FORWARD
                    if self._eval_grad_pending:
                        self._eval_grad_pending = False
                        tracker.training_forward_began()
                    if frozen:
                        frozen_began()
                    else:
                        fetch_used()
                    push([FORWARD, clock(), 0.0])
                else:
                    counts["evaluation"] += 1
                    evaluation_began()  # the batch fetched last may be evaluation's
                    t = clock()
                    if grad_on():
                        self._root_kind = _EVAL_GRAD
                        end_bridge()  # (training after all if a backward follows)
                    elif module.training:
                        self._root_kind = _EVAL_TRAIN_MODE
                        end_bridge()
                    else:  # a validation pass, a generation: model.eval() under no_grad
                        self._root_kind = EVALUATION
                        bridge(t)  # the time since the last such forward
                    push([EVALUATION, t, 0.0])
                counts["forward"] += 1
                if any_autocast() and autocast_on(dev):
                    autocast[_short_dtype(torch.get_autocast_dtype(dev))] += 1
                if on_work is not None:
                    on_work()

        def exit_root() -> None:
            self._depth -= 1
            if self._depth == 0:
                kind = self._root_kind
                if kind == FORWARD:  # every training step's: one test
                    exit_(kind, clock())
                elif kind == _EVAL_GRAD:
                    tracker.exit_eval_grad(clock())
                    self._eval_grad_pending = True
                elif kind == _EVAL_TRAIN_MODE:
                    exit_(EVALUATION, clock())
                else:
                    t = clock()
                    exit_(kind, t)
                    evaluation_ended(t)

        return enter_root, exit_root

    @property
    def roots(self) -> list[torch.nn.Module]:
        """The loop's outermost modules seen so far."""
        return list(self._roots.keys())

    @property
    def root_modules(self) -> list[str]:
        return [type(root).__name__ for root in self._roots]

    # -- autograd --------------------------------------------------------------------------
    def _install_autograd(self, stack: ExitStack) -> None:
        for name in ("backward", "grad"):
            patch(stack, torch.autograd, name, self._timed_backward(getattr(torch.autograd, name)))

    def _timed_backward(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        tracker, clock, tid, get_ident = self.tracker, self._clock, self._tid, threading.get_ident
        push, exit_, counts, on_work = tracker.push, tracker.exit, tracker.counts, self._on_work

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if get_ident() != tid:
                self._other_thread_step("backward")
                return orig(*args, **kwargs)
            # A backward inside a forward (gradient penalty) or inside another backward is
            # part of that phase, not the end of a step.
            nested = self._depth or self._backward_depth
            self._backward_depth += 1
            if self._eval_grad_pending and not nested:
                self._eval_grad_pending = False
                tracker.backward_began()
            if on_work is not None:  # a batch fetched mid-step closed the segment
                on_work()
            push([BACKWARD, clock(), 0.0])
            try:
                return orig(*args, **kwargs)
            finally:
                now = clock()
                self._backward_depth -= 1
                exit_(BACKWARD, now)
                if not nested:
                    if tracker.optimizers_known:  # the steady state: an optimizer ends steps
                        counts["backward"] += 1
                    else:
                        if tracker.in_phase(OPTIMIZER):
                            # a closure's backward, inside its optimizer's step (LBFGS): an
                            # optimizer ends steps, known without scanning the heap
                            tracker.optimizers_known = True
                        elif not self._gc_scanned:
                            self._scan_for_optimizers()
                        tracker.on_backward_end(now)
                    after = self.after_backward
                    if after is not None:
                        after()

        return wrapper

    def _scan_for_optimizers(self) -> None:
        """Once: were optimizers built before the watch began? Then they delimit steps."""
        self._gc_scanned = True
        # Only an optimizer that holds parameters of the modules being trained counts: a stray
        # optimizer elsewhere in the process must not change how this loop's steps are cut.
        trained = {id(param) for root in self._roots for param in root.parameters()}
        if not trained:
            return
        optimizer_type = torch.optim.Optimizer
        with warnings.catch_warnings():
            # isinstance() on some lazily-deprecated torch objects warns; not the user's concern.
            warnings.simplefilter("ignore")
            for obj in gc.get_objects():
                # type(), not isinstance(): isinstance reads obj.__class__, which raises
                # ReferenceError on a dead weakref.proxy (torch.compile leaves some behind).
                if issubclass(type(obj), optimizer_type) and any(
                    id(param) in trained for group in obj.param_groups for param in group["params"]
                ):
                    self.tracker.optimizers_known = True
                    return

    def _other_thread_step(self, event: str) -> None:
        self._other_thread_events[event] += 1
        self.other_threads.add(threading.current_thread().name)

    @property
    def other_thread_steps(self) -> int:
        """Steps on other threads: their optimizer steps, or their backward passes where they
        step no optimizer (the step definition, applied to what was seen there)."""
        events = self._other_thread_events
        return events["optimizer"] or events["backward"]

    # -- optimizers ------------------------------------------------------------------------
    def _install_optim(self, stack: ExitStack) -> None:
        tracker, clock, tid = self.tracker, self._clock, self._tid

        get_ident, push = threading.get_ident, tracker.push
        done, on_work = tracker.optimizer_done, self._on_work

        def pre(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if get_ident() == tid:
                if on_work is not None:
                    on_work()
                push([OPTIMIZER, clock(), 0.0])

        def post(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if get_ident() == tid:
                done(id(opt), clock())
            else:
                self._other_thread_step("optimizer")

        stack.callback(optim_module.register_optimizer_step_pre_hook(pre).remove)
        stack.callback(optim_module.register_optimizer_step_post_hook(post).remove)

        orig_init = torch.optim.Optimizer.__init__

        def init(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            orig_init(opt, *args, **kwargs)
            tracker.optimizers_known = True

        patch(stack, torch.optim.Optimizer, "__init__", init)
