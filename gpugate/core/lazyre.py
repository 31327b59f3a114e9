"""Regular expressions compiled on first use: most of gpugate's are for
loading a file or parsing a tool's output, which the prolog's healthy path
never does.  Compiling costs every run that imports the module, and so does
``import re`` itself (with enum and functools, about 4 ms): re is imported
only when a pattern is first used."""

# re's flag values (fixed by its _constants since Python 2; a test compares
# them with re's), so that a module can name them without importing re.
IGNORECASE = 2
ASCII = 256


class Lazy:
    """Behaves as re.compile(pattern, flags) (match, search, sub, ...)."""

    __slots__ = ("pattern", "flags", "_compiled")

    def __init__(self, pattern: str, flags: int = 0):
        self.pattern, self.flags, self._compiled = pattern, flags, None

    def __getattr__(self, name: str):
        if self._compiled is None:
            import re

            self._compiled = re.compile(self.pattern, self.flags)
        return getattr(self._compiled, name)
