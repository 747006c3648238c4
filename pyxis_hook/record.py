"""Records: the part of `dataclasses` this package uses, without its start-up cost.

Why not `dataclasses`: the hook runs once per container start, and its
start-up is most of its time.
Importing `dataclasses` pulls in `inspect` (with `ast`, `dis`, `tokenize`),
and each frozen dataclass then compiles six generated methods with `exec`:
costs a start would pay for every record on its path
(docs/decisions/2026-12-07-start-costs.md).  Every record shares the same five
methods, which read the class's fields from one attribute (`__record_shape__`): no source
text, no compile, nothing made per class but that tuple.

What a record is, exactly as `@dataclass(frozen=True)` would make it
(tests/unit/base/test_record.py checks each point against `dataclasses` itself):
`__init__` taking the annotated fields in order, positionally or by
keyword, with defaults and default factories; `__repr__`
`Name(field=value, ...)`; `__eq__` over the compared fields of the same
class; `__hash__` over them; assignment and deletion raising
FrozenInstanceError.  A method the class body defines itself is kept, as
dataclasses keeps it.  `record(frozen=False)` gives a mutable, unhashable
one.  `replace`, `asdict` and `fields` work as their dataclasses namesakes.
`__post_init__`, when the class defines one, runs after the fields are set.
Not supported (never needed here): InitVar, ClassVar, KW_ONLY, slots,
ordering.  `asdict` does not deep-copy the leaves (records hold immutable
values).
"""

from __future__ import annotations

import sys

_MISSING = object()
_MUTABLE_DEFAULTS = (list, dict, set)


class FrozenInstanceError(AttributeError):
    """Assigning to or deleting a field of a frozen record."""


class Field:
    """One field: its name, default or default factory, and whether == and hash() look at it."""

    __slots__ = ("name", "default", "default_factory", "compare")

    def __init__(self, default=_MISSING, default_factory=_MISSING, compare: bool = True) -> None:
        if default is not _MISSING and default_factory is not _MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = ""
        self.default = default
        self.default_factory = default_factory
        self.compare = compare

    def __repr__(self) -> str:
        return f"Field(name={self.name!r})"


def field(*, default=_MISSING, default_factory=_MISSING, compare: bool = True):
    """A field with a default factory or excluded from comparison (dataclasses.field's subset)."""
    return Field(default, default_factory, compare)


TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing_extensions import dataclass_transform  # typing has it from Python 3.11; stubs only, never run
else:  # what typing's does at run time, without importing typing (docs/decisions/2026-12-07-start-costs.md)

    def dataclass_transform(**_):
        return lambda f: f


# a type checker reads a record as the dataclass it behaves as (PEP 681): fields, __init__, frozen
@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls=None, /, *, frozen: bool = True):
    """Class decorator: make `cls` a record of its annotated fields (see the module docstring)."""

    def wrap(c: type) -> type:
        return _build(c, frozen)

    return wrap if cls is None else wrap(cls)


