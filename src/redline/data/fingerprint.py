"""Fingerprints of a cached transform: everything its output depends on, stable across runs,
processes and ranks.

A :class:`~redline.data.CachedDataset` keys its samples by this fingerprint, so a changed
pipeline reads different keys and never a stale sample. What the transform's output depends
on beyond its own bytecode is followed: the module-level constants and helper functions it
reads, its closure variables, default arguments, the attributes of callable objects and
``functools.partial`` arguments. Library code (the standard library, installed packages) is
named with its package version instead of read. Nothing in a fingerprint depends on memory
addresses or on the order objects were created in, so the same code gives the same fingerprint
in every run and every process.

What cannot be seen (an open file, a socket, an object without attributes to read) is listed,
so the cache can say once that the user should pass ``fingerprint=``.
"""

from __future__ import annotations

import builtins
import enum
import functools
import hashlib
import inspect
import os
import site
import sys
import sysconfig
import types
from functools import lru_cache
from typing import Any

MAX_DEPTH = 8
"""How deep references are followed (transform → helper → its constants → …)."""

MAX_ITEMS = 1_000_000
"""Container items hashed one by one; a larger container is described by size and a sample,
and named among what the fingerprint cannot fully see."""


@lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    roots = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib",
                                                       "platlib")}
    roots |= set(getattr(site, "getsitepackages", list)())
    roots.add(getattr(site, "getusersitepackages", str)())
    redline_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return tuple(sorted(os.path.abspath(r) + os.sep for r in roots
                        if r and not redline_dir.startswith(os.path.abspath(r))))


def _is_library(code_file: str) -> bool:
    """Installed or standard-library code: named with its version, not read line by line."""
    if code_file.startswith("<"):
        return False  # code made at run time (exec, a notebook cell): the user's
    path = os.path.abspath(code_file)
    return any(path.startswith(root) for root in _library_roots())


def _version(module_name: str | None) -> str:
    top = (module_name or "").partition(".")[0]
    mod = sys.modules.get(top)
    return str(getattr(mod, "__version__", "")) if mod is not None else ""


