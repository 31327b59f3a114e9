"""Records: the part of the standard library's dataclasses gpugate uses,
without its import cost.

`import dataclasses` loads inspect (and with it ast, dis, tokenize, enum):
about 11 ms of a 9 ms interpreter start, paid by every prolog before every
job, and building each class costs more than here.  gpugate's records are
plain: fields from the class annotations in order, defaults or
``field(default_factory=...)``, ``frozen=True`` or not, no inheritance
between records, no ClassVar, no __post_init__ (``dataclass`` refuses what
it does not support rather than half-supporting it).  Same names as
dataclasses: ``dataclass``, ``field``, ``fields``, ``replace``, ``asdict``,
``is_dataclass``; instances compare, hash (frozen), print, pickle and copy
like a dataclass's.
"""

from _thread import get_ident
from keyword import iskeyword

_MISSING = object()
_FIELDS = "__record_fields__"


class FrozenInstanceError(AttributeError):
    pass


class Field:
    __slots__ = ("name", "type", "default", "default_factory")

    def __init__(self, default=_MISSING, default_factory=_MISSING):
        if default is not _MISSING and default_factory is not _MISSING:
            raise ValueError("cannot specify both default and default_factory")
        self.name = None
        self.type = None
        self.default = default
        self.default_factory = default_factory

    def __repr__(self):
        return "Field(name=%r)" % self.name


def field(*, default=_MISSING, default_factory=_MISSING):
    return Field(default, default_factory)


def dataclass(cls=None, *, frozen=False):
    """@dataclass or @dataclass(frozen=True)."""
    if cls is None:
        return lambda c: _build(c, frozen)
    return _build(cls, frozen)


def is_dataclass(obj) -> bool:
    return hasattr(obj if isinstance(obj, type) else type(obj), _FIELDS)


def fields(obj) -> tuple:
    try:
        return getattr(obj, _FIELDS)
    except AttributeError:
        raise TypeError("must be called with a record type or instance") from None


def replace(obj, **changes):
    for f in fields(obj):
        if f.name not in changes:
            changes[f.name] = getattr(obj, f.name)
    return type(obj)(**changes)


def asdict(obj) -> dict:
    if not is_dataclass(obj) or isinstance(obj, type):
        raise TypeError("asdict() should be called on record instances")
    return _asdict(obj)


def _asdict(value):
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _asdict(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*[_asdict(v) for v in value])
    if isinstance(value, (list, tuple)):
        return type(value)(_asdict(v) for v in value)
    if isinstance(value, dict):
        return type(value)((_asdict(k), _asdict(v)) for k, v in value.items())
    return value


def _annotations(cls) -> dict:
    """The class's own annotations, in order: from its namespace, or, on
    Python 3.14+ where a module without `from __future__ import annotations`
    has them evaluated lazily, from annotationlib (a name not defined at run
    time, e.g. one imported for type checking only, is a forward reference)."""
    own = cls.__dict__.get("__annotations__")
    if own is not None:
        return own
    try:
        import annotationlib
    except ImportError:  # before 3.14 every annotated class has __annotations__
        return {}
    return annotationlib.get_annotations(cls, format=annotationlib.Format.FORWARDREF)


def _build(cls, frozen: bool):
    for base in cls.__mro__[1:]:
        if hasattr(base, _FIELDS):
            raise TypeError("%s: records do not inherit from records" % cls.__name__)
    if "__post_init__" in cls.__dict__:
        raise TypeError("%s: records have no __post_init__" % cls.__name__)
    found = []
    for name, kind in _annotations(cls).items():
        if not name.isidentifier() or iskeyword(name):
            raise TypeError("%s: field name %r is not an identifier" % (cls.__name__, name))
        if "ClassVar" in str(kind):
            raise TypeError("%s.%s: records have no ClassVar" % (cls.__name__, name))
        value = cls.__dict__.get(name, _MISSING)
        f = value if isinstance(value, Field) else Field(default=value)
        f.name, f.type = name, kind
        if isinstance(value, Field):
            if f.default is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
        elif isinstance(value, (list, dict, set)):
            raise ValueError("%s.%s: mutable default %s: use field(default_factory=...)"
                             % (cls.__name__, name, type(value).__name__))
        found.append(f)
    seen_default = False
    for f in found:
        has_default = f.default is not _MISSING or f.default_factory is not _MISSING
        if seen_default and not has_default:
            raise TypeError("%s: non-default field %r follows a default field" % (cls.__name__, f.name))
        seen_default = seen_default or has_default
    setattr(cls, _FIELDS, tuple(found))
    methods = {"__init__": _first_init(cls, tuple(found), frozen), "__repr__": _repr, "__eq__": _eq}
    if frozen:
        methods.update(__hash__=_hash, __setattr__=_frozen_setattr, __delattr__=_frozen_delattr)
    else:
        methods["__hash__"] = None  # equal by value and mutable: unhashable, as a dataclass
    for name, method in methods.items():
        if name in cls.__dict__:
            continue  # the class's own wins, as with dataclasses
        if name == "__init__":
            method.__qualname__ = "%s.%s" % (cls.__qualname__, name)
        setattr(cls, name, method)
    cls.__match_args__ = tuple(f.name for f in found)
    return cls


