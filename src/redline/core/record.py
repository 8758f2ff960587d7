"""Keyword-only records for the modules ``redline trace`` loads.

``@record`` gives a class what ``@dataclass(slots=True, kw_only=True)`` gives a record: typed
fields read from its annotations, defaults and ``field(default_factory=...)``, an ``__init__``
by keyword, ``__repr__``, ``__eq__`` (and no hash, as a mutable dataclass), ``__slots__``; and
:func:`as_dict` is ``dataclasses.asdict`` for them. Type checkers see a dataclass (PEP 681,
``dataclass_transform``). What it saves is start-up time: a dataclass compiles the source of
its ``__init__``, ``__repr__`` and ``__eq__`` when its module is imported (~0.3 ms a class on a
2-core VM: as dataclasses, the trace path's 17 records made ``redline trace`` ~6 ms, ~10 %,
slower on a small trace), where a record only builds its class (~0.03 ms). Its ``__init__``
is generic, ~1 µs slower a call: for records made a few at a time, not once per event
(``load._convert`` builds its events without calling ``__init__``).

Kept apart from dataclasses: ``dataclasses.fields`` / ``replace`` / ``asdict`` do not take a
record, and a method of one cannot use zero-argument ``super()`` (the class is rebuilt with
its slots).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms at start-up)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar, dataclass_transform

    _T = TypeVar("_T")
else:
    def dataclass_transform(**_: object) -> Callable[[_T], _T]:
        return lambda function: function


class _Factory:
    """A field's default made anew for each record (``field(default_factory=...)``)."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], object]) -> None:
        self.make = make


def field(*, default_factory: Callable[[], _T]) -> _T:
    """A field whose default is ``default_factory()``, called for each record (a list, a
    dict), as ``dataclasses.field(default_factory=...)``."""
    made: Any = _Factory(default_factory)  # the class attribute @record reads, not a _T
    return made  # type: ignore[no-any-return]


@dataclass_transform(kw_only_default=True, field_specifiers=(field,))
def record(cls: type[_T]) -> type[_T]:
    """The class rebuilt as a keyword-only record with slots (see the module's docstring)."""
    own = dict(cls.__dict__)
    names = tuple(own.get("__annotations__", {}))
    defaults = {name: own.pop(name) for name in names if name in own}
    if cls.__bases__ != (object,):
        raise TypeError(f"@record {cls.__qualname__}: plain classes only (no base class)")
    own.pop("__dict__", None)
    own.pop("__weakref__", None)
    qualname = cls.__qualname__

    def _values(instance: object) -> tuple[object, ...]:
        return tuple(getattr(instance, name) for name in names)  # compared as dataclasses do

    def __init__(self: object, **values: object) -> None:
        for name in names:
            if name in values:
                value = values.pop(name)
            elif name in defaults:
                default = defaults[name]
                value = default.make() if isinstance(default, _Factory) else default
            else:
                raise TypeError(f"{qualname}() missing the keyword argument {name!r}")
            object.__setattr__(self, name, value)
        if values:
            raise TypeError(f"{qualname}() got unexpected keyword arguments {sorted(values)}")

    def __repr__(self: object) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
        return f"{qualname}({inner})"

    def __eq__(self: object, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return _values(self) == _values(other)

    own.update(__slots__=names, __init__=__init__, __repr__=__repr__, __eq__=__eq__,
               __hash__=None, __match_args__=(), _record_fields=names)
    for method in (__init__, __repr__, __eq__):
        method.__qualname__ = f"{qualname}.{method.__name__}"
    return type(cls.__name__, cls.__bases__, own)


def as_dict(value: Any) -> Any:
    """``value`` with every record in it turned into a dict of its fields, recursively through
    lists, tuples and dicts (``dataclasses.asdict`` for records; other values are returned as
    they are, not copied)."""
    fields: tuple[str, ...] | None = getattr(type(value), "_record_fields", None)
    if fields is not None:
        return {name: as_dict(getattr(value, name)) for name in fields}
    if isinstance(value, list):
        return [as_dict(item) for item in value]
    if isinstance(value, tuple):
        return tuple(as_dict(item) for item in value)
    if isinstance(value, dict):
        return {as_dict(key): as_dict(item) for key, item in value.items()}
    return value