class _Hasher:
    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.unseen: list[str] = []
        self._active: set[int] = set()

    def put(self, *parts: object) -> None:
        for p in parts:
            self.h.update(str(p).encode())
            self.h.update(b"\x00")

    # -- values --------------------------------------------------------------------------------
    def value(self, v: Any, where: str, depth: int = 0) -> None:
        if v is None or isinstance(v, bool | int | float | complex | str | bytes):
            self.put(type(v).__name__, repr(v))
            return
        if depth > MAX_DEPTH:
            self.put("deep", type(v).__qualname__)
            return
        if id(v) in self._active:  # a reference back into what is being hashed
            self.put("cycle", type(v).__qualname__)
            return
        self._active.add(id(v))
        try:
            self._value(v, where, depth + 1)
        finally:
            self._active.discard(id(v))

    def _value(self, v: Any, where: str, depth: int) -> None:
        if isinstance(v, enum.Enum):
            self.put("enum", type(v).__qualname__, v.name)
        elif isinstance(v, list | tuple | set | frozenset):
            self._container(v, where, depth)
        elif isinstance(v, dict):
            self.put("dict", len(v))
            for k in sorted(v, key=repr)[:MAX_ITEMS]:
                self.value(k, where, depth)
                self.value(v[k], f"{where}[{k!r}]", depth)
            if len(v) > MAX_ITEMS:
                self.unseen.append(f"{where} (a dict of {len(v):,} items, hashed in part)")
        elif isinstance(v, os.PathLike):
            self.put("path", os.fspath(v))
        elif hasattr(v, "shape") and hasattr(v, "dtype") and hasattr(v, "tolist"):
            self._array(v)
        elif isinstance(v, types.ModuleType):
            self.put("module", v.__name__, _version(v.__name__))
        elif isinstance(v, functools.partial):
            self.put("partial")
            self.value(v.func, f"{where}.func", depth)
            self.value(v.args, f"{where}.args", depth)
            self.value(v.keywords, f"{where}.keywords", depth)
        elif isinstance(v, types.MethodType):
            self.value(v.__func__, where, depth)
            self.value(v.__self__, f"{where}.__self__", depth)
        elif isinstance(v, types.FunctionType):
            self.function(v, where, depth)
        elif isinstance(v, types.BuiltinFunctionType | types.BuiltinMethodType):
            mod = getattr(v, "__module__", None)
            self.put("builtin", mod, getattr(v, "__qualname__", repr(v)), _version(mod))
        elif isinstance(v, type):
            self._class(v, where, depth)
        else:
            self._object(v, where, depth)

    def _container(self, v: Any, where: str, depth: int) -> None:
        items = list(v)
        if isinstance(v, set | frozenset):
            items.sort(key=repr)
        self.put(type(v).__name__, len(items))
        for i, x in enumerate(items[:MAX_ITEMS]):
            self.value(x, f"{where}[{i}]", depth)
        if len(items) > MAX_ITEMS:
            self.unseen.append(f"{where} (a {type(v).__name__} of {len(items):,} items, hashed "
                               "in part)")

    def _array(self, v: Any) -> None:
        """numpy arrays and tensors: shape, dtype and every byte (hashed once, at start-up)."""
        self.put(type(v).__qualname__, tuple(v.shape), v.dtype)
        try:
            data = v.detach().cpu().contiguous().numpy() if hasattr(v, "detach") else v
            self.h.update(memoryview(data.tobytes()))
        except (TypeError, ValueError, RuntimeError, AttributeError):
            self.put(repr(v.tolist()))

    def _class(self, cls: type, where: str, depth: int) -> bool:
        """Hash a class: the user's by its methods' code (True), a library's by its name and
        version (False)."""
        self.put("class", cls.__module__, cls.__qualname__)
        mod = sys.modules.get(cls.__module__)
        src = getattr(mod, "__file__", None) if mod is not None else None
        if src is None:  # a class made at run time: where its methods were written
            src = next((a.__code__.co_filename for a in vars(cls).values()
                        if isinstance(a, types.FunctionType)), None)
        if src is None or _is_library(src):
            self.put(_version(cls.__module__))
            return False
        for name, attr in sorted(vars(cls).items()):  # the user's class: its methods' code
            fn: Any = attr
            if isinstance(attr, staticmethod | classmethod):
                fn = attr.__func__
            elif isinstance(attr, property):
                fn = attr.fget
            if isinstance(fn, types.FunctionType):
                self.function(fn, f"{where}.{name}", depth)
        return True

    def _object(self, v: Any, where: str, depth: int) -> None:
        cls = type(v)
        users = self._class(cls, where, depth)
        try:
            attrs = dict(vars(v))
        except TypeError:
            slots = [s for c in cls.__mro__ for s in getattr(c, "__slots__", ())]
            attrs = {s: getattr(v, s) for s in slots if hasattr(v, s)}
        if not attrs:
            r = _plain_repr(v)
            if not users and not (r and isinstance(v, _DESCRIBED_BY_REPR)):
                self.unseen.append(f"{where} (a {cls.__qualname__}, whose state cannot be "
                                   "read)")
            self.put(r)
            return
        for k in sorted(attrs):
            self.value(attrs[k], f"{where}.{k}", depth)

    # -- code ----------------------------------------------------------------------------------
    def function(self, fn: types.FunctionType, where: str, depth: int) -> None:
        code = fn.__code__
        self.put("function", fn.__module__, fn.__qualname__)
        if _is_library(code.co_filename):
            self.put(_version(fn.__module__))
            return
        names = self.code(code)
        self.value(fn.__defaults__, f"{where} (defaults)", depth)
        self.value(fn.__kwdefaults__, f"{where} (keyword defaults)", depth)
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=True):
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell: a name bound later in the enclosing function
                continue
            self.value(content, f"closure variable {name!r} of {fn.__qualname__}", depth)
        g = fn.__globals__
        for name in sorted(names):
            if name in g:
                self.put("global", name)
                self.value(g[name], f"global {name!r} of {fn.__qualname__}", depth)
            elif not hasattr(builtins, name):
                self.put("unbound", name)

    def code(self, code: types.CodeType) -> set[str]:
        """Hash the bytecode and constants (nested code objects by content, never by their
        repr, which holds an address); return the global names it reads."""
        self.put("code", code.co_code.hex(), code.co_names, code.co_varnames)
        names = set(code.co_names)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                names |= self.code(c)
            else:
                self.put(type(c).__name__, repr(c))
        return names


def _described_by_repr() -> tuple[type, ...]:
    import re

    import torch

    return (range, slice, re.Pattern, torch.dtype, torch.device, torch.Size, torch.layout,
            torch.memory_format)


_DESCRIBED_BY_REPR = _described_by_repr()
"""Types without readable attributes whose repr says everything their behaviour depends on."""


def _plain_repr(v: Any) -> str:
    """repr() unless it is object's default (which holds an address): then ''."""
    r = repr(v)
    return "" if " at 0x" in r or " object at " in r else r


def transform_fingerprint(fn: Any) -> tuple[str, list[str]]:
    """(16 hex digits, what it could not see) of a transform (any callable)."""
    hasher = _Hasher()
    if not callable(fn):
        raise TypeError(f"the deterministic transform must be callable, got "
                        f"{type(fn).__qualname__}")
    if inspect.isfunction(fn) or inspect.ismethod(fn) or isinstance(fn, functools.partial):
        hasher.value(fn, getattr(fn, "__qualname__", "the transform"))
    else:  # a callable object: its class's code and its attributes
        hasher.value(fn, type(fn).__qualname__)
    return hasher.h.hexdigest()[:16], hasher.unseen
