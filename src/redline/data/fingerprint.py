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

Modules of the user's imported by name (``mymodule.helper()``) are followed through the
attributes the code names; a user class's attributes (not only its methods) are read. Sets are
hashed by their items' digests, sorted, so no key depends on ``PYTHONHASHSEED``. Arrays and
tensors are hashed through their buffers, a bounded chunk at a time (never a copy of the whole).

Environment variables the code reads by a literal name (``os.environ["X"]``, ``os.getenv("X")``)
are keyed by their value; what cannot be seen (a variable read by a computed name, an open file,
files read through ``open``, the network, an object without attributes to read) is listed, so
the cache can say once that the user should pass ``fingerprint=``.
"""

from __future__ import annotations

import builtins
import collections
import dis
import enum
import functools
import hashlib
import inspect
import os
import site
import sys
import sysconfig
import threading
import types
from functools import lru_cache
from typing import Any

import numpy as np
import torch

MAX_DEPTH = 8
"""How deep references are followed (transform → helper → its constants → …)."""

MAX_ITEMS = 20_000_000
"""Container items hashed; a larger container is hashed in part and named among what the
fingerprint cannot fully see (20 M plain items take about ten seconds)."""

CHUNK_BYTES = 2**20
"""Bytes of an array or tensor copied at a time where its buffer cannot be read in place (not
contiguous, or on a GPU): the fingerprint's memory stays bounded whatever the dataset holds."""

_PLAIN = frozenset({int, float, str, bool, type(None), bytes, complex})
"""Item types whose repr is their whole value, the same in every process."""

_ENV_READS = frozenset({"environ", "getenv", "environb", "getenvb"})
"""Names whose use reads the process environment (``os.environ[...]``, ``os.getenv(...)``)."""

_NETWORK = frozenset({"socket", "urllib", "http", "requests", "httpx", "urllib3", "aiohttp",
                      "ftplib", "boto3", "fsspec"})