# A record's first few instances are made by a generic __init__; the
# compiled one (one exec, as dataclasses does: as fast as a hand-written
# __init__) replaces it once a record is made more often.  Compiling every
# record's __init__ when its module loads costs about 0.2 ms a record,
# milliseconds of every prolog, which makes each record a few times at most.
COMPILE_AFTER = 16


def _first_init(cls, found: tuple, frozen: bool):
    names = tuple(f.name for f in found)
    index = {name: i for i, name in enumerate(names)}
    calls = [0]

    def __init__(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] == COMPILE_AFTER and cls.__dict__.get("__init__") is __init__:
            cls.__init__ = _compiled_init(cls, found, frozen)
        if len(args) > len(names):
            raise TypeError("%s() takes %d positional arguments but %d were given"
                            % (cls.__qualname__, len(names) + 1, len(args) + 1))
        values = list(args) + [_MISSING] * (len(names) - len(args))
        for key, value in kwargs.items():
            at = index.get(key)
            if at is None:
                raise TypeError("%s() got an unexpected keyword argument %r" % (cls.__qualname__, key))
            if at < len(args):
                raise TypeError("%s() got multiple values for argument %r" % (cls.__qualname__, key))
            values[at] = value
        into = self.__dict__  # frozen or not: no __setattr__, as object.__setattr__ would
        for f, value in zip(found, values):
            if value is _MISSING:
                if f.default_factory is not _MISSING:
                    value = f.default_factory()
                elif f.default is not _MISSING:
                    value = f.default
                else:
                    raise TypeError("%s() missing required argument: %r" % (cls.__qualname__, f.name))
            into[f.name] = value

    return __init__


def _compiled_init(cls, found: tuple, frozen: bool):
    env = {"_MISSING": _MISSING, "_set": object.__setattr__}
    params, body = [], []
    for f in found:
        key = "_dflt_" + f.name
        if f.default_factory is not _MISSING:
            env[key] = f.default_factory
            params.append("%s=_MISSING" % f.name)
            value = "%s() if %s is _MISSING else %s" % (key, f.name, f.name)
        elif f.default is not _MISSING:
            env[key] = f.default
            params.append("%s=%s" % (f.name, key))
            value = f.name
        else:
            params.append(f.name)
            value = f.name
        body.append("  _set(self, %r, %s)" % (f.name, value) if frozen else "  self.%s = %s" % (f.name, value))
    exec("def __init__(self%s):\n%s\n" % ("".join(", " + p for p in params), "\n".join(body) or "  pass"), env)
    env["__init__"].__qualname__ = "%s.__init__" % cls.__qualname__
    return env["__init__"]


def _values(self) -> tuple:
    return tuple(getattr(self, f.name) for f in getattr(self, _FIELDS))


_repr_running = set()


def _repr(self) -> str:
    key = (id(self), get_ident())
    if key in _repr_running:
        return "..."
    _repr_running.add(key)
    try:
        return "%s(%s)" % (type(self).__qualname__, ", ".join(
            "%s=%r" % (f.name, getattr(self, f.name)) for f in getattr(self, _FIELDS)))
    finally:
        _repr_running.discard(key)


def _eq(self, other):
    if other.__class__ is self.__class__:
        return _values(self) == _values(other)
    return NotImplemented


def _hash(self) -> int:
    return hash(_values(self))


def _frozen_setattr(self, name, value):
    raise FrozenInstanceError("cannot assign to field %r" % name)


def _frozen_delattr(self, name):
    raise FrozenInstanceError("cannot delete field %r" % name)