def _build(cls: type, frozen: bool) -> type:
    # Straight-line on purpose: ~40 records are built on every GPU start, and this body's cost per
    # record (not the class's own creation) was half of it with generator expressions, a Field
    # constructor call per field and attribute lookups that miss on `object`.
    own = cls.__dict__
    subclass = len(cls.__mro__) > 2  # (cls, object) for all but a record that extends another class
    inherited: dict[str, Field] = {}
    if subclass:
        for base in cls.__mro__[-1:0:-1]:
            for f in getattr(base, "__record_fields__", ()):
                inherited[f.name] = f
    annotations = own.get("__annotations__")
    for name in annotations if annotations is not None else _annotation_names(cls):
        value = own.get(name, _MISSING)
        if type(value) is Field:
            f = value
            if f.default is _MISSING:  # the class attribute is the plain default, as in dataclasses
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        else:
            f = _new_field(value)
        f.name = name
        if isinstance(f.default, _MUTABLE_DEFAULTS):
            raise ValueError(f"mutable default {type(f.default)} for field {name} is not allowed: "
                             "use default_factory")
        inherited[name] = f
    all_fields = tuple(inherited.values())
    seen_default = False
    names = []
    compared = []
    for f in all_fields:
        has_default = f.default is not _MISSING or f.default_factory is not _MISSING
        if seen_default and not has_default:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
        seen_default = seen_default or has_default
        names.append(f.name)
        if f.compare:
            compared.append(f.name)

    cls.__record_fields__ = all_fields
    post_init = getattr(cls, "__post_init__", None) if subclass else own.get("__post_init__")
    spec = tuple([(f.name, f.default, f.default_factory) for f in all_fields])
    # one attribute for the shared methods below: each assignment to a class is a type change
    cls.__record_shape__ = (cls, all_fields, len(all_fields), tuple(names), spec, post_init, tuple(compared))
    # as dataclasses: a method the class body defines itself is kept
    if "__init__" not in own:
        cls.__init__ = _init
    if "__repr__" not in own:
        cls.__repr__ = _repr
    if "__eq__" not in own:
        cls.__eq__ = _eq
    explicit_hash = own.get("__hash__") is not None
    if frozen:
        if "__setattr__" in own or "__delattr__" in own:
            name = "__setattr__" if "__setattr__" in own else "__delattr__"
            raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
        if not explicit_hash:
            cls.__hash__ = _hash
        cls.__setattr__ = _frozen_setattr
        cls.__delattr__ = _frozen_delattr
    elif not explicit_hash:
        cls.__hash__ = None
    return cls


def _new_field(default) -> Field:
    """`Field(default)` without the constructor's call and checks (a plain default cannot clash)."""
    f = _field_new(Field)
    f.default = default
    f.default_factory = _MISSING
    f.compare = True
    return f


_field_new = object.__new__


def _annotation_names(cls: type) -> tuple[str, ...]:
    """The names the class body annotates, in order.

    Why not only `__annotations__`: from Python 3.14 (PEP 649/749) a class
    body compiled without `from __future__ import annotations` keeps an
    `__annotate_func__` instead, and its fields would silently vanish.
    """
    own = cls.__dict__
    if "__annotations__" in own:
        return tuple(own["__annotations__"])
    annotate = own.get("__annotate_func__")
    if annotate is None:
        return ()
    try:
        return tuple(annotate(1))  # annotationlib.Format.VALUE, the one every annotate function supports
    except NameError:  # an annotation naming what is defined later: its name is all a record needs
        import annotationlib  # type: ignore[import-not-found, unused-ignore]  # Python >= 3.14

        return tuple(annotationlib.get_annotations(cls, format=annotationlib.Format.FORWARDREF))


def _init(self, *args, **kwargs) -> None:
    """Every record's `__init__`: the fields of the record class its class is or extends (`__record_shape__`).

    One function for all records, not one made per class: a record class
    costs its creation only (~40 are made on every GPU start).  Values go
    straight into the instance dict: what object.__setattr__ would do for a
    frozen class, at a third of the cost (a start builds several hundred).
    """
    cls, all_fields, count, names, spec, post_init, _ = type(self).__record_shape__
    given = len(args)
    if given > count:
        raise TypeError(_call_error(cls, all_fields, args, kwargs))
    d = self.__dict__
    if d:  # __init__ called again on a (mutable) record: start from nothing, as a fresh one does
        d.clear()
    if given:
        d.update(zip(names, args))
    if kwargs:
        # the keywords in one C call, then only the fields still missing are looked at
        d.update(kwargs)
        if len(d) != given + len(kwargs):  # a field given both ways
            raise TypeError(_call_error(cls, all_fields, args, kwargs))
    for name, default, factory in spec[given:]:
        if name in d:
            continue
        if default is not _MISSING:
            d[name] = default
        elif factory is not _MISSING:
            d[name] = factory()
        else:
            raise TypeError(_call_error(cls, all_fields, args, kwargs))
    if len(d) != count:  # every field is set now: anything more is an unknown name
        raise TypeError(_call_error(cls, all_fields, args, kwargs))
    if post_init is not None:
        post_init(self)