"""Modules whose use reads the network: what comes back is not in the key."""


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
        self.env: dict[str, str] = {}
        """Environment variables read by a literal name → where (their values go in the key)."""
        self._active: set[int] = set()
        self._seen_modules: set[tuple[int, frozenset[str]]] = set()

    def put(self, *parts: object) -> None:
        for p in parts:
            self.h.update(str(p).encode("utf-8", "surrogatepass"))
            self.h.update(b"\x00")

    def digest_of(self, v: Any, where: str, depth: int) -> str:
        """The digest of ``v`` alone (for items whose order must not matter: sets)."""
        outer, self.h = self.h, hashlib.sha256()
        try:
            self.value(v, where, depth)
            return self.h.hexdigest()
        finally:
            self.h = outer

    def finish(self) -> str:
        """Key the environment variables read by name by their present values."""
        for name in sorted(self.env):
            self.put("env", name, os.environ.get(name))
            self.unseen.append(f"the environment variable {name!r} read by {self.env[name]} "
                               "(its value when the dataset is built is in the key; one "
                               "changed while the run goes on is not)")
        return self.h.hexdigest()[:16]

    # -- values --------------------------------------------------------------------------------
    def value(self, v: Any, where: str, depth: int = 0) -> None:
        if v is None or isinstance(v, bool | int | float | complex):
            self.put(type(v).__name__, repr(v))
            return
        if isinstance(v, str | bytes | bytearray | memoryview):
            self._text(v)
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
        except Exception as e:  # an object whose reading raises: named, never a crash
            self.put("unreadable", type(v).__qualname__)
            self.unseen.append(f"{where} (a {type(v).__qualname__}: reading it raised "
                               f"{type(e).__name__})")
        finally:
            self._active.discard(id(v))

    def _text(self, v: str | bytes | bytearray | memoryview) -> None:
        self.put(type(v).__name__, len(v))
        if isinstance(v, str):
            for a in range(0, len(v), CHUNK_BYTES):  # a bounded copy at a time
                self.h.update(v[a:a + CHUNK_BYTES].encode("utf-8", "surrogatepass"))
        else:
            self.h.update(v)  # the buffer itself, no copy
        self.h.update(b"\x00")

    def _value(self, v: Any, where: str, depth: int) -> None:
        if isinstance(v, enum.Enum):
            self.put("enum", type(v).__qualname__, v.name)
        elif isinstance(v, os._Environ):  # the whole environment: differs per rank and shell
            self.put("environ")
            self.unseen.append(f"{where} (os.environ: which variables are read cannot be "
                               "seen)")
        elif isinstance(v, list | tuple):
            self._sequence(v, where, depth)
        elif isinstance(v, collections.deque):
            self.put("deque", v.maxlen)
            self._sequence(list(v), where, depth)
        elif isinstance(v, set | frozenset):
            self._set(v, where, depth)
        elif isinstance(v, dict):
            self._dict(v, where, depth)
        elif isinstance(v, os.PathLike):
            self.put("path", os.fspath(v))
        elif isinstance(v, torch.Tensor):
            self._tensor(v, where)
        elif isinstance(v, np.ndarray):
            self._ndarray(v, where, depth)
        elif hasattr(v, "shape") and hasattr(v, "dtype") and hasattr(v, "tolist"):
            self._ndarray(np.asarray(v), where, depth)  # other array types, through numpy
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

    def _sequence(self, v: list[Any] | tuple[Any, ...], where: str, depth: int) -> None:
        n = len(v)
        self.put(type(v).__name__, n)
        step = 4096
        for a in range(0, min(n, MAX_ITEMS), step):
            chunk = v[a:a + step]
            # Plain items (numbers, strings, tuples of them: labels, file lists) by the repr of
            # a chunk, which is their whole value and costs C time, not a call per item.
            if all(type(x) in _PLAIN or (type(x) is tuple and all(type(y) in _PLAIN for y in x))
                   for x in chunk):
                self.put(repr(chunk))
                continue
            for i, x in enumerate(chunk, a):
                self.value(x, f"{where}[{i}]", depth)
        if n > MAX_ITEMS:
            self.unseen.append(f"{where} (a {type(v).__name__} of {n:,} items, hashed in part)")

    def _set(self, v: set[Any] | frozenset[Any], where: str, depth: int) -> None:
        # By the sorted digests of the items: a set's iteration order (and the repr of its
        # strings) changes with PYTHONHASHSEED in every process.
        self.put(type(v).__name__, len(v))
        items = sorted(self.digest_of(x, f"{where} (an item)", depth)
                       for x in list(v)[:MAX_ITEMS])
        self.put(*items)
        if len(v) > MAX_ITEMS:
            self.unseen.append(f"{where} (a set of {len(v):,} items, hashed in part)")

    def _dict(self, v: dict[Any, Any], where: str, depth: int) -> None:
        self.put("dict", len(v))
        keyed = sorted(((self.digest_of(k, f"{where} (a key)", depth), k)
                        for k in list(v)[:MAX_ITEMS]), key=lambda dk: dk[0])
        for d, k in keyed:
            self.put(d)
            self.value(v[k], f"{where}[{k!r}]", depth)
        if len(v) > MAX_ITEMS:
            self.unseen.append(f"{where} (a dict of {len(v):,} items, hashed in part)")

    def _tensor(self, v: torch.Tensor, where: str) -> None:
        """Shape, dtype and every byte, read through the buffer in place (a bounded copy at a
        time where it is not contiguous or not on the CPU)."""
        t = v.detach()
        self.put("tensor", tuple(t.shape), t.dtype, t.layout)
        if t.is_sparse:
            t = t.coalesce()
            self._tensor(t.indices(), where)
            self._tensor(t.values(), where)
            return
        if t.layout != torch.strided or t.device.type == "meta":
            self.unseen.append(f"{where} (a {t.layout} tensor on {t.device}, whose values "
                               "cannot be read)")
            return
        if t.is_quantized:
            t = t.int_repr()
        if not t.numel():
            return
        if (t.device.type == "cpu" and t.is_contiguous() and not t.is_conj()
                and not t.is_neg()):
            self.h.update(t.reshape(-1).view(torch.uint8).numpy().data)
            return
        for part in _chunks(t):
            c = part.resolve_conj().resolve_neg().contiguous().cpu()
            self.h.update(c.reshape(-1).view(torch.uint8).numpy().data)

    def _ndarray(self, v: np.ndarray[Any, Any], where: str, depth: int) -> None:
        self.put("ndarray", v.shape, v.dtype.str, v.dtype.descr)
        if v.dtype.hasobject:  # references, not values: each item hashed
            for i, x in enumerate(v.flat):
                if i >= MAX_ITEMS:
                    self.unseen.append(f"{where} (an object array of {v.size:,} items, hashed "
                                       "in part)")
                    break
                self.value(x, f"{where}.flat[{i}]", depth)
            return
        if not v.size:
            return
        if v.flags.c_contiguous:
            self.h.update(v.reshape(-1).view(np.uint8).data)
            return
        for part in _chunks(v):
            self.h.update(np.ascontiguousarray(part).reshape(-1).view(np.uint8).data)

    def _class(self, cls: type, where: str, depth: int) -> bool:
        """Hash a class: the user's by its methods' code and its attributes, and those of its
        user base classes (True); a library's by its name and version (False)."""
        self.put("class", cls.__module__, cls.__qualname__)
        if not _users_class(cls):
            self.put(_version(cls.__module__))
            return False
        for c in cls.__mro__:
            if c is not cls and not _users_class(c):
                continue
            self.put("class body", c.__module__, c.__qualname__)
            for name, attr in sorted(vars(c).items()):
                fn: Any = attr
                if isinstance(attr, staticmethod | classmethod):
                    fn = attr.__func__
                elif isinstance(attr, property):
                    fn = attr.fget
                if isinstance(fn, types.FunctionType):
                    self.put("method", name)
                    self.function(fn, f"{where}.{name}", depth)
                elif _descriptor(attr):
                    # a slot's or a namedtuple field's accessor: the instance holds the value
                    self.put("descriptor", name, type(attr).__qualname__)
                elif not (name.startswith("__") and name.endswith("__")) and name not in (
                        "_abc_impl", "_is_protocol"):
                    # A class attribute the methods read (Cfg.SCALE, self.MEAN): its value.
                    self.put("attribute", name)
                    self.value(attr, f"{c.__qualname__}.{name}", depth)
        return True

    def _object(self, v: Any, where: str, depth: int) -> None:
        cls = type(v)
        users = self._class(cls, where, depth)
        hf = getattr(v, "_fingerprint", None)
        if isinstance(hf, str) and type(v).__module__.startswith("datasets."):
            self.put("hf", hf)  # a Hugging Face dataset: its own content fingerprint
            return
        try:
            attrs = dict(vars(v))
        except TypeError:
            slots = [s for c in cls.__mro__ for s in getattr(c, "__slots__", ())]
            attrs = {s: getattr(v, s) for s in slots if hasattr(v, s)}
        if not attrs:
            r = _plain_repr(v)
            if isinstance(v, _NO_DATA):
                self.put("no data", cls.__qualname__)
                return
            if not users and not (r and isinstance(v, _DESCRIBED_BY_REPR)):
                self.unseen.append(f"{where} (a {cls.__qualname__}, whose state cannot be "
                                   "read)")
            self.put(r)
            return
        for k in sorted(attrs):
            self.put("attr", k)
            self.value(attrs[k], f"{where}.{k}", depth)

    def _module(self, mod: types.ModuleType, names: set[str], where: str, depth: int) -> None:
        """A module of the user's imported by name: the attributes the code names, by value
        (``mymodule.helper`` by its code and what it reads, ``mymodule.SIZE`` by its value)."""
        self.put("module", mod.__name__)
        key = (id(mod), frozenset(names))
        if key in self._seen_modules or depth > MAX_DEPTH:
            return
        self._seen_modules.add(key)
        found = vars(mod)
        for name in sorted(names):
            if name in found:
                a = found[name]
                self.put("module attribute", name)
                if isinstance(a, types.ModuleType) and _users_module(a):
                    self._module(a, names, f"{mod.__name__}.{name}", depth + 1)
                else:
                    self.value(a, f"{mod.__name__}.{name}", depth + 1)

    # -- code ----------------------------------------------------------------------------------
    def function(self, fn: types.FunctionType, where: str, depth: int) -> None:
        code = fn.__code__
        self.put("function", fn.__module__, fn.__qualname__)
        if _is_library(code.co_filename):
            self.put(_version(fn.__module__))
            return
        names = self.code(code, fn.__qualname__)
        self.value(fn.__defaults__, f"{where} (defaults)", depth)
        self.value(fn.__kwdefaults__, f"{where} (keyword defaults)", depth)
        for name, cell in zip(code.co_freevars, fn.__closure__ or (), strict=True):
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell: a name bound later in the enclosing function
                continue
            where_c = f"closure variable {name!r} of {fn.__qualname__}"
            if isinstance(content, types.ModuleType) and _users_module(content):
                self._module(content, names, where_c, depth)
            else:
                self.value(content, where_c, depth)
        g = fn.__globals__
        for name in sorted(names):
            if name in g:
                self.put("global", name)
                v = g[name]
                if isinstance(v, types.ModuleType):
                    if _users_module(v):
                        self._module(v, names, f"module {name!r}", depth)
                        continue
                    if v.__name__.partition(".")[0] in _NETWORK:
                        self.unseen.append(f"what {fn.__qualname__} reads through "
                                           f"{v.__name__} (the network)")
                self.value(v, f"global {name!r} of {fn.__qualname__}", depth)
            elif name == "open" and _loads_global(code, "open"):  # not ``Image.open``
                self.unseen.append(f"the files {fn.__qualname__} reads with open() (their "
                                   "contents are not in the key)")
            elif not hasattr(builtins, name):
                self.put("unbound", name)

    def code(self, code: types.CodeType, qualname: str) -> set[str]:
        """Hash the bytecode and constants (nested code objects by content, never by their
        repr, which holds an address); return the global and attribute names it reads."""
        self.put("code", code.co_code.hex(), code.co_names, code.co_varnames)
        names = set(code.co_names)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                names |= self.code(c, qualname)
            else:  # frozenset constants (``x in {"a", "b"}``) by item, not by their repr
                self.value(c, f"a constant of {qualname}")
        if names & _ENV_READS:
            self._environment(code, qualname)
        return names

    def _environment(self, code: types.CodeType, qualname: str) -> None:
        """The variables read by a literal name after ``environ``/``getenv``."""
        ins = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
        for k, i in enumerate(ins):
            if i.argval not in _ENV_READS or not i.opname.startswith("LOAD"):
                continue
            name = None
            for j in ins[k + 1:k + 4]:
                if j.opname == "LOAD_CONST":
                    name = j.argval if isinstance(j.argval, str) else None
                    break
                if j.opname not in ("LOAD_ATTR", "LOAD_METHOD", "PUSH_NULL"):
                    break  # iterated, copied or read by a computed name
            if name is not None:
                self.env.setdefault(name, qualname)
            else:
                self.put("environ", "unknown")
                self.unseen.append(f"the environment read by {qualname} (os.environ used "
                                   "other than by a literal name)")


