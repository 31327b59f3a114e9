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
