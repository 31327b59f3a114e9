"""Regular expressions compiled on first use: most of gpugate's are for
loading a file or parsing a tool's output, which the prolog's healthy path
never does, and compiling costs every run that imports the module."""

import re


class Lazy:
    """Behaves as re.compile(pattern, flags) (match, search, sub, ...)."""

    __slots__ = ("pattern", "flags", "_compiled")

    def __init__(self, pattern: str, flags: int = 0):
        self.pattern, self.flags, self._compiled = pattern, flags, None

    def __getattr__(self, name: str):
        if self._compiled is None:
            self._compiled = re.compile(self.pattern, self.flags)
        return getattr(self._compiled, name)
