"""pyxis_hook.record against its oracle, the standard library's dataclasses.

For random field lists (names, plain defaults, default factories, fields
left out of comparison) the same class body is made a frozen dataclass and
a record, and every operation the package uses must agree: construction
(positional, keyword, mixed, and each way it can fail), repr, ==, hash,
replace, asdict, fields, and the frozen errors.
"""

from __future__ import annotations

import dataclasses
import keyword
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyxis_hook import record as rec

_names = st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), min_size=0, max_size=6,
                  unique=True).filter(lambda ns: not any(n == "self" or keyword.iskeyword(n) for n in ns))
_values = st.one_of(st.integers(-5, 5), st.text(max_size=4), st.none(), st.tuples(st.integers(0, 3)),
                    st.booleans())


@st.composite
def _specs(draw):
    """[(name, kind, default, compare)], kind in required | default | factory; required ones first."""
    names = draw(_names)
    n_required = draw(st.integers(0, len(names)))
    spec = []
    for i, name in enumerate(names):
        kind = "required" if i < n_required else draw(st.sampled_from(["default", "factory"]))
        spec.append((name, kind, draw(_values), draw(st.booleans())))
    return spec


def _pair(spec, frozen=True):
    """The same class made by dataclasses and by record."""
    def body(mod):
        ns = {"__annotations__": {}}
        for name, kind, default, compare in spec:
            ns["__annotations__"][name] = "object"
            if kind == "default":
                ns[name] = mod.field(default=default, compare=compare) if not compare else default
            elif kind == "factory":
                ns[name] = mod.field(default_factory=lambda d=default: (d,), compare=compare)
            elif not compare:
                ns[name] = mod.field(compare=False)
        return ns

    dc = dataclasses.dataclass(frozen=frozen)(type("Thing", (), body(dataclasses)))
    rc = rec.record(frozen=frozen)(type("Thing", (), body(rec)))
    return dc, rc


def _outcome(fn):
    try:
        return ("ok", fn())
    except (TypeError, ValueError) as e:
        return (type(e).__name__, str(e))


@settings(max_examples=150, deadline=None)
@given(_specs(), st.data())
def test_construction_repr_eq_hash_agree_with_dataclasses(spec, data):
    dc, rc = _pair(spec)
    args = data.draw(st.lists(_values, max_size=len(spec) + 1))
    kw_names = data.draw(st.lists(st.sampled_from([s[0] for s in spec] + ["zz_unknown"]), unique=True, max_size=3))
    kwargs = {k: data.draw(_values) for k in kw_names}
    d = _outcome(lambda: dc(*args, **kwargs))
    r = _outcome(lambda: rc(*args, **kwargs))
    assert d[0] == r[0], (d, r)
    if d[0] != "ok":
        assert d[1] == r[1]  # the same message, word for word
        return
    d, r = d[1], r[1]
    assert repr(d) == repr(r)
    assert [f.name for f in dataclasses.fields(d)] == [f.name for f in rec.fields(r)]
    assert dataclasses.asdict(d) == rec.asdict(r)
    # a second instance, equal or not, by changing one field
    if spec:
        name = data.draw(st.sampled_from([s[0] for s in spec]))
        value = data.draw(_values)
        d2, r2 = dataclasses.replace(d, **{name: value}), rec.replace(r, **{name: value})
        assert repr(d2) == repr(r2)
        assert (d == d2) == (r == r2)
        assert (d != d2) == (r != r2)
        if d == d2:
            assert hash(r) == hash(r2)
    assert (d == object()) == (r == object()) is False
    assert hash(r) == hash(rec.replace(r))


@settings(max_examples=60, deadline=None)
@given(_specs())
def test_frozen_and_mutable_agree_with_dataclasses(spec):
    for frozen in (True, False):
        dc, rc = _pair(spec, frozen=frozen)
        if any(kind == "required" for _, kind, _, _ in spec):
            continue
        d, r = dc(), rc()
        for obj in (d, r):
            if frozen:
                with pytest.raises(AttributeError) as e:
                    obj.x_new = 1
                assert "cannot assign to field 'x_new'" in str(e.value)
                with pytest.raises(AttributeError):
                    del obj.x_new
            else:
                obj.x_new = 1
                assert obj.x_new == 1
        assert (type(r).__hash__ is None) == (type(d).__hash__ is None)


def test_frozen_error_is_an_attribute_error_of_its_own():
    @rec.record
    class P:
        a: int

    with pytest.raises(rec.FrozenInstanceError):
        P(1).a = 2


def test_class_body_rules_agree_with_dataclasses():
    for mod in (dataclasses, rec):
        deco = mod.dataclass if mod is dataclasses else mod.record
        with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
            deco(type("Bad", (), {"__annotations__": {"a": "int", "b": "int"}, "a": 1}))
        with pytest.raises(ValueError, match="mutable default <class 'list'> for field a is not allowed"):
            deco(type("Bad", (), {"__annotations__": {"a": "list"}, "a": []}))
        with pytest.raises(ValueError, match="cannot specify both default and default_factory"):
            mod.field(default=1, default_factory=list)


def test_post_init_runs_after_fields_and_may_normalise():
    @rec.record
    class Line:
        text: str

        def __post_init__(self):
            object.__setattr__(self, "text", self.text.replace("\n", " "))

    assert Line("a\nb").text == "a b"
    assert rec.replace(Line("x"), text="c\nd").text == "c d"


def test_inherited_fields_come_first():
    @rec.record
    class Base:
        a: int

    @rec.record
    class Child(Base):
        b: int = 2

    assert repr(Child(1)) == "test_inherited_fields_come_first.<locals>.Child(a=1, b=2)"
    assert [f.name for f in rec.fields(Child)] == ["a", "b"]