def _call_error(cls: type, all_fields: tuple[Field, ...], args: tuple, kwargs: dict) -> str:
    """CPython's message for a bad call of the __init__ dataclasses would write (checked in that order)."""
    where = f"{cls.__qualname__}.__init__()" if sys.version_info >= (3, 10) else "__init__()"  # CPython's wording
    names = [f.name for f in all_fields]
    for k in kwargs:
        if k not in names:
            return f"{where} got an unexpected keyword argument {k!r}"
        if names.index(k) < len(args):
            return f"{where} got multiple values for argument {k!r}"
    if len(args) > len(names):
        required = sum(1 for f in all_fields if f.default is _MISSING and f.default_factory is _MISSING)
        if required < len(names):
            takes = f"from {required + 1} to {len(names) + 1} positional arguments"
        else:
            takes = f"{len(names) + 1} positional argument{'s' if names else ''}"
        return f"{where} takes {takes} but {len(args) + 1} were given"
    missing = [repr(f.name) for f in all_fields[len(args):]
               if f.name not in kwargs and f.default is _MISSING and f.default_factory is _MISSING]
    if len(missing) <= 2:
        listed = " and ".join(missing)
    else:
        listed = ", ".join(missing[:-1]) + f", and {missing[-1]}"
    return f"{where} missing {len(missing)} required positional argument{'s' if len(missing) > 1 else ''}: {listed}"


def _repr(self) -> str:
    inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in type(self).__record_shape__[3])
    return f"{type(self).__qualname__}({inner})"


def _eq(self, other):
    if other.__class__ is not self.__class__:
        return NotImplemented
    compared = type(self).__record_shape__[6]
    return tuple(getattr(self, n) for n in compared) == tuple(getattr(other, n) for n in compared)


def _hash(self) -> int:
    return hash(tuple(getattr(self, n) for n in type(self).__record_shape__[6]))


def _frozen_setattr(self, name: str, value) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def fields(obj) -> tuple[Field, ...]:
    """The record's fields, in order (for a record class or instance)."""
    try:
        return obj.__record_fields__
    except AttributeError:
        raise TypeError("must be called with a record type or instance") from None


def is_record(obj) -> bool:
    """True for a record class or instance."""
    return hasattr(obj, "__record_fields__")


def replace(obj, /, **changes):
    """A copy of the record `obj` with `changes` applied (through __init__, so defaults re-apply nowhere).

    The shared `__init__` is given the values positionally: its keyword
    path looks every field up in the keywords, and apply replaces one
    record per mount (a 64-GPU start makes ~70).  A class with its own
    `__init__` gets them by keyword, as dataclasses.replace passes them.
    """
    fields(obj)  # a TypeError for anything but a record
    cls = type(obj)
    names = cls.__record_shape__[3]
    for name in changes:
        if name not in names:
            raise TypeError(f"{cls.__qualname__}.__init__() got an unexpected keyword argument {name!r}")
    if cls.__init__ is _init:
        d = obj.__dict__
        return cls(*[changes[n] if n in changes else d[n] for n in names])
    values = {n: getattr(obj, n) for n in names}
    values.update(changes)
    return cls(**values)


def asdict(obj) -> dict:
    """The record as a dict, recursing into records, lists, tuples and dicts (as dataclasses.asdict)."""
    if not is_record(obj) or isinstance(obj, type):
        raise TypeError("asdict() should be called on record instances")
    return _asdict(obj)


def _asdict(value):
    if is_record(value) and not isinstance(value, type):
        return {f.name: _asdict(getattr(value, f.name)) for f in value.__record_fields__}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*[_asdict(v) for v in value])
    if isinstance(value, (list, tuple)):
        return type(value)(_asdict(v) for v in value)
    if isinstance(value, dict):
        return type(value)((_asdict(k), _asdict(v)) for k, v in value.items())
    return value
