"""hma.record: the dataclass behaviour hma relies on, and the misuse it refuses."""

from __future__ import annotations

import copy
import pickle
from typing import ClassVar, Optional

import pytest

from hma.record import FrozenError, asdict, field, fields, record, replace


@record(frozen=True)
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


@record
class Bag:
    name: str
    items: list[int] = field(default_factory=list)
    inner: Optional[Point] = None
    kind: ClassVar[str] = "bag"  # a class attribute, not a field


def test_init_positional_keyword_and_defaults() -> None:
    assert (Point(1).x, Point(1).y, Point(1).tags) == (1, 0, ())
    p = Point(1, y=2, tags=("a",))
    assert (p.x, p.y, p.tags) == (1, 2, ("a",))
    with pytest.raises(TypeError):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Point(1, z=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Point(1, 2, (), 4)  # type: ignore[call-arg]


def test_default_factory_is_called_per_instance() -> None:
    a, b = Bag("a"), Bag("b")
    a.items.append(1)
    assert b.items == [] and a.items == [1]
    assert Bag("c", [5]).items == [5]
    assert fields(Bag) == ("name", "items", "inner")
    assert Bag.kind == "bag"


def test_repr_eq_and_hash() -> None:
    assert repr(Point(1, 2)) == "Point(x=1, y=2, tags=())"
    assert Point(1, 2) == Point(1, 2) and Point(1, 2) != Point(2, 1)
    assert hash(Point(1, 2)) == hash(Point(1, 2))
    assert len({Point(1), Point(1), Point(2)}) == 2
    assert Bag("a") == Bag("a") and Bag("a") != Bag("b")
    assert Point(1) != (1, 0, ())  # another class never compares equal
    with pytest.raises(TypeError):
        hash(Bag("a"))  # mutable: unhashable, as a dataclass is


def test_frozen_refuses_assignment_and_deletion() -> None:
    p = Point(1)
    with pytest.raises(FrozenError):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del p.x  # type: ignore[misc]
    bag = Bag("a")
    bag.name = "b"
    assert bag.name == "b"


def test_replace_asdict_copy_and_pickle() -> None:
    p = Point(1, 2, ("t",))
    assert replace(p, y=5) == Point(1, 5, ("t",)) and p.y == 2
    with pytest.raises(TypeError):
        replace(p, z=1)
    bag = Bag("a", [1, 2], inner=p)
    plain = asdict(bag)
    assert plain == {"name": "a", "items": [1, 2], "inner": {"x": 1, "y": 2, "tags": ("t",)}}
    plain["items"].append(3)
    assert bag.items == [1, 2]  # asdict copies
    assert copy.deepcopy(bag) == bag and copy.copy(p) == p
    assert pickle.loads(pickle.dumps(p)) == p
    with pytest.raises(TypeError, match="not a record"):
        asdict({"x": 1})


def test_misuse_is_refused_when_the_class_is_made() -> None:
    with pytest.raises(ValueError, match="default_factory"):

        @record
        class Shared:
            items: list[int] = []  # the mistake under test

    with pytest.raises(TypeError, match="no default after"):

        @record
        class Order:
            a: int = 0
            b: int

    with pytest.raises(TypeError, match="inherit"):

        @record
        class Child(Point):
            z: int = 0
