"""gpugate.core.record against the standard library's dataclasses: the same
class bodies built both ways behave alike (construction, defaults,
equality, hashing, repr, replace, asdict, frozen assignment, pickle, copy),
and what records do not support is refused when the class is defined."""

import copy
import dataclasses
import pickle
from typing import ClassVar, Dict, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.core import record

PROPS = settings(max_examples=200, deadline=None)


def _define(impl, frozen):
    """The same class body for each implementation, defined at module level
    (pickle finds classes by name)."""
    name = "Gpu_%s_%s" % (impl.__name__.split(".")[-1], "frozen" if frozen else "mutable")
    body = {"__doc__": "A record under test.", "__module__": __name__, "__qualname__": name,
            "__annotations__": {"index": int, "name": str, "memory": Optional[int], "links": Tuple[int, ...],
                                "errors": Dict[str, int], "xids": List[int]},
            "memory": None, "links": (), "errors": impl.field(default_factory=dict),
            "xids": impl.field(default_factory=list)}
    cls = impl.dataclass(type(name, (), body), frozen=frozen)
    globals()[name] = cls
    return cls


PAIRS = {frozen: (_define(dataclasses, frozen), _define(record, frozen)) for frozen in (True, False)}


def _pair(frozen):
    return PAIRS[frozen]


@dataclasses.dataclass(frozen=True)
class StdInner:
    """Nested."""
    code: int
    text: str = ""


@record.dataclass(frozen=True)
class Inner:
    """Nested."""
    code: int
    text: str = ""


@record.dataclass(frozen=True)
class Outer:
    """Holds records in every container asdict walks."""
    one: Inner
    many: Tuple[Inner, ...] = ()
    by_name: Dict[str, Inner] = record.field(default_factory=dict)


values = st.fixed_dictionaries({"index": st.integers(-5, 300), "name": st.text(max_size=8)},
                               optional={"memory": st.none() | st.integers(0, 1 << 40),
                                         "links": st.tuples(st.integers(0, 9), st.integers(0, 9)),
                                         "errors": st.dictionaries(st.text(max_size=4), st.integers(0, 99),
                                                                   max_size=3),
                                         "xids": st.lists(st.integers(0, 200), max_size=4)})


@PROPS
@given(values, values, st.booleans())
def test_behaves_as_a_dataclass(a, b, frozen):
    std, rec = _pair(frozen)
    sa, sb, ra, rb = std(**a), std(**b), rec(**a), rec(**b)
    assert (ra == rb) == (sa == sb)
    assert ra == rec(**a) and ra != sa  # equal by value, never to another class
    assert repr(ra).split("(", 1)[1] == repr(sa).split("(", 1)[1]
    assert record.asdict(ra) == dataclasses.asdict(sa)
    assert [f.name for f in record.fields(rec)] == [f.name for f in dataclasses.fields(std)]
    assert record.replace(ra, name="x") == rec(**dict(a, name="x"))
    assert record.is_dataclass(ra) and record.is_dataclass(rec) and not record.is_dataclass(sa)
    for made in (pickle.loads(pickle.dumps(ra)), copy.deepcopy(ra), copy.copy(ra)):
        assert made == ra and type(made) is rec
    if frozen:
        with pytest.raises(TypeError):
            hash(sa)  # a dict field: unhashable both ways
        with pytest.raises(TypeError):
            hash(ra)
        assert hash(Inner(a["index"], a["name"])) == hash(StdInner(a["index"], a["name"]))
        with pytest.raises(record.FrozenInstanceError):
            ra.name = "y"
        with pytest.raises(AttributeError):
            del ra.index
    else:
        ra.name = "y"
        assert ra.name == "y"
        with pytest.raises(TypeError):
            hash(ra)  # mutable and equal by value: unhashable, as a dataclass


def test_defaults_and_factories_are_per_instance():
    _, rec = _pair(True)
    a, b = rec(1, "a"), rec(2, "b")
    assert a.memory is None and a.links == () and a.errors == {} and a.errors is not b.errors
    with pytest.raises(TypeError):
        rec(1)  # a required field missing
    with pytest.raises(TypeError):
        rec(1, "a", nope=1)


def test_asdict_walks_records_in_containers_and_copies_them():
    std = StdInner(3, "x")
    out = Outer(Inner(1), (Inner(2, "b"),), {"k": Inner(3, "x")})
    as_dict = record.asdict(out)
    assert as_dict == {"one": {"code": 1, "text": ""}, "many": ({"code": 2, "text": "b"},),
                       "by_name": {"k": dataclasses.asdict(std)}}
    as_dict["by_name"]["k"]["code"] = 9
    assert out.by_name["k"].code == 3
    with pytest.raises(TypeError):
        record.asdict(Outer)


def test_what_records_do_not_support_is_refused_at_definition():
    class Base:
        x: int

    record.dataclass(Base)
    with pytest.raises(TypeError, match="inherit"):
        record.dataclass(type("Child", (Base,), {"__annotations__": {"y": int}}))
    with pytest.raises(TypeError, match="__post_init__"):
        record.dataclass(type("P", (), {"__annotations__": {"y": int}, "__post_init__": lambda self: None}))
    with pytest.raises(TypeError, match="ClassVar"):
        record.dataclass(type("C", (), {"__annotations__": {"y": ClassVar[int]}}))
    with pytest.raises(ValueError, match="default_factory"):
        record.dataclass(type("M", (), {"__annotations__": {"y": list}, "y": []}))
    with pytest.raises(TypeError, match="follows a default"):
        record.dataclass(type("O", (), {"__annotations__": {"y": int, "z": int}, "y": 1}))
    with pytest.raises(TypeError, match="identifier"):
        record.dataclass(type("I", (), {"__annotations__": {"a=1)\nimport os #": int}}))
    with pytest.raises(TypeError):
        record.fields(object())


def test_the_class_keeps_its_own_methods():
    @record.dataclass(frozen=True)
    class Named:
        """Own repr."""
        name: str

        def __repr__(self):
            return "<%s>" % self.name

    assert repr(Named("a")) == "<a>" and Named("a") == Named("a") and len({Named("a"), Named("a")}) == 1


NAMES = ("index", "name", "memory", "links", "errors", "xids")


@PROPS
@given(st.lists(st.integers(0, 9), max_size=8),
       st.dictionaries(st.sampled_from(NAMES + ("bogus",)), st.integers(0, 9), max_size=4), st.booleans())
def test_the_first_instances_are_made_as_the_compiled_init_makes_them(args, kwargs, frozen):
    """Records start with a generic __init__ and compile theirs after
    COMPILE_AFTER instances: both accept and refuse the same calls."""
    _, rec = _pair(frozen)
    generic = record._first_init(rec, record.fields(rec), frozen)
    compiled = record._compiled_init(rec, record.fields(rec), frozen)
    outcomes = []
    for init in (generic, compiled):
        made = object.__new__(rec)
        try:
            init(made, *args, **kwargs)
            outcomes.append(("made", record.asdict(made)))
        except TypeError:
            outcomes.append(("refused", None))
    assert outcomes[0] == outcomes[1]


def test_a_record_compiles_its_init_once_made_often():
    @record.dataclass(frozen=True)
    class Often:
        """Made many times."""
        a: int
        b: int = 2

    first = Often.__init__
    made = [Often(i) for i in range(record.COMPILE_AFTER + 2)]
    assert Often.__init__ is not first and Often.__init__.__qualname__.endswith("Often.__init__")
    assert made[0] == Often(0, 2) and made[-1].a == record.COMPILE_AFTER + 1
    with pytest.raises(TypeError):
        Often()
