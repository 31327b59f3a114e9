"""How deep a TOML document nests, found without parsing it.

tomllib and tomli parse arrays and inline tables by recursion: a file of
100,000 '[' reaches the interpreter's recursion limit, and on Python 3.9 a
RecursionError raised that deep can abort the interpreter ("Cannot recover
from stack overflow") instead of reaching our except clause.  A file
gpugate reads must give a clear error, never a crash: so its nesting is
measured first, by a linear scan, and a file nested deeper than any real
baseline or configuration is refused before the parser sees it.  What the
parse builds is measured too (dotted keys nest without brackets)."""
import re
from typing import Any

# A real baseline nests [nodes."gpu[01-04]".pin] (3) with an array or inline
# table in it: 4 or 5.  Far above that, far below any recursion limit.
MAX_DEPTH = 32

_BORING = re.compile(r"[^\[\]{}\"'#]+")


def bracket_depth(text: str, stop_above: int = MAX_DEPTH) -> int:
    """The deepest nesting of '[' and '{' outside strings and comments,
    counted up to stop_above + 1 (a file past the limit is not scanned on).
    Unbalanced or invalid text gets a number too: the parser judges it."""
    depth = deepest = 0
    i, n = 0, len(text)
    while i < n:
        boring = _BORING.match(text, i)
        if boring:
            i = boring.end()
            continue
        c = text[i]
        if c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > stop_above:
                    return deepest
            i += 1
        elif c in "]}":
            depth = max(0, depth - 1)
            i += 1
        elif c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
        elif text.startswith(c * 3, i):
            i = _string_end(text, i + 3, c * 3, escapes=(c == '"'))
        else:
            i = _string_end(text, i + 1, c, escapes=(c == '"'))
    return deepest


def _string_end(text: str, i: int, close: str, escapes: bool) -> int:
    """Where a string that opened before i ends: just past its closing
    quote, or the end of text if it never closes.  A single-line string
    also ends at its line's end, as TOML has it.  Linear: each search
    starts where the last one ended."""
    n = len(text)
    single_line = len(close) == 1
    while True:
        end = text.find(close, i)
        if single_line:
            newline = text.find("\n", i, n if end < 0 else end)
            if newline >= 0:
                return newline + 1
        if end < 0:
            return n
        if escapes and _escaped(text, end):
            i = end + 1
            continue
        if single_line:
            return end + 1
        # A multi-line string may end in one or two quotes of its own
        # ('"""a""""' is 'a"'): its delimiter is the last three of the run.
        run = 3
        while end + run < n and text[end + run] == close[0] and run < 5:
            run += 1
        return end + run


def _escaped(text: str, at: int) -> bool:
    """Whether the quote at `at` follows an odd run of backslashes."""
    run = 0
    while at - run - 1 >= 0 and text[at - run - 1] == "\\":
        run += 1
    return run % 2 == 1


def value_depth(value: Any, stop_above: int = MAX_DEPTH) -> int:
    """How deep a parsed document nests (tables and arrays), without
    recursion; counted up to stop_above + 1."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > stop_above:
                return deepest
        stack.extend((child, depth) for child in children)
    return deepest