def test_asdict_recurses_like_dataclasses():
    @rec.record
    class Inner:
        x: int

    @rec.record
    class Outer:
        items: tuple
        by_name: dict
        one: Inner

    o = Outer((Inner(1), Inner(2)), {"k": [Inner(3)]}, Inner(4))
    assert rec.asdict(o) == {"items": ({"x": 1}, {"x": 2}), "by_name": {"k": [{"x": 3}]}, "one": {"x": 4}}
    with pytest.raises(TypeError):
        rec.asdict(Outer)
    with pytest.raises(TypeError):
        rec.fields(object())
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        rec.replace(Inner(1), nope=2)


def test_the_package_imports_no_dataclasses():
    """The point of records (start-up time): nothing in pyxis_hook pulls in dataclasses or inspect."""
    code = ("import sys, os, importlib, pyxis_hook\n"  # not pkgutil: it imports inspect
            "top = pyxis_hook.__path__[0]\n"
            "for d, subdirs, files in sorted(os.walk(top)):\n"  # every subpackage, however deep
            "    sub = os.path.relpath(d, top).replace(os.sep, '.').strip('.')\n"
            "    for n in sorted(files):\n"
            "        if n.endswith('.py') and n != '__main__.py':\n"
            "            importlib.import_module('.'.join(filter(None, ['pyxis_hook', sub, n[:-3]])))\n"
            "print(len(sys.modules), sorted(n for n in ('dataclasses', 'inspect') if n in sys.modules))\n")
    r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True)
    count, found = r.stdout.split(" ", 1)
    assert int(count) > 100  # the package was imported
    assert found.strip() == "[]"


def test_methods_the_class_defines_are_kept_as_dataclasses_keep_them():
    for mod in (dataclasses, rec):
        deco = dataclasses.dataclass(frozen=True) if mod is dataclasses else rec.record

        class P:
            a: int = 0

            def __repr__(self):
                return "mine"

            def __eq__(self, other):
                return True

            def __hash__(self):
                return 7

        P.__annotations__ = {"a": "int"}
        P = deco(P)
        assert (repr(P(1)), P(1) == P(2), hash(P(3))) == ("mine", True, 7), mod
        with pytest.raises(TypeError, match="Cannot overwrite attribute __setattr__"):
            deco(type("Q", (), {"__annotations__": {"a": "int"}, "__setattr__": lambda self, n, v: None}))


def test_fields_of_a_lazily_annotated_class_python_314_keeps_without_the_future_import():
    """Python >= 3.14 stores a class body's annotations as `__annotate_func__` (PEP 649/749) unless the
    module has `from __future__ import annotations`: its fields are found all the same, in order."""
    def annotate(fmt):
        if fmt != 1:  # what the compiler generates: VALUE only
            raise NotImplementedError
        return {"b": int, "a": str}

    Lazy = rec.record(type("Lazy", (), {"__annotate_func__": annotate, "a": "x"}))
    assert [f.name for f in rec.fields(Lazy)] == ["b", "a"]
    assert Lazy(1) == Lazy(b=1, a="x")
    assert repr(Lazy(2, "y")) == "Lazy(b=2, a='y')"
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        Lazy(1, c=2)


@pytest.mark.skipif(sys.version_info < (3, 14), reason="lazy annotations are Python >= 3.14's")
def test_a_class_compiled_without_the_future_import_on_python_314():
    ns: dict = {}
    exec(compile("class Late:\n    a: int\n    b: 'Later' = 2\n", "<late>", "exec", dont_inherit=True), ns)
    Late = rec.record(ns["Late"])
    assert [f.name for f in rec.fields(Late)] == ["a", "b"] and Late(1).b == 2


def test_records_share_their_methods_and_each_class_keeps_its_fields():
    """One `__init__`/`__repr__`/`__eq__`/`__hash__` for every record: nothing is made per class but its shape."""

    @rec.record
    class P:
        a: int
        b: str = "x"

    @rec.record
    class Q:
        c: tuple = ()

    class Plain(P):  # not a record itself: P's fields, as a dataclass subclass without the decorator
        pass

    @rec.record
    class Wider(P):
        c: int = 3

    assert all(getattr(P, m) is getattr(Q, m) for m in ("__init__", "__repr__", "__eq__", "__hash__"))
    def shown(obj) -> str:
        return repr(obj).rpartition(".")[2]  # the class's own name: these are local classes

    assert shown(P(1)) == "P(a=1, b='x')" and shown(Q()) == "Q(c=())"
    assert shown(Plain(2, "y")) == "Plain(a=2, b='y')" and Plain(2) != P(2)
    assert shown(Wider(1)) == "Wider(a=1, b='x', c=3)" and hash(Wider(1)) == hash((1, "x", 3))
    owner = r"\.P\." if sys.version_info >= (3, 10) else "^"  # CPython names the class from 3.10, as the record does
    with pytest.raises(TypeError, match=rf"{owner}__init__\(\) missing 1 required positional argument: 'a'$"):
        Plain()


def test_init_called_again_starts_from_nothing_as_dataclasses_does():
    """A mutable record's `__init__` called again sets every field anew: defaults back, errors as for a new one."""
    @rec.record(frozen=False)
    class Ours:
        a: int
        b: int = 2

    @dataclasses.dataclass
    class Theirs:
        a: int
        b: int = 2

    for cls in (Ours, Theirs):
        m = cls(1, 5)
        m.__init__(7)
        assert (m.a, m.b) == (7, 2)
        with pytest.raises(TypeError) as e:
            m.__init__(b=3)
        assert "missing 1 required positional argument: 'a'" in str(e.value)
