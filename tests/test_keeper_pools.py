"""Issue 45 item 4: the budget's pools cannot be changed under it.  On
Kubernetes a pool is a label anyone with Node patch rights changes; the
keeper remembers every pool a held node was counted in (gpugate.budget.pools,
kept on its Lease) and counts it in each until it is returned.  Here the
keeper's run (gpugate.keeper.run.run_once, pools kept) against an in-memory
fleet whose labels change between runs; the real API server is
tests/test_kube_keeper_lease.py."""

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from gpugate.budget import rules as budget
from gpugate.keeper import run as keeper
from gpugate.budget import pools as keeper_pools
from gpugate.core.record import replace

from test_keeper import DRIFT, MemorySlurm, node
from test_pending_proof import _settings

NOW = 1_800_000_000
POOLS = ("A", "B", "C")


class LabelledFleet(MemorySlurm):
    """Nodes whose pool is a label: ``hidden`` ones are out of the keeper's
    list (its node_selector) but still read on their own, as Kubernetes does."""

    def __init__(self, states):
        super().__init__(states, lambda: NOW)
        self.hidden = set()

    def nodes(self, names=None, lean=False):
        return {n: s for n, s in super().nodes(names, lean).items() if n not in self.hidden}

    def own_record(self, name):
        return self.states.get(name)


def _run(cfg, slurm, memory, pools):
    figures = keeper.run_once(cfg, slurm, clock=lambda: NOW, sleep=lambda s: None, memory=memory, pools=pools)
    return figures, figures.pop("_memory"), figures.pop("_pools")


def test_the_reproduced_case_a_held_node_that_loses_its_label_keeps_its_pools_budget(tmp_path):
    cfg = _settings(tmp_path, share=0.2)  # six nodes: one
    slurm = LabelledFleet({n.name: n for n in (node("gpu%02d" % i, ("H100",), published=DRIFT, since=NOW - 100 + i)
                                               for i in range(1, 7))})
    figures, memory, pools = _run(cfg, slurm, {}, {})
    assert figures["drained"] == ["gpu01"] and pools == {"gpu01": ("H100",)}
    slurm.states["gpu01"] = replace(slurm.states["gpu01"], partitions=())  # its label removed
    figures, memory, pools = _run(cfg, slurm, memory, pools)
    assert figures["drained"] == [] and figures["partitions"]["H100"]["drained"] == 1
    assert "drain budget of partition H100 spent: 1 of 1" in figures["held_nodes"]["gpu02"]
    # Without the remembered pools (as before): gpu02 drains too, past the budget.
    assert _run(cfg, slurm, memory, {})[0]["drained"] == ["gpu02"]


def test_a_returned_node_is_forgotten_and_a_deleted_one_too():
    from gpugate.slurm.nodestate.lean import of_states

    held = node("n1", ("A",), reason=DRIFT, when=5)
    fleet = of_states({"n1": replace(held, partitions=("B",)), "n2": node("n2", ("A",))})
    grown = keeper_pools.count_held(fleet, {"n1": ("A",), "gone": ("A",)}, "gpugate:", {"gone": None})
    assert grown.states["n1"].partitions == ("A", "B") and grown.sizes == {"A": 2, "B": 1}
    returned = replace(held, flags=frozenset(), reason="")
    assert keeper_pools.remember({"n1": returned}, "gpugate:") == {}
    assert keeper_pools.decode(keeper_pools.encode({"n1": ("A", "B"), "n2": ("A",)})) == {"n1": ("A", "B"),
                                                                                      "n2": ("A",)}
    for garbled in (None, [], {"A": "n1"}, {"": ["n1"]}, {"A": [1, ""]}):
        assert keeper_pools.decode(garbled) == {}


OPS = st.one_of(
    st.tuples(st.just("label"), st.integers(0, 7), st.sampled_from(POOLS + (None,))),
    st.tuples(st.just("hide"), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("return"), st.integers(0, 7)),
    st.just(("run",)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(sizes=["C", "A", "A", "B", "C"], share=0.1, ops=[("run",), ("return", 0), ("label", 3, "A")])
@given(sizes=st.lists(st.sampled_from(POOLS + (None,)), min_size=2, max_size=8),
       share=st.sampled_from([0.1, 0.2, 0.34, 0.5]), ops=st.lists(OPS, max_size=25))
def test_label_changes_and_keeper_runs_never_drain_past_any_pools_budget(tmp_path, sizes, share, ops):
    """Every node published a drift; between keeper runs labels change
    (to another pool or none), held nodes leave the keeper's list or are
    returned by an admin.  The oracle keeps its own history: each held
    node belongs to every pool it was labelled with at a run since it was
    drained.  After each run, every pool a node was drained into holds at
    most its allowance of held nodes."""
    cfg = _settings(tmp_path, share=share)
    names = ["n%d" % i for i in range(len(sizes))]
    slurm = LabelledFleet({n: node(n, (p,) if p else (), published=DRIFT, since=NOW - 100 + i)
                           for i, (n, p) in enumerate(zip(names, sizes))})
    history = {}  # held node -> the pools it was seen in at a run while held (the oracle's)
    memory, pools = {}, {}
    for op in ops + [("run",)]:
        if op[0] == "label":
            name = names[op[1] % len(names)]
            slurm.states[name] = replace(slurm.states[name], partitions=(op[2],) if op[2] else ())
        elif op[0] == "hide":
            name = names[op[1] % len(names)]
            (slurm.hidden.add if op[2] else slurm.hidden.discard)(name)
        elif op[0] == "return":
            name = names[op[1] % len(names)]
            slurm.states[name] = replace(slurm.states[name], flags=frozenset(), reason="", reason_time=None)
            history.pop(name, None)
        else:
            for name, seen in list(history.items()):
                history[name] = seen | set(slurm.states[name].partitions)  # the labels at this run
            over = set()  # the pools past their allowance as the labels stand now (a relabel can do that)
            for part in {p for seen in history.values() for p in seen}:
                held = [n for n, seen in history.items() if part in seen]
                members = {n for n, s in slurm.states.items() if part in s.partitions and n not in slurm.hidden}
                if len(held) > budget.allowance(len(members | set(held)), share):
                    over.add(part)
            figures, memory, pools = _run(cfg, slurm, memory, pools)
            for name in figures["given_back"]:  # one keeper gives back only where a relabel overfilled a pool
                assert history[name] & over, (name, history[name], over, figures)
                history.pop(name)
            for name in figures["drained"]:
                history[name] = set(slurm.states[name].partitions)
            for part in {p for name in figures["drained"] for p in history[name]}:  # what this run drained into
                held = [n for n, seen in history.items() if part in seen]
                members = {n for n, s in slurm.states.items() if part in s.partitions and n not in slurm.hidden}
                assert len(held) <= budget.allowance(len(members | set(held)), share), (part, held, figures)
    # What the keeper remembers is exactly the oracle's history of the held nodes.
    assert pools == {n: tuple(sorted(seen)) for n, seen in history.items() if seen}
