"""Patching helpers shared by the hooks: every patch is undone by the watch's ``ExitStack``,
and no hook does anything while torch.compile traces."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
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


def patch(stack: ExitStack, owner: Any, name: str, new: Any) -> None:
    """Set ``owner.name = new`` and restore the previous state on exit."""
    had = name in vars(owner)
    old = vars(owner).get(name)
    setattr(owner, name, new)

    def restore() -> None:
        if had:
            setattr(owner, name, old)
        else:
            delattr(owner, name)

    stack.callback(restore)
