"""Loading pynvml without the standard modules it imports but barely uses.

The prolog's NVML reader loads pynvml on its critical path, before every
job.  pynvml imports four modules for one name each: ``ctypes.util`` for
find_library, which it never calls (it opens libnvidia-ml.so.1 by name),
and which loads subprocess, shutil and tempfile (about 6 ms); ``string``
for capwords, which it calls while naming its error classes, and which
loads re and enum (about 3 ms); ``functools`` for wraps, which it applies
to some 30 functions at import, and which loads collections (about 2 ms);
and ``threading`` for one Lock, made at import (about 0.6 ms).  While
pynvml loads, each is a stand-in module: capwords is CPython's own one-line
definition; wraps is functools.update_wrapper as CPython defines it, with
the attributes this Python's copies (only on the releases whose list is
known: elsewhere the real functools); Lock is the ``_thread.allocate_lock``
that threading's Lock makes its locks with; any other attribute loads the
real module and answers from it.  Afterwards the
stand-ins are gone from sys.modules: an import gets the real modules.  Any
failure with the stand-ins (a pynvml that uses more of them at import)
falls back to a plain import.  No gpugate imports: the reader is forked
before gpugate's records are defined.
"""

import sys

# functools.WRAPPER_ASSIGNMENTS of each release (a test compares it with
# the running interpreter's); a release not listed gets the real functools.
_WRAPPER_ASSIGNMENTS = {
    (3, 9): ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__"),
    (3, 10): ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__"),
    (3, 11): ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__"),
    (3, 12): ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__", "__type_params__"),
    (3, 13): ("__module__", "__name__", "__qualname__", "__doc__", "__annotations__", "__type_params__"),
    (3, 14): ("__module__", "__name__", "__qualname__", "__doc__", "__annotate__", "__type_params__"),
}
_STAND_INS = ("ctypes.util", "string", "threading") + (
    ("functools",) if sys.version_info[:2] in _WRAPPER_ASSIGNMENTS else ())


def import_pynvml():
    """The real binding: the only import of it in gpugate."""
    if "pynvml" in sys.modules:
        return sys.modules["pynvml"]
    installed = {}
    for name in _STAND_INS:
        if name not in sys.modules:
            installed[name] = sys.modules[name] = _stand_in(name)
    try:
        import pynvml
    except Exception:
        _remove(installed)
        sys.modules.pop("pynvml", None)
        import pynvml  # the plain way: the real modules, and its own error if any
    finally:
        _remove(installed)
    return pynvml


def _remove(installed: dict) -> None:
    for name, module in installed.items():
        if sys.modules.get(name) is module:
            del sys.modules[name]
        parent, _, child = name.rpartition(".")
        if parent and getattr(sys.modules.get(parent), child, None) is module:
            delattr(sys.modules[parent], child)


def _stand_in(name: str):
    module = type(sys)(name, "gpugate.vendors.nvidia.pynvml_loader's stand-in for %s while pynvml loads" % name)

    def __getattr__(attr):
        if attr.startswith("__"):  # the import system asks for __path__ etc.: a plain module has none
            raise AttributeError(attr)
        return getattr(_real(name, module), attr)

    module.__getattr__ = __getattr__
    if name == "string":
        module.capwords = _capwords
    elif name == "functools":
        module.wraps = _wraps
    elif name == "threading":
        import _thread

        module.Lock = _thread.allocate_lock  # the lock threading.Lock() returns, of the same type
    else:  # pynvml takes it at import and never calls it; a call loads the real one
        module.find_library = lambda lib: _real(name, module).find_library(lib)
    return module


def _real(name: str, stand_in):
    """The real module (imported once the stand-in is out of the way)."""
    import importlib

    if sys.modules.get(name) is stand_in:
        del sys.modules[name]
    return importlib.import_module(name)


def _wraps(wrapped):
    """functools.wraps(wrapped) with its default lists, as CPython defines it."""
    def decorate(wrapper):
        for attr in _WRAPPER_ASSIGNMENTS[sys.version_info[:2]]:
            try:
                value = getattr(wrapped, attr)
            except AttributeError:
                pass
            else:
                setattr(wrapper, attr, value)
        wrapper.__dict__.update(getattr(wrapped, "__dict__", {}))  # WRAPPER_UPDATES
        wrapper.__wrapped__ = wrapped
        return wrapper
    return decorate


def _capwords(s, sep=None):
    # string.capwords as CPython defines it (3.9 to 3.14).
    return (sep or " ").join(map(str.capitalize, s.split(sep)))
