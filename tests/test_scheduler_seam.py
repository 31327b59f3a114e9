"""The scheduler seam (gpugate.schedulers): every adapter offers the one
interface the node agent, the keeper and the sweep call, and the registry
names each adapter once."""

import importlib

import pytest

from gpugate.errors import ConfigError
from gpugate.kube.nodes import KubeNodes
from gpugate.kube.paired import PairedNodes
from gpugate.schedulers import registry
from gpugate.schedulers.interface import METHODS, Scheduler
from gpugate.slurm.commands import CommandSlurm
from gpugate.slurm.pyslurm_backend import PyslurmSlurm


@pytest.mark.parametrize("adapter", [CommandSlurm, PyslurmSlurm, KubeNodes, PairedNodes])
def test_every_adapter_offers_the_interface(adapter):
    missing = [m for m in METHODS if not callable(getattr(adapter, m, None))]
    assert not missing, "%s lacks %s" % (adapter.__name__, missing)
    assert isinstance(getattr(adapter, "reports_verdict", None), bool)


def test_the_interface_lists_what_it_documents():
    documented = {name for name in vars(Scheduler) if not name.startswith("_") and callable(vars(Scheduler)[name])}
    assert documented == set(METHODS)


def test_the_registry_names_an_importable_connect_for_each_scheduler():
    from gpugate.model.config import SCHEDULERS  # the names gpugate.toml accepts

    assert set(registry.ADAPTERS) == set(SCHEDULERS)
    for spec in registry.ADAPTERS.values():
        module, _, function = spec.partition(":")
        assert callable(getattr(importlib.import_module(module), function))


def test_an_unknown_scheduler_is_refused_not_taken_for_slurm():
    class Settings:
        scheduler = "nomad"

    with pytest.raises(ConfigError, match="no such scheduler"):
        registry.connect(Settings())
    with pytest.raises(ConfigError, match="Slurm only"):
        registry.require_slurm(Settings(), "gpugate sweep")


def test_every_transport_gpugate_toml_accepts_is_the_sweeps_own_or_a_schedulers():
    from gpugate.model.config import _SWEEP

    accepted = set(_SWEEP.fields["transport"][0].choices)
    assert accepted == {"ssh", "local"} | set(registry.TRANSPORTS)
    for name in registry.TRANSPORTS:
        assert callable(registry.transport_maker(name))
    assert registry.transport_maker("ssh") is None  # the sweep's own (gpugate.node.transport)


def test_above_the_seam_only_a_schedulers_own_parts_reach_its_adapter():
    """Above the schedulers layer, a module imports gpugate.slurm* or
    gpugate.kube* only where it is that scheduler's own part: named for it
    (kube_*, slurm_*), or one of the programs slurmd runs.  Everything else
    goes through gpugate.schedulers.  Neutral pieces still under an adapter
    (the published-finding format, the node-state records) are listed with
    why; the list can only shrink (a stale entry fails)."""
    from test_layout import LAYERS, import_graph, layer_of

    seam = [name for name, _ in LAYERS].index("schedulers")
    neutral = {
        "gpugate.slurm.pending",  # the published-finding format every scheduler's records carry
        "gpugate.slurm.nodestate", "gpugate.slurm.nodestate.lean",  # NodeState, Fleet (the keeper's fleet view)
        "gpugate.slurm.prologtimeout",  # the Slurm prolog's own deadline
        "gpugate.slurm",  # the Slurm prolog's job note (node.prolog: only slurmd runs it)
    }
    graph = import_graph()
    offenders, used = [], set()
    for module, imports in sorted(graph.items()):
        if layer_of(module)[0] <= seam or module.startswith(("gpugate.testbed", "gpugate.cli", "gpugate.sim")):
            continue
        leaf = module.rsplit(".", 1)[1]
        for imported in imports:
            kube, slurm = imported.startswith("gpugate.kube"), imported.startswith("gpugate.slurm")
            if (kube and leaf.startswith("kube_")) or (slurm and leaf.startswith("slurm_")):
                continue
            if kube or slurm:
                if imported in neutral:
                    used.add(imported)
                else:
                    offenders.append("%s imports %s" % (module, imported))
    assert not offenders, "through gpugate.schedulers, or name the module for its scheduler:\n" + "\n".join(offenders)
    assert used == neutral, "no longer imported above the seam, drop from the list: %s" % sorted(neutral - used)


def test_slurm_never_reaches_for_kubernetes():
    """Slurm's adapter stands alone; Slurm on Kubernetes (gpugate.kube.paired) uses it, never the other way."""
    from test_layout import import_graph

    graph = import_graph()
    crossing = sorted("%s -> %s" % (m, i) for m, imports in graph.items() if m.startswith("gpugate.slurm")
                      for i in imports if i.startswith("gpugate.kube"))
    assert "gpugate.slurm.commands" in graph and not crossing, crossing


def test_the_modules_the_seams_name_by_string_stand_at_or_below_them():
    """registry.ADAPTERS/TRANSPORTS and vendors.seam.PARTS import by name (the
    AST walk of tests/test_layout.py cannot see them): each named module's
    layer is at or below its seam's."""
    from gpugate.vendors import seam
    from test_layout import layer_of

    named = [("gpugate.schedulers.registry", spec) for spec in list(registry.ADAPTERS.values()) +
             list(registry.TRANSPORTS.values())]
    named += [("gpugate.vendors.seam", spec) for parts in seam.PARTS.values() for spec in parts.values() if spec]
    assert len(named) >= 10
    for owner, spec in named:
        module = spec.partition(":")[0]
        assert layer_of(module)[0] <= layer_of(owner)[0], "%s names %s, above it" % (owner, module)
        assert callable(getattr(importlib.import_module(module), spec.partition(":")[2]))
