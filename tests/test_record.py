"""``@record`` (core/record.py) behaves as the ``@dataclass(slots=True, kw_only=True)`` it stands
for on the trace path: built by keyword, defaults and fresh factories, repr, equality, no hash,
slots, and ``as_dict`` equal to ``dataclasses.asdict``."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from redline.core.record import as_dict, field, record


@record
class Inner:
    """A nested record."""

    name: str
    share: float = 0.0


@record
class Outer:
    """A record holding records, containers and defaults."""

    rank: int
    label: str | None = None
    inner: list[Inner] = field(default_factory=list)
    by_key: dict[int, Inner] = field(default_factory=dict)
    pair: tuple[int, int] = (0, 0)

    @property
    def count(self) -> int:
        return len(self.inner)


@dataclasses.dataclass(slots=True, kw_only=True)
class InnerDC:
    name: str
    share: float = 0.0


@dataclasses.dataclass(slots=True, kw_only=True)
class OuterDC:
    rank: int
    label: str | None = None
    inner: list[InnerDC] = dataclasses.field(default_factory=list)
    by_key: dict[int, InnerDC] = dataclasses.field(default_factory=dict)
    pair: tuple[int, int] = (0, 0)


def test_built_by_keyword_with_defaults_and_fresh_factories() -> None:
    a, b = Outer(rank=1), Outer(rank=2, label="x", inner=[Inner(name="k")], pair=(1, 2))
    assert (a.rank, a.label, a.inner, a.by_key, a.pair) == (1, None, [], {}, (0, 0))
    assert (b.label, b.count, b.pair) == ("x", 1, (1, 2))
    a.inner.append(Inner(name="only a's"))
    assert Outer(rank=3).inner == []  # a new list per record, not one shared


def test_wrong_calls_fail_as_a_dataclass_call_does() -> None:
    with pytest.raises(TypeError, match="positional"):
        Outer(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="'rank'"):
        Outer()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected"):
        Outer(rank=1, ranks=2)  # type: ignore[call-arg]


def test_repr_equality_hash_and_slots_as_a_dataclass() -> None:
    a = Outer(rank=1, inner=[Inner(name="k", share=0.5)])
    dc = OuterDC(rank=1, inner=[InnerDC(name="k", share=0.5)])
    assert repr(a) == repr(dc).replace("DC(", "(")
    assert a == Outer(rank=1, inner=[Inner(name="k", share=0.5)])
    other_kind: object = dc
    assert a != Outer(rank=1) and a != other_kind
    nan = float("nan")  # fields compared as tuples are: the same NaN object is equal
    for share in (nan, float("nan")):
        assert (Inner(name="n", share=nan) == Inner(name="n", share=share)) == \
            (InnerDC(name="n", share=nan) == InnerDC(name="n", share=share))
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)
    with pytest.raises(AttributeError):
        a.extra = 1  # type: ignore[attr-defined]
    assert not hasattr(a, "__dict__")
    assert pickle.loads(pickle.dumps(a)) == a


def test_as_dict_is_dataclasses_asdict() -> None:
    a = Outer(rank=1, label="x", inner=[Inner(name="k", share=0.5)],
              by_key={3: Inner(name="v")}, pair=(1, 2))
    dc = OuterDC(rank=1, label="x", inner=[InnerDC(name="k", share=0.5)],
                 by_key={3: InnerDC(name="v")}, pair=(1, 2))
    assert as_dict(a) == dataclasses.asdict(dc)
    assert as_dict([a, 7, "s"]) == [dataclasses.asdict(dc), 7, "s"]


def test_only_plain_classes() -> None:
    class Base:
        pass

    with pytest.raises(TypeError, match="plain classes"):
        record(type("Sub", (Base,), {"__annotations__": {"x": "int"}}))
