"""Node states recorded from real Slurm releases (scripts/record-slurm-fixtures)
read by the parsers: what each node was put in, from every output form."""

import json
import os

import pytest

from gpugate.errors import ParseError
from gpugate.slurm.nodestate import parse_nodes_json, parse_nodes_text
from gpugate.core.record import replace
from gpugate.slurm.nodestate.records import parse_node_records
from gpugate.slurm.nodestate.show_text import parse_show_node

# The one-RPC read's answers (gpugate.slurm.libslurm): slurmctld sends no partitions.
ONE_RPC = "libslurm-show-node.json"

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "slurm")
RELEASES = sorted(d for d in os.listdir(FIXTURES) if os.path.isfile(os.path.join(FIXTURES, d, "expected.json")))


def load(release):
    with open(os.path.join(FIXTURES, release, "expected.json")) as handle:
        expected = json.load(handle)
    parsed = {}
    for name, how in expected["files"].items():
        with open(os.path.join(FIXTURES, release, name)) as handle:
            text = handle.read()
        if not how["read_by_gpugate"]:
            continue
        if name == "pyslurm-nodes.json":
            parsed[name] = parse_node_records(json.loads(text))
        elif name == ONE_RPC:
            texts = json.loads(text)
            parsed[name] = {n: parse_show_node(texts[n]["text"], texts[n]["oneline"], n) for n in expected["nodes"]}
        elif name.endswith(".json"):
            parsed[name] = parse_nodes_json(text)
        elif name == "sinfo-text.txt":
            parsed[name] = parse_nodes_text(text)
    return expected, parsed


def test_the_four_releases_are_recorded():
    assert {"22.05", "24.11", "25.11", "26.05"} <= set(RELEASES)


def test_pyslurms_records_are_recorded_where_it_is_built():
    expected, parsed = load("25.11")
    assert "pyslurm-nodes.json" in parsed and expected["files"]["pyslurm-nodes.json"]["read_by_gpugate"]


@pytest.mark.parametrize("release", RELEASES)
def test_version_file_names_the_release(release):
    with open(os.path.join(FIXTURES, release, "sinfo-version.txt")) as handle:
        assert handle.read().split()[-1].startswith(release + ".")


@pytest.mark.parametrize("release", RELEASES)
def test_every_form_reads_what_each_node_was_put_in(release):
    expected, parsed = load(release)
    # The forms gpugate reads on this release are all there: JSON and text.
    assert "sinfo-text.txt" in parsed and any(n.endswith(".json") for n in parsed)
    if release >= "23.02":
        assert "scontrol-show-node.json" in parsed
    if release == "25.11":
        assert "pyslurm-nodes.json" in parsed
    assert ONE_RPC in parsed
    for name, nodes in parsed.items():
        assert set(nodes) == set(expected["nodes"]), name
        for node, want in expected["nodes"].items():
            got = nodes[node]
            where = "%s %s (%s)" % (name, node, want["put"])
            assert got.state == want["state"], where
            assert got.flags == frozenset(want["flags"]), where
            assert got.reason == want["reason"], where
            assert got.comment == want.get("comment", ""), where
            assert got.partitions == (() if name == ONE_RPC else ("gpu",)), where
            if "reason_time" in want:
                low, high = want["reason_time"]
                assert got.reason_time is not None and low <= got.reason_time <= high, where
                assert got.reason_user == want["reason_user"], where
            else:
                # 23.02+ names a user even for no reason: only the time says "unset".
                assert got.reason_time is None, where


@pytest.mark.parametrize("release", RELEASES)
def test_grouped_sinfo_json_is_refused_not_misread(release):
    """23.02+ sinfo --json gives gpu02 and gpu03 (both idle+drain, different
    reasons) one entry with gpu02's reason: the parser must refuse it."""
    expected, _ = load(release)
    if expected["files"]["sinfo.json"]["read_by_gpugate"]:
        pytest.skip("22.05 sinfo --json is per node")
    with open(os.path.join(FIXTURES, release, "sinfo.json")) as handle:
        text = handle.read()
    with pytest.raises(ParseError, match="grouped"):
        parse_nodes_json(text)


@pytest.mark.parametrize("release", RELEASES)
def test_json_and_text_forms_agree(release):
    _, parsed = load(release)
    # Partitions aside (the one-RPC read has none), and the user of no
    # reason (23.02+'s JSON and sinfo name one, sprint names none).
    forms = [{n: replace(st, partitions=(), reason_user=st.reason_user if st.reason_time else "")
              for n, st in nodes.items()} for nodes in parsed.values()]
    assert len(forms) >= 3
    for other in forms[1:]:
        assert other == forms[0]


@pytest.mark.parametrize("release", RELEASES)
def test_the_one_rpc_read_refuses_what_a_line_break_could_forge(release):
    """A Comment with a line break and three spaces (it prints as a field
    line of its own: here a second State=DOWN) and a reason of two lines:
    refused, so the node is read the older way, never misread."""
    expected, _ = load(release)
    with open(os.path.join(FIXTURES, release, ONE_RPC)) as handle:
        texts = json.load(handle)
    refused = expected["files"][ONE_RPC]["refused"]
    assert sorted(refused) == ["comment with a line break", "reason of two lines"]
    for case in refused:
        node = texts[case]["text"].split()[0][len("NodeName="):]
        with pytest.raises(ParseError):
            parse_show_node(texts[case]["text"], texts[case]["oneline"], node)


@pytest.mark.parametrize("release", RELEASES)
def test_derived_properties(release):
    _, parsed = load(release)
    for nodes in parsed.values():
        assert nodes["gpu01"].in_service and not nodes["gpu01"].drain
        assert nodes["gpu02"].drained and not nodes["gpu02"].in_service
        assert nodes["gpu03"].drained
        assert nodes["gpu04"].down and not nodes["gpu04"].responding and not nodes["gpu04"].in_service
        assert nodes["gpu05"].draining and not nodes["gpu05"].in_service
        assert nodes["gpu06"].draining and not nodes["gpu06"].drained
