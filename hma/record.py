"""Record classes: the part of :mod:`dataclasses` hma uses, without its start-up cost.

``import dataclasses`` pulls in inspect, ast, dis and tokenize: about 10 ms on a packaged
Python 3.11 whose whole start is 11 ms, paid by every ``hma`` command (issue 14). A class
decorated with :func:`record` behaves as a ``@dataclass`` does in everything hma relies on:
an ``__init__`` taking the annotated fields in order (defaults and ``field(default_factory=)``),
``__repr__``, ``__eq__`` between instances of the same class, and with ``frozen=True``
assignment refused and ``__hash__`` from the fields (a mutable record is unhashable).
``replace``, ``asdict`` and ``fields`` are the dataclasses functions of the same names.
Not supported (refused when seen): inheriting fields from another record.

``__init__`` is generated from source, as dataclasses does, so that creating an instance
costs what a hand-written ``__init__`` does.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, TypeVar

    from typing_extensions import dataclass_transform

    T = TypeVar("T")
else:

    def dataclass_transform(**_: object) -> object:
        return lambda f: f


_MISSING = object()
_FIELDS = "__record_fields__"


class FrozenError(AttributeError):
    """Assignment to (or deletion of) an attribute of a frozen record."""


class Field:
    """A field's default factory (what :func:`field` returns)."""

    __slots__ = ("default_factory",)

    def __init__(self, default_factory: Callable[[], object]) -> None:
        self.default_factory = default_factory


def field(*, default_factory: Callable[[], T]) -> T:
    """A field whose default is made anew for each instance by ``default_factory``."""
    return Field(default_factory)  # type: ignore[return-value]  # replaced by the decorator


@dataclass_transform(field_specifiers=(field,))
def record(cls: Any = None, /, *, frozen: bool = False) -> Any:
    """Class decorator: ``@record`` or ``@record(frozen=True)`` (see the module docstring)."""

    def wrap(c: type) -> type:
        return _build(c, frozen)

    return wrap if cls is None else wrap(cls)


def fields(obj: Any) -> tuple[str, ...]:
    """Names of a record's (or record class's) fields, in order."""
    try:
        return getattr(obj, _FIELDS)
    except AttributeError:
        raise TypeError(f"{obj!r} is not a record") from None


def replace(obj: T, **changes: Any) -> T:
    """A copy of record ``obj`` with ``changes`` applied (a TypeError for an unknown name)."""
    values = {name: getattr(obj, name) for name in fields(obj)}
    return type(obj)(**{**values, **changes})


def asdict(obj: Any) -> dict[str, Any]:
    """A record as a dict, records nested in lists, tuples and dicts converted too."""
    fields(obj)  # a TypeError for anything else
    return _plain(obj)


def _plain(value: Any) -> Any:
    if hasattr(type(value), _FIELDS):
        return {name: _plain(getattr(value, name)) for name in fields(value)}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    import copy

    return copy.deepcopy(value)


def _is_classvar(annotation: object) -> bool:
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return text.startswith(("ClassVar", "typing.ClassVar"))


def _build(cls: type, frozen: bool) -> type:
    if any(hasattr(base, _FIELDS) for base in cls.__mro__[1:]):
        raise TypeError(f"{cls.__qualname__}: a record cannot inherit another record's fields")
    own = cls.__dict__.get("__annotations__", {})
    names = tuple(name for name, ann in own.items() if not _is_classvar(ann))
    if "self" in names:
        raise TypeError(f"{cls.__qualname__}: a field cannot be named 'self'")
    scope: dict[str, Any] = {"_rec_missing": _MISSING, "_rec_set": object.__setattr__}
    params, body = [], []
    for name in names:
        default = cls.__dict__.get(name, _MISSING)
        if isinstance(default, (list, dict, set)):
            raise ValueError(
                f"{cls.__qualname__}.{name}: mutable default {type(default).__name__}, "
                "use field(default_factory=...)"
            )
        if isinstance(default, Field):
            scope[f"_rec_f_{name}"] = default.default_factory
            delattr(cls, name)
            params.append(f"{name}=_rec_missing")
            value = f"_rec_f_{name}() if {name} is _rec_missing else {name}"
        else:
            if default is _MISSING and params and "=" in params[-1]:
                raise TypeError(f"{cls.__qualname__}.{name}: no default after a field with one")
            if default is not _MISSING:
                scope[f"_rec_d_{name}"] = default
            params.append(name if default is _MISSING else f"{name}=_rec_d_{name}")
            value = name
        body.append(f"    _rec_set(self, {name!r}, {value})")
    source = f"def __init__(self, {', '.join(params)}):\n" + ("\n".join(body) or "    pass")
    exec(source, scope)  # noqa: S102  # the generated __init__: names and defaults above only
    scope["__init__"].__qualname__ = f"{cls.__qualname__}.__init__"
    methods = {"__init__": scope["__init__"], "__repr__": _repr, "__eq__": _eq}
    for attr, method in methods.items():
        if attr not in cls.__dict__:
            setattr(cls, attr, method)
    setattr(cls, _FIELDS, names)
    explicit_hash = cls.__dict__.get("__hash__", _MISSING) not in (_MISSING, None)
    if not explicit_hash:
        cls.__hash__ = _hash if frozen else None  # type: ignore[assignment]
    if frozen:
        cls.__setattr__ = _refuse_set  # type: ignore[method-assign,assignment]
        cls.__delattr__ = _refuse_delete  # type: ignore[method-assign,assignment]
    return cls


def _values(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, name) for name in getattr(obj, _FIELDS))


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in getattr(self, _FIELDS))
    return f"{type(self).__qualname__}({shown})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is self.__class__:
        return _values(self) == _values(other)
    return NotImplemented


def _hash(self: Any) -> int:
    return hash(_values(self))


def _refuse_set(self: Any, name: str, value: Any) -> None:
    raise FrozenError(f"cannot assign to field {name!r} of frozen {type(self).__qualname__}")


def _refuse_delete(self: Any, name: str) -> None:
    raise FrozenError(f"cannot delete field {name!r} of frozen {type(self).__qualname__}")
