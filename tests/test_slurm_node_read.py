"""What a node's own read costs slurmctld, counted by slurmctld itself
(sdiag), on whichever release CI runs (issue 34): one RPC.

The node reads its own record when its findings change (gpugate.node.act),
and the keeper re-reads a node before it drains it.  `sinfo -n NAME` and
pyslurm's `Node.load(NAME)` read the node (REQUEST_NODE_INFO_SINGLE) and the
partition table (REQUEST_PARTITION_INFO); `scontrol show node NAME` loads
every node (Slurm 25.11's src/sinfo/sinfo.c, src/scontrol/info_node.c).
`own_record` makes the single-node RPC alone, through libslurm
(gpugate.slurm.libslurm), with either backend, and reads what the older
read reads, partitions aside (slurmctld sends none)."""

import importlib.util
import os
import time

import pytest

from conftest import ROOT

# Not slow (a 2-node cluster, seconds): every release's run in CI holds it.
pytestmark = [pytest.mark.slurm]
CLUSTER = {"nodes": 2, "interval": 600}


def _sdiag(cluster):
    spec = importlib.util.spec_from_file_location("bench_controller_load",
                                                  os.path.join(ROOT, "bench", "bench_controller_load.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.sdiag(cluster)


def _connect(cluster, backend, library=None):
    from gpugate.model.config import load_settings
    from gpugate.errors import SlurmError
    from gpugate.core.record import replace
    from gpugate.slurm import connect

    settings = load_settings(cluster.gpugate_conf)
    slurm = dict(settings.slurm, backend=backend)
    if library is not None:
        slurm["library"] = library
    try:
        return connect(replace(settings, slurm=slurm))
    except SlurmError as exc:
        pytest.skip("no pyslurm for this release here: %s" % exc)


def _reads(rpcs):
    return {k: v for k, v in rpcs.items() if k.startswith(("REQUEST_NODE_INFO", "REQUEST_PARTITION_INFO"))}


@pytest.mark.parametrize("backend", ["commands", "pyslurm"])
def test_a_nodes_own_read_is_one_rpc(cluster, backend):
    slurm = _connect(cluster, backend)
    try:
        slurm.version()  # the pyslurm worker's start and `sinfo --version` ask slurmctld nothing
        cluster.run(["/usr/bin/sdiag", "-r"])
        state = slurm.own_record(cluster.nodes[0])
        rpcs = _sdiag(cluster)
        how = slurm.node_read
    finally:
        slurm.close()
    assert state is not None and state.name == cluster.nodes[0] and state.partitions == ()
    assert how == "libslurm"
    assert _reads(rpcs) == {"REQUEST_NODE_INFO_SINGLE": 1}, rpcs


@pytest.mark.parametrize("backend", ["commands", "pyslurm"])
def test_it_reads_what_the_older_read_reads_and_refuses_what_it_cannot(cluster, backend):
    """Drained with a reason an admin could write, a Comment, an undrain
    (the leftover reason 24.11 keeps), a Comment with a line break and a
    reason of two lines (the older read, and why in node_read), a node
    slurmctld has none of."""
    from gpugate.core.record import replace

    node = cluster.nodes[1]
    steps = [
        (["State=DRAIN", 'Reason=gpugate: drift x=1 (want 2) | "q" [x@1]'], "libslurm"),
        (['Comment=rack 3 [gpugate-pending @1764120000] x=1 [/gpugate-pending]'], "libslurm"),
        (["State=UNDRAIN"], "libslurm"),
        (["Comment=rack 3\n   State=DOWN"], "line break"),
        (["Comment=", "State=DRAIN", "Reason=PSU swap\n   Comment=forged"], "several lines"),
    ]
    slurm = _connect(cluster, backend)
    try:
        for updates, how in steps:
            cluster.scontrol("update", "NodeName=" + node, *updates)
            # Two reads one after the other: slurmctld may still change the
            # node between them on a loaded machine (NOT_RESPONDING coming and
            # going; 25.11 dropping an undrained node's leftover reason at its
            # next ping), so a pair that differs is read again: a wrong parse
            # differs every time, a change in between settles.
            for attempt in range(5):
                one = slurm.own_record(node)
                assert how in slurm.node_read, (updates, slurm.node_read)
                older = slurm.nodes(node)[node]
                same = [replace(st, partitions=(), flags=st.flags - {"NOT_RESPONDING"}) for st in (one, older)]
                if same[0] == same[1]:
                    break
                time.sleep(1)
            assert same[0] == same[1], updates
            assert one.partitions == (() if how == "libslurm" else older.partitions)
        assert slurm.own_record("nosuchnode") is None
    finally:
        cluster.scontrol("update", "NodeName=" + node, "Comment=")
        # 24.11 keeps a reason after RESUME: leave a reason of one line, not the two above
        cluster.scontrol("update", "NodeName=" + node, "State=DRAIN", "Reason=test over", check=False)
        cluster.scontrol("update", "NodeName=" + node, "State=RESUME", check=False)
        slurm.close()


def test_a_library_that_does_not_load_means_the_older_read_and_says_why(cluster):
    """[slurm] library naming a file that is no library (a real ELF
    executable: dlopen refuses it) or nothing: the node is read the older
    way, two RPCs, and node_read says why; never a wrong state."""
    for library, why in (("/bin/true", "libslurm /bin/true"), ("/nonexistent/libslurm.so", "no libslurm at")):
        slurm = _connect(cluster, "commands", library)
        try:
            cluster.run(["/usr/bin/sdiag", "-r"])
            state = slurm.own_record(cluster.nodes[0])
            rpcs = _sdiag(cluster)
            assert state == slurm.nodes(cluster.nodes[0])[cluster.nodes[0]]
            assert why in slurm.node_read, slurm.node_read
            assert _reads(rpcs) == {"REQUEST_NODE_INFO_SINGLE": 1, "REQUEST_PARTITION_INFO": 1}, rpcs
        finally:
            slurm.close()


def test_the_keepers_fleet_read_is_scontrol_s_text_read_as_the_full_read(cluster):
    """The budget keeper's read of the whole fleet (CommandSlurm.fleet,
    issue 48): `scontrol show node`'s text, two RPCs (the node table and
    the partitions, as any full read), and the records of the nodes that
    decide, and the partitions' sizes, are what the full (JSON) read
    says.  A comment an admin wrote over two lines is not guessed at: the
    fleet is read the full way and fleet_read says why."""
    from gpugate.core.record import replace
    from gpugate.slurm.nodestate import show_fleet
    from gpugate.slurm.nodestate.lean import deciding, of_states

    drained, published = cluster.nodes
    span = "[gpugate-pending @1764120000 seen @1764120001 proof %s] gpugate: drift x=1 (want 2) [/gpugate-pending]"
    slurm = _connect(cluster, "commands")
    try:
        cluster.scontrol("update", "NodeName=" + drained, "State=DRAIN", 'Reason=admin: PSU swap "B" [x@1]')
        cluster.scontrol("update", "NodeName=" + published, "Comment=rack 3 " + span % ("0" * 32))
        # 25.11's JSON keeps who set a reason since cleared; the text prints no
        # Reason line without a reason, and the keeper reads no one for none.
        def as_text(states):
            return {n: replace(s, reason_user="") if not s.reason else s for n, s in states.items()}

        for attempt in range(5):  # two reads: slurmd's NOT_RESPONDING (and the reason
            # an earlier test left) may come and go between them
            cluster.run(["/usr/bin/sdiag", "-r"])
            fleet = slurm.fleet()
            rpcs = _sdiag(cluster)
            full = of_states(slurm.nodes())
            if fleet.states == as_text(full.states):
                break
            time.sleep(1)
        assert slurm.fleet_read == "scontrol show node", (slurm.fleet_read, cluster.scontrol("show", "node"))
        assert _reads(rpcs) == {"REQUEST_NODE_INFO": 1, "REQUEST_PARTITION_INFO": 1}, rpcs
        assert fleet.states == as_text(full.states)
        assert sorted(fleet.states) == [drained, published]
        assert fleet.sizes == full.sizes and fleet.nodes == full.nodes == 2
        assert fleet.states[drained].reason == 'admin: PSU swap "B" [x@1]' and deciding(fleet.states[published])
        split, show_fleet._at_once = show_fleet._at_once, lambda text: seen.append(split(text)) or seen[-1]
        try:  # the release's own text is read in one step (show_fleet's module doc): its fast way, not the other
            for attempt in range(5):
                seen = []
                fast = slurm.fleet()
                full = of_states(slurm.nodes())
                if fast.states == as_text(full.states):
                    break
                time.sleep(1)
            assert fast.states == as_text(full.states) and seen and seen[-1] is not None, seen
        finally:
            show_fleet._at_once = split
        cluster.scontrol("update", "NodeName=" + published, "Comment=" + span % ("0" * 32) + "\nrow B")
        fleet = slurm.fleet()
        assert slurm.fleet_read.startswith("full read (scontrol show node: "), slurm.fleet_read
        assert "line break" in slurm.fleet_read
        assert fleet.states[published].comment.endswith("\nrow B")
    finally:
        cluster.scontrol("update", "NodeName=" + published, "Comment=")
        if "drain" in cluster.state(drained):
            cluster.scontrol("update", "NodeName=" + drained, "State=RESUME")
        slurm.close()
