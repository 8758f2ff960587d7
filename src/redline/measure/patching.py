"""Patching helpers shared by the hooks: every patch is undone by the watch's ``ExitStack``,
and no hook does anything while torch.compile traces."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import torch

# Inside a region torch.compile is tracing, the hooks must do nothing: Dynamo cannot trace
# threading.get_ident or the clock and would break the graph at every submodule (a graph
# break per submodule call, so many small graphs instead of one, and a compiled step slower
# than eager). is_compiling() is a constant while tracing, so the early return costs nothing
# in the compiled code; the compiled module's own call is still timed, from outside.
COMPILE_HOOK_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"
compiling: Callable[[], bool] = getattr(torch.compiler, "is_compiling", None) or (
    torch._dynamo.is_compiling)  # torch < 2.3


@dataclass(slots=True, kw_only=True)
class _Chain:
    """The patches of one attribute, oldest first, and what was there before them."""

    had: bool
    """Whether the owner itself defined the attribute (else it was inherited)."""
    original: Any
    patches: list[Any] = field(default_factory=list)


_CHAINS: dict[tuple[int, str], _Chain] = {}
"""Attributes patched by watches now open; empty whenever no watch is (each entry is removed
with its last patch)."""


def patch(stack: ExitStack, owner: Any, name: str, new: Any, *, raw: bool = False) -> None:
    """Set ``owner.name = new`` until ``stack`` closes (``raw``: through ``object.__setattr__``,
    past a class's own ``__setattr__``, as on a module instance).

    Watches may overlap and close in any order (a script under ``redline doctor`` that opens its
    own ``redline.watch()``): each attribute keeps its patches in a chain, the newest stays
    in place until it is removed, and the original comes back with the last one, so no hook is
    left installed once every watch has closed. A patch removed while a newer one wraps it is
    still called through that one until it closes; it then only times into its finished
    watch.
    """
    put = object.__setattr__ if raw else setattr
    drop = object.__delattr__ if raw else delattr
    key = (id(owner), name)
    had, original = name in vars(owner), vars(owner).get(name)
    put(owner, name, new)  # first: an owner that refuses it raises before anything is kept
    chain = _CHAINS.get(key)
    if chain is None:
        chain = _CHAINS[key] = _Chain(had=had, original=original)
    chain.patches.append(new)

    def remove() -> None:
        chain.patches.remove(new)
        if chain.patches:
            put(owner, name, chain.patches[-1])
            return
        del _CHAINS[key]
        if chain.had:
            put(owner, name, chain.original)
        else:
            drop(owner, name)

    stack.callback(remove)
