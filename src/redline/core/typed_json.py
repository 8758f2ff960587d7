"""Dataclasses from JSON, every field checked against its type hint, every error naming the
field's path (``decisions[2].p_value: expected a number or null, got 'fast'``).

What a file on disk holds is the user's, not redline's: a plan edited by hand, written by
another version, or cut short must be refused with what is wrong and where, never half-read.
Ranges are the dataclasses' own ``__post_init__`` checks, reported with the same path.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, TypeVar, Union

T = TypeVar("T")


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"{str(v).lower()}"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return repr(v[:60])
    return {"dict": "an object", "list": "a list"}.get(type(v).__name__, type(v).__name__)


def _expected(tp: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
             type(None): "null"}
    if tp in names:
        return names[tp]
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_expected(a) for a in typing.get_args(tp))
    if origin is list:
        return "a list"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "an object"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    return str(tp)


def _convert(tp: Any, v: Any, path: str) -> Any:
    if tp is Any:
        return v
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            try:
                return _convert(arg, v, path)
            except ValueError as e:
                errors.append(e)
        raise ValueError(f"{path}: expected {_expected(tp)}, got {_kind(v)}")
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return from_json(tp, v, path)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(v)
        except ValueError:
            raise ValueError(f"{path}: expected {_expected(tp)}, got {_kind(v)}") from None
    if origin is list:
        if not isinstance(v, list):
            raise ValueError(f"{path}: expected a list, got {_kind(v)}")
        (item,) = typing.get_args(tp)
        return [_convert(item, x, f"{path}[{i}]") for i, x in enumerate(v)]
    if origin is dict:
        if not isinstance(v, dict):
            raise ValueError(f"{path}: expected an object, got {_kind(v)}")
        _, value = typing.get_args(tp)
        return {k: _convert(value, x, f"{path}.{k}") for k, x in v.items()}
    ok = (v is None if tp is type(None) else
          isinstance(v, bool) if tp is bool else
          isinstance(v, int) and not isinstance(v, bool) if tp is int else
          isinstance(v, int | float) and not isinstance(v, bool) if tp is float else
          isinstance(v, str) if tp is str else False)
    if not ok:
        raise ValueError(f"{path}: expected {_expected(tp)}, got {_kind(v)}")
    return float(v) if tp is float else v


def from_json(cls: type[T], data: Any, path: str = "") -> T:
    """``cls(**data)`` with every field checked; raises ValueError naming the field's path
    (a missing field, an unknown one, a wrong type, or a value ``__post_init__`` refuses)."""
    where = path or "the document"
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object, got {_kind(data)}")
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    unknown = sorted(set(data) - {f.name for f in fields})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}")
    kw: dict[str, Any] = {}
    for f in fields:
        sub = f"{path}.{f.name}" if path else f.name
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{sub}: missing (expected {_expected(hints[f.name])})")
            continue
        kw[f.name] = _convert(hints[f.name], data[f.name], sub)
    try:
        return cls(**kw)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None
