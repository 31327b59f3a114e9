"""gpugate.core.jsontext (the prolog's JSON without the json package) and the
regex-free readers of the hot path give what json and re give."""

import json
import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpugate.core import jsontext
from gpugate.core import lazyre
from gpugate.core.names import is_node_name
from gpugate.parsers.kernlog import kmsg_record

_KEYS = st.text(max_size=8)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4), max_leaves=25)


def _same(a, b):
    """Equal, NaN included (NaN != NaN)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@given(st.dictionaries(_KEYS, _VALUES, max_size=6) | st.lists(_VALUES, max_size=6),
       st.booleans(), st.sampled_from([None, (",", ":"), (", ", ": ")]))
def test_dumps_writes_what_json_writes(value, sort_keys, separators):
    assert jsontext.dumps(value, sort_keys=sort_keys, separators=separators) == json.dumps(
        value, sort_keys=sort_keys, separators=separators)


@given(st.dictionaries(_KEYS, _VALUES, max_size=6), st.sampled_from([" ", "\n", "\t \r\n", ""]))
def test_loads_reads_what_json_reads(value, pad):
    text = pad + json.dumps(value) + pad
    assert _same(jsontext.loads(text), json.loads(text))
    assert _same(jsontext.loads(text.encode()), value)


@given(st.text(max_size=40))
def test_loads_refuses_what_json_refuses(text):
    try:
        expected = json.loads(text)
    except ValueError:
        with pytest.raises(ValueError):
            jsontext.loads(text)
        return
    assert _same(jsontext.loads(text), expected)


@pytest.mark.parametrize("text", ["", " ", "{", '{"a": 1} x', "[1,]", "nul", '{"a": 01}', "\ufeff{}", '"\\x"'])
def test_loads_errors_are_jsons_own(text):
    with pytest.raises(ValueError) as ours:
        jsontext.loads(text)
    with pytest.raises(ValueError) as theirs:
        json.loads(text)
    assert str(ours.value) == str(theirs.value)


def test_dumps_default_circular_and_special_floats_as_json():
    class Odd:
        def __str__(self):
            return "odd!"

    assert jsontext.dumps({"x": Odd()}, default=str) == json.dumps({"x": Odd()}, default=str)
    with pytest.raises(TypeError):
        jsontext.dumps({"x": Odd()})
    loop = []
    loop.append(loop)
    with pytest.raises(ValueError):
        jsontext.dumps([loop])
    text = jsontext.dumps([math.inf, -math.inf, math.nan, 1e300, 0.1, -0.0])
    assert text == json.dumps([math.inf, -math.inf, math.nan, 1e300, 0.1, -0.0])
    assert jsontext.dumps({1: 2, True: 3, None: 4}) == json.dumps({1: 2, True: 3, None: 4})


def test_the_flag_values_are_res():
    assert lazyre.IGNORECASE == re.IGNORECASE and lazyre.ASCII == re.ASCII


_KMSG = re.compile(r"^([0-9]{1,10}),([0-9]{1,20}),([0-9]{1,20}),[^;]*;(.*)$")
_KMSG_PARTS = st.lists(st.sampled_from(["6", "12345678901", "0", "", "a", ",", ";", "-", "c", "\n", " ",
                                        "NVRM: Xid (PCI:0000:38:00): 79", "9" * 21, "٣"]), max_size=10)


@given(_KMSG_PARTS.map("".join) | st.text(max_size=30))
def test_kmsg_records_read_as_the_regular_expression_reads_them(line):
    match = _KMSG.match(line)
    assert kmsg_record(line) == (match.groups() if match else None)


@pytest.mark.parametrize("line,want", [
    ("6,1234,5678901,-;NVRM: Xid (PCI:0000:38:00): 79, pid=1", ("6", "1234", "5678901", "NVRM: Xid (PCI:0000:38:00): 79, pid=1")),
    ("4,7,8,-,caller=T1;text;with;semicolons", ("4", "7", "8", "text;with;semicolons")),
    (" SUBSYSTEM=pci", None), ("6,12,34;no flags field", None), ("6,x,34,-;m", None), ("", None),
])
def test_kmsg_record_examples(line, want):
    assert kmsg_record(line) == want


_NODE_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,62})(?:\.[A-Za-z0-9_][A-Za-z0-9_-]{0,62})*\Z")


@given(st.lists(st.sampled_from(["gpu", "01", "-", "_", ".", "a" * 63, "b" * 64, "..", "/", " ", "é", "\n", "[1-2]",
                                 "K", "ı"]), max_size=8).map("".join) | st.text(max_size=20))
def test_node_names_are_checked_as_the_pattern_checks_them(name):
    want = len(name) <= 253 and bool(_NODE_NAME.match(name))
    assert is_node_name(name) is want


def test_errors_are_jsons_own_in_a_process_that_never_loaded_json():
    """_json raises its errors through json.decoder when it is loaded (and
    a SystemError when not): jsontext lets json say what is wrong."""
    import subprocess
    import sys

    code = ("import sys; from gpugate.core import jsontext; assert 'json' not in sys.modules; "
            "ok = jsontext.loads(' {\"a\": [1, 2.5, null, true]} '); assert 'json' not in sys.modules, 'loaded'; "
            "out = jsontext.dumps(ok, sort_keys=True, separators=(',', ':')); assert 'json' not in sys.modules; "
            "errors = []\n"
            "for text in ('{not json', '[1,', '', '{} x'):\n"
            "    try:\n        jsontext.loads(text)\n    except ValueError as exc:\n"
            "        errors.append(type(exc).__name__ + ': ' + str(exc))\n"
            "print(out); print('|'.join(errors))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first == '{"a":[1,2.5,null,true]}'
    assert second.split("|") == [
        "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        "JSONDecodeError: Expecting value: line 1 column 4 (char 3)",
        "JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
        "JSONDecodeError: Extra data: line 1 column 4 (char 3)"]


# -- loads_bounded: what a node answers the controller (issue 33, item 5) --

def _depth(value) -> int:
    """The nesting json.dumps writes for the value, counted without recursion."""
    deepest, todo = 0, [(value, 0)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, (list, dict)):
            level += 1
            todo += [(v, level) for v in (item.values() if isinstance(item, dict) else item)]
        deepest = max(deepest, level)
    return deepest


def _longest_number(text: str) -> int:
    return max((len(m) for m in re.findall(r"-?[0-9][0-9.eE+-]*", re.sub(r'"(?:[^"\\]|\\.)*"', '""', text))),
               default=0)


_DEEP = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(
    alphabet='[]{}"\\,:ab', max_size=6), lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(alphabet='[]{}"\\a', max_size=3), inner, max_size=3), max_leaves=40)


@given(_DEEP, st.integers(min_value=1, max_value=8), st.integers(min_value=1, max_value=30))
def test_loads_bounded_reads_json_within_its_limits_and_refuses_beyond(value, max_depth, max_number):
    text = json.dumps(value)
    assert jsontext.nesting(text) == _depth(value)
    within = _depth(value) <= max_depth and _longest_number(text) <= max_number
    try:
        got = jsontext.loads_bounded(text, max_depth=max_depth, max_number=max_number)
    except ValueError:
        assert not within
        return
    assert within and _same(got, value)


_ODD = st.lists(st.sampled_from(['[', ']', '{', '}', '"', '\\', ',', ':', '1', '-', 'e', '.', ' ', 'a', 'null',
                                 '"a":', '"\\"', '1' * 40, 'NaN', '\ud800', '\x00', '[[[[[[[[', ']]]]]]]]']),
                max_size=40).map("".join) | st.text(max_size=40)


@given(_ODD, st.integers(min_value=0, max_value=6), st.sampled_from([None, dict, list]))
def test_loads_bounded_returns_a_value_within_its_limits_or_raises_valueerror_only(text, max_depth, expect):
    try:
        got = jsontext.loads_bounded(text, max_depth=max_depth, max_number=30, expect=expect)
    except ValueError:  # the one documented error: never RecursionError, TypeError, ...
        return
    assert _depth(got) <= max_depth and (expect is None or isinstance(got, expect))
    assert _same(got, json.loads(text))


@pytest.mark.parametrize("text", [
    "[" * 100000 + "]" * 100000,
    '{"a":' * 100000 + "1" + "}" * 100000,
    '{"node": "gpu1", "fit": true, "x": ' + "[" * 100000,  # not even closed
])
def test_a_100000_deep_answer_is_a_valueerror_not_a_recursionerror(text):
    with pytest.raises(ValueError, match="nested 10000[01] levels deep"):
        jsontext.loads_bounded(text)


@pytest.mark.parametrize("text,what", [
    ("[" + "9" * 100000 + "]", "a number of 100000 characters"),
    ('{"a": 1}' + " " * 100, "of 108 characters"),
    ('[1, 2]', "list where dict was expected"),
    (b'{"a": "\xff"}', "can't decode"),
    ('"\\"\\"\\"', "Unterminated string"),
])
def test_loads_bounded_says_which_limit(text, what):
    with pytest.raises(ValueError, match=re.escape(what)):
        jsontext.loads_bounded(text, max_chars=200000 if len(text) > 1000 else 100, expect=dict)


def test_loads_bounded_refuses_a_flood_of_brackets_before_it_counts_their_depth():
    text = "[]" * (jsontext.MAX_BRACKETS // 2 + 1)
    with pytest.raises(ValueError, match="brackets"):
        jsontext.loads_bounded(text)
    assert jsontext.loads_bounded("[" + "[]," * 1000 + "[]]") == [[]] * 1001
