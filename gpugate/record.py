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


def _build(cls, frozen: bool):
    for base in cls.__mro__[1:]:
        if hasattr(base, _FIELDS):
            raise TypeError("%s: records do not inherit from records" % cls.__name__)
    if "__post_init__" in cls.__dict__:
        raise TypeError("%s: records have no __post_init__" % cls.__name__)
    found = []
    for name, kind in cls.__dict__.get("__annotations__", {}).items():
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
    # One exec per class (as dataclasses does): a generated __init__ runs as
    # fast as a hand-written one, and records are made by the thousand.
    names = [f.name for f in found]
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
    src = "def __init__(self%s):\n%s\n" % ("".join(", " + p for p in params), "\n".join(body) or "  pass")
    exec(src, env)
    methods = {"__init__": env["__init__"], "__repr__": _repr, "__eq__": _eq}
    if frozen:
        methods.update(__hash__=_hash, __setattr__=_frozen_setattr, __delattr__=_frozen_delattr)
    else:
        methods["__hash__"] = None  # equal by value and mutable: unhashable, as a dataclass
    for name, method in methods.items():
        if name in cls.__dict__:
            continue  # the class's own wins, as with dataclasses
        if method is not None and name == "__init__":
            method.__qualname__ = "%s.%s" % (cls.__qualname__, name)
        setattr(cls, name, method)
    cls.__match_args__ = tuple(names)
    return cls


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