def _loads_global(code: types.CodeType, name: str) -> bool:
    """Whether ``code`` (or code nested in it) reads the global or builtin ``name``, not only
    an attribute of that name."""
    if any(i.opname in ("LOAD_GLOBAL", "LOAD_NAME") and i.argval == name
           for i in dis.get_instructions(code)):
        return True
    return any(_loads_global(c, name) for c in code.co_consts if isinstance(c, types.CodeType))


def _chunks(a: Any) -> Any:
    """Slices of ``a`` along its first axes, each at most CHUNK_BYTES (or one row), in order:
    their bytes, concatenated, are the array's C-order bytes."""
    if a.ndim == 0:
        yield a.reshape(1)
        return
    row = (a[0].numel() if isinstance(a, torch.Tensor) else a[0].size) * (
        a.element_size() if isinstance(a, torch.Tensor) else a.itemsize)
    if row > CHUNK_BYTES and a.ndim > 1:
        for i in range(a.shape[0]):
            yield from _chunks(a[i])
        return
    step = max(1, CHUNK_BYTES // max(1, row))
    for s in range(0, a.shape[0], step):
        yield a[s:s + step]


def _descriptor(attr: Any) -> bool:
    """A library-made descriptor in a class body (``__slots__`` members, namedtuple fields,
    ``functools.cached_property``): it reads the instance, whose attributes are hashed."""
    t = type(attr)
    return (hasattr(t, "__get__") and not isinstance(attr, types.FunctionType | type)
            and not _users_class(t))


def _users_module(mod: types.ModuleType) -> bool:
    f = getattr(mod, "__file__", None)
    return isinstance(f, str) and not _is_library(f)


def _users_class(cls: type) -> bool:
    mod = sys.modules.get(cls.__module__)
    src = getattr(mod, "__file__", None) if mod is not None else None
    if src is None:  # a class made at run time: where its methods were written
        src = next((a.__code__.co_filename for a in vars(cls).values()
                    if isinstance(a, types.FunctionType)), None)
    if src is None:  # no file: made at run time (exec, a notebook), or built into Python
        return mod is None or cls.__module__ == "__main__"
    return not _is_library(src)


def _described_by_repr() -> tuple[type, ...]:
    import re

    import torch

    return (range, slice, re.Pattern, torch.dtype, torch.device, torch.Size, torch.layout,
            torch.memory_format)


_DESCRIBED_BY_REPR = _described_by_repr()
"""Types without readable attributes whose repr says everything their behaviour depends on."""

_NO_DATA: tuple[type, ...] = (type(threading.Lock()), type(threading.RLock()))
"""Types without readable attributes that hold no data a sample depends on (a dataset's lock
around a lazily opened file)."""


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
    return hasher.finish(), hasher.unseen


def dataset_fingerprint(dataset: Any) -> tuple[str, list[str]]:
    """(16 hex digits, what it could not see) of a dataset: its type, length and content.

    Its ``fingerprint`` attribute where it has one (a version string the user keeps), else
    everything it holds, hashed as a transform's values are: tensors and arrays by every byte
    (streamed through their buffers), lists by every item, the code of its class."""
    hasher = _Hasher()
    hasher.put("dataset", type(dataset).__module__, type(dataset).__qualname__, len(dataset))
    own = getattr(dataset, "fingerprint", None)
    if isinstance(own, str | int | bytes):
        hasher.put("own", own)
    else:
        hasher.value(dataset, "the dataset")
    return hasher.finish(), hasher.unseen
