"""Site settings (gpugate.toml): paths, time budgets, Slurm access, logging.
Everything that is not the baseline.  Validated like the baseline."""

from __future__ import annotations

import os

from gpugate.errors import ConfigError
from gpugate.safety import trust
from gpugate.core.record import dataclass
from gpugate.model.config_kube import table as kube_table
from gpugate.model.config_preflight import table as preflight_table
from gpugate.model.schema import AnyOf, Bool, Choice, Int, Invalid, ListOf, MapOf, Number, Removed, Str, Table, load_toml, validate

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Mapping, Optional

DEFAULT_CONFIG = "/etc/gpugate/gpugate.toml"
CONFIG_ENV = "GPUGATE_CONFIG"
# The schedulers gpugate.toml may name: each has its adapter in gpugate.schedulers.registry.
SCHEDULERS = ("slurm", "kubernetes", "slurm+kubernetes")

DEFAULT_COMMANDS = {
    "modinfo": "/usr/sbin/modinfo",
    "dkms": "/usr/sbin/dkms",
    "lspci": "/usr/bin/lspci",
    "dpkg-query": "/usr/bin/dpkg-query",
    "rpm": "/usr/bin/rpm",
    "systemctl": "/usr/bin/systemctl",
    "dcgmi": "/usr/bin/dcgmi",
    "nvidia-smi": "/usr/bin/nvidia-smi",
    "nvidia-imex-ctl": "/usr/bin/nvidia-imex-ctl",
    # The sweep's evidence bundle (gpugate.node.evidence): run where installed, never required.
    "nvidia-bug-report.sh": "/usr/bin/nvidia-bug-report.sh",
    # AMD nodes (vendor = "amd"): Debian's amd-smi; ROCm's is /opt/rocm/bin/amd-smi. RVS ships with ROCm only.
    "amd-smi": "/usr/bin/amd-smi",
    "rvs": "/opt/rocm/bin/rvs",
}
DEFAULT_BUDGETS = {"healthcheck": 40.0, "prolog": 8.0, "epilog": 50.0, "verify": 1200.0}
# Globs (dpkg-query -W and rpm -qa both take them); the first that matches wins.
# Fabric Manager: Debian/Ubuntu nvidia-fabricmanager-<branch>; RHEL/Rocky
# nvidia-fabricmanager from 580, nvidia-fabric-manager before.  "-[0-9]*"
# keeps -devel/-dev packages out.  DCGM and the driver are read from dcgmi and
# NVML, not from packages.
DEFAULT_PACKAGES = {
    "container_toolkit": ("nvidia-container-toolkit",),
    "fabricmanager": ("nvidia-fabricmanager-[0-9]*", "nvidia-fabricmanager", "nvidia-fabric-manager",
                      "cuda-drivers-fabricmanager-[0-9]*"),
}


def _abs_path(value: str) -> Optional[str]:
    if not value.startswith("/"):
        return "expected an absolute path (slurmd starts gpugate with no PATH and its log dir as cwd), got %r" % value
    if "\n" in value or "\0" in value:
        return "path contains a newline or NUL"
    return None


def _word(value: str, what: str) -> Optional[str]:
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", value):
        return "%s: letters, digits, '.', '_' and '-', at most 64" % what
    return None


def _host(value: str) -> Optional[str]:
    """A host name, an address, or a pattern with {node} (rank 0's name)."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9.:_-]{0,200}", value.replace("{node}", "x", 1)) or not value:
        return "a host name, an address or a pattern with {node} (e.g. {node}-ib)"
    return None


def _tag(value: str) -> Optional[str]:
    if not (1 <= len(value) <= 16) or not all(33 <= ord(c) < 127 for c in value):
        return "expected 1 to 16 printable ASCII characters without spaces, e.g. \"gpugate:\""
    return None


def _unit(value: str) -> Optional[str]:
    import re

    if value == "none" or re.fullmatch(r"[A-Za-z0-9:_.@\\-]{1,255}", value) and not value.startswith("-"):
        return None
    return ('expected a systemd unit name (letters, digits and ":_.@\\-", e.g. "nvidia-persistenced") or "none" '
            "(not read on this node: shown as unchecked), got %r" % value)


_PATH = Str("/var/lib/gpugate", _abs_path)
_OPT_PATH = AnyOf(Choice(""), _PATH)

class _Argv(ListOf):
    """A command as an argv list; its program an absolute path (gpugate runs
    it as root with no PATH, and only a file root alone can change)."""

    def __init__(self):
        super().__init__(Str("/usr/bin/ansible-playbook"), max_items=200)
        self.allowed = "an array of strings, the first an absolute path"

    def check(self, value, path):
        argv = super().check(value, path)
        problem = _abs_path(argv[0]) if argv else None
        if problem:
            raise Invalid(path + "[0]", problem)
        if any("{token}" in word for word in argv):  # every user on the node reads a command line (/proc)
            raise Invalid(path, "no secret goes on a command line: the preflight's rank reads GPUGATE_PREFLIGHT_TOKEN")
        return argv


_ARGV = _Argv()
_SWEEP = Table({
    "journal": (_PATH, "/var/lib/gpugate/sweep.db"),
    "max_batch": (Int(1, 100000), 8),
    "floor": (Number(0, 100000), 0.5),  # < 1: a fraction of each partition; >= 1: a node count
    "floors": (MapOf(Number(0, 100000)), dict),
    "canary": (Int(1, 1000), 1),
    "circuit_breaker": (Int(1, 100000), 2),
    "drain_timeout": (Number(0, 7 * 86400), 3600.0),
    "converge": (_ARGV, ()),
    "converge_per": (Choice("batch", "node"), "batch"),
    "converge_timeout": (Number(1, 86400), 3600.0),
    "preview": (_ARGV, ()),
    "rollback": (_ARGV, ()),
    "reboot_timeout": (Number(1, 86400), 900.0),
    "verify_timeout": (Number(1, 86400), 1800.0),
    # kubernetes: through the node agent on the Node object (gpugate.kube.channel), no ssh
    "transport": (Choice("ssh", "local", "kubernetes"), "ssh"),
    "gpugate": (_ARGV, ("/opt/gpugate/bin/gpugate",)),
    "remote_config": (_OPT_PATH, ""),
    # ssh -F: the sweep's own ssh_config (hosts, keys, known_hosts); trust-checked.
    "ssh_config": (_OPT_PATH, ""),
    "connect_timeout": (Int(1, 3600), 10),  # seconds ssh waits for a node to accept the connection
    "fanout": (Int(1, 4096), 64),
    "poll_seconds": (Number(0.1, 600), 5.0),
    # Repeat offenders: drained again for a component the sweep returned the
    # node to service for repeat_limit times within repeat_window seconds: rma.
    "repeat_limit": (Int(0, 1000), 3),  # 0: never escalate for repeats
    "repeat_window": (Number(60, 365 * 86400), 7 * 86400.0),
    # The smoke job (gpugate/sweep/slurm_smoke.py), submitted with sbatch into the
    # batch's reservation after verification; [] turns it off.  {gpus}: the
    # node's GPU count from the baseline's [nodes] ({node} also expands).
    "smoke": (_ARGV, ("/opt/nccl-tests/build/all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "{gpus}")),
    "smoke_sbatch": (ListOf(Str("--gres=gpu:{gpus}")), ("--gres=gpu:{gpus}",)),  # extra sbatch options
    "smoke_deadline": (Number(10, 86400), 900.0),  # seconds from submission to a read result
    # Where the job writes its output and the sweeper reads it: a file
    # system both see (the job runs on the node, the sweep on the controller).
    "smoke_output_dir": (_PATH, "/var/lib/gpugate/smoke"),
    # After every single-node job, the nodes that passed run 2-node jobs in
    # pairs (gpugate/sweep/pairs.py): the inter-node path.  {node} is the
    # pair's first node, {nodes} both, {gpus} the GPUs of one node.
    "pairs": (Bool(), False),
    # An odd one out pairs with an idle in-service node of its partition,
    # lent to the batch's reservation for that job (gpugate/sweep/partner.py).
    "pair_with_in_service": (Bool(), False),
    "smoke_pair": (_ARGV, ("/usr/bin/srun", "--mpi=pmix", "/opt/nccl-tests/build/all_reduce_perf", "-b", "1G",
                           "-e", "8G", "-f", "2", "-g", "1")),  # one task per GPU, one GPU each
    "smoke_pair_sbatch": (ListOf(Str("--gres=gpu:{gpus}")), ("--gres=gpu:{gpus}", "--ntasks-per-node={gpus}")),
    # The same on AMD nodes (a nodeset with vendor = "amd"): rccl-tests, built from source (no distribution
    # ships it), one large size: its average is then the size's busbw ([smoke] min_busbw_gbps per product).
    "smoke_amd": (_ARGV, ("/opt/rccl-tests/build/all_reduce_perf", "-b", "8G", "-e", "8G", "-f", "2", "-g", "{gpus}")),
    "smoke_pair_amd": (_ARGV, ("/usr/bin/srun", "--mpi=pmix", "/opt/rccl-tests/build/all_reduce_perf", "-b", "8G",
                               "-e", "8G", "-f", "2", "-g", "1")),
    # Evidence before loss (gpugate/sweep/evidence.py): before a reset or a
    # reboot, a bundle from the node, kept here (root's, 0700; "": evidence/
    # next to the journal), at most evidence_max_bytes each, the newest
    # evidence_keep per node (0: no bundles).
    "evidence_dir": (_OPT_PATH, ""),
    "evidence_max_bytes": (Int(1 << 16, 1 << 34), 64 << 20),
    "evidence_keep": (Int(0, 10000), 10),
    "evidence_timeout": (Number(10, 86400), 600.0),  # the whole collection, per batch
    "bug_report_timeout": (Number(1, 86400), 300.0),  # nvidia-bug-report.sh's own limit on the node
    # The reset rung (gpugate/vendors/*/reset.py): findings a GPU reset clears
    # are reset (`gpugate reset-gpus` on the node) before any reboot.
    "reset": (Bool(), True),
    "reset_timeout": (Number(10, 86400), 600.0),
})

# Drains for anything but an acute finding stop at a share of each
# partition (gpugate.budget.rules).
_DRAIN_BUDGET = Table({
    "max_share": (Number(0, 1), 0.1),  # of each partition (at least one node); 1 switches the budget off
    # Which findings are budgeted is not configurable: every comparison with
    # a file is (gpugate.model.findings.ACUTE lists the intrinsic events).
    "classes": (Removed("every finding but an acute one (Xid, ECC, a lost GPU, a failing stack) is budgeted, "
                        "whatever its class; delete this key"), None),
    # Accepted and no longer used (issue 26): a node never reads the fleet,
    # it publishes a budgeted finding for the keeper (gpugate.keeper.run), so
    # there is nothing to ask again or to spread out.
    "recheck_seconds": (Number(0, 86400), 600.0),
    "jitter_seconds": (AnyOf(Choice("auto"), Number(0, 3600)), "auto"),
    # Root's alone, the same on every node and controller: proves a finding
    # published in a node's Comment is that node's (gpugate.safety.budgetkey).
    "key_file": (_PATH, "/etc/gpugate/drain-budget.key"),
})

# The preflight's table (gpugate.model.config_preflight, docs/explanation/preflight-design.md).
_PREFLIGHT = preflight_table(_ARGV, _word, _host)

# Kubernetes nodes (gpugate.model.config_kube, docs/explanation/kubernetes.md).
_KUBERNETES = kube_table(_OPT_PATH, _word)

_CONFIG = Table({
    "baseline": (_PATH, "/etc/gpugate/baseline.toml"),
    # Which scheduler the node agent and the keeper act through (gpugate.schedulers.registry).
    # "slurm+kubernetes": Slurm on Kubernetes (Slinky, soperator), each hold mirrored on the Node (gpugate.kube.paired).
    "scheduler": (Choice(*SCHEDULERS), "slurm"),
    "kubernetes": (_KUBERNETES, lambda: _KUBERNETES.check({}, "kubernetes")),
    "state_dir": (_PATH, "/var/lib/gpugate"),
    "reason_tag": (Str("gpugate:", _tag), "gpugate:"),
    "sysroot": (_PATH, "/"),
    "log": (Choice("syslog", "file", "both"), "both"),
    "budgets": (Table({m: (Number(0.5, 86400), v) for m, v in DEFAULT_BUDGETS.items()}),
                lambda: dict(DEFAULT_BUDGETS)),
    "healthcheck": (Table({
        "boot_grace_seconds": (Number(0, 86400), 300.0),
        "prometheus_textfile": (_OPT_PATH, ""),
    }), lambda: {"boot_grace_seconds": 300.0, "prometheus_textfile": ""}),
    "prolog": (Table({"verdict_max_age_seconds": (Number(0, 86400), 900.0)}),
               lambda: {"verdict_max_age_seconds": 900.0}),
    "slurm": (Table({
        "backend": (Choice("commands", "pyslurm", "auto"), "commands"),  # see gpugate.slurm.connect
        "bin_dir": (_PATH, "/usr/bin"),
        # libslurm for a node's one-RPC read of itself; "": found beside bin_dir (gpugate.slurm.libslurm)
        "library": (_OPT_PATH, ""),
        "slurm_conf": (_OPT_PATH, ""),
        "timeout_seconds": (Number(1, 600), 10.0),
        "self_clearing": (ListOf(Choice("probe", "drift", "broken", "health")), ("probe",)),
    }), lambda: {"backend": "commands", "bin_dir": "/usr/bin", "library": "", "slurm_conf": "",
                 "timeout_seconds": 10.0, "self_clearing": ("probe",)}),
    "commands": (MapOf(_PATH, lambda k: None if k in DEFAULT_COMMANDS else
                       "unknown command; allowed: %s" % ", ".join(sorted(DEFAULT_COMMANDS))), dict),
    "packages": (Table({
        "manager": (Choice("dpkg", "rpm", "none"), "dpkg"),
        "container_toolkit": (ListOf(Str("nvidia-container-toolkit")), DEFAULT_PACKAGES["container_toolkit"]),
        "fabricmanager": (ListOf(Str("nvidia-fabricmanager-*")), DEFAULT_PACKAGES["fabricmanager"]),
    }), lambda: {"manager": "dpkg", **DEFAULT_PACKAGES}),
    # role -> systemd unit, asked only where systemd is the init and /proc shows no daemon
    # (gpugate.probes.services); "none": not read here (shown as unchecked, never as running).
    "services": (Table({
        "fabricmanager": (Str("nvidia-fabricmanager", _unit), "nvidia-fabricmanager"),
        "persistenced": (Str("nvidia-persistenced", _unit), "nvidia-persistenced"),
    }), lambda: {"fabricmanager": "nvidia-fabricmanager", "persistenced": "nvidia-persistenced"}),
    "kernel_log": (Table({"path": (_PATH, "/dev/kmsg")}), lambda: {"path": "/dev/kmsg"}),
    "sim": (Table({"fleet": (_OPT_PATH, "")}), lambda: {"fleet": ""}),
    # Was a way to switch the trust checks off, read from a file they check.
    "check_ownership": (Removed("trust checks cannot be switched off from a file they check; make the files "
                                 "root's (chown root F; chmod go-w F) and delete this key"), None),
    "drain_budget": (_DRAIN_BUDGET, lambda: _DRAIN_BUDGET.check({}, "drain_budget")),
    "sweep": (_SWEEP, lambda: _SWEEP.check({}, "sweep")),
    "preflight": (_PREFLIGHT, lambda: _PREFLIGHT.check({}, "preflight")),
    # The site's LBNL NHC, run inside the health check (gpugate.node.nhc); off when empty.
    "nhc": (Table({"command": (_ARGV, ()), "timeout_seconds": (Number(1, 3600), 20.0)}),
            lambda: {"command": (), "timeout_seconds": 20.0}),
})


@dataclass(frozen=True)
class Settings:
    """gpugate.toml, validated."""

    baseline: str
    state_dir_template: str
    reason_tag: str
    sysroot: str
    log: str
    budgets: Mapping[str, float]
    boot_grace_seconds: float
    prometheus_textfile: str
    verdict_max_age_seconds: float
    slurm: Mapping[str, object]
    commands: Mapping[str, str]
    packages: Mapping[str, object]
    services: Mapping[str, str]
    kernel_log: str
    sim_fleet: str
    sweep: Mapping[str, object] = None
    drain_budget: Mapping[str, object] = None
    nhc: Mapping[str, object] = None
    preflight: Mapping[str, object] = None
    scheduler: str = "slurm"
    kubernetes: Mapping[str, object] = None
    source: str = ""
    last_good_dir: str = ""  # node-side runs: where the last good copies are kept (node.lastgood)

    def state_dir(self, node: str) -> str:
        if "{node}" in self.state_dir_template:
            from gpugate.core.names import check_node_name

            check_node_name(node)  # "../x" must not leave the state directory
        return self.state_dir_template.replace("{node}", node)

    def node_root(self, node: str) -> str:
        """The file-system root probes read: '/' or a simulated node's sysroot."""
        if self.sim_fleet:
            from gpugate.model.simview import node_dir

            return os.path.join(node_dir(self.sim_fleet, node), "root")
        return self.sysroot

    def command(self, name: str, node: str) -> str:
        if self.sim_fleet:
            from gpugate.model.simview import node_dir

            return os.path.join(node_dir(self.sim_fleet, node), "bin", name)
        return self.commands.get(name, DEFAULT_COMMANDS[name])

    @property
    def slurm_env(self) -> Mapping[str, str]:
        """slurmd gives us no environment: name everything Slurm's tools need."""
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
        if self.slurm["slurm_conf"]:
            env["SLURM_CONF"] = str(self.slurm["slurm_conf"])
        return env


def parse_settings(data: object, source: str) -> Settings:
    raw = validate(data, _CONFIG, source)
    if raw["preflight"]["allreduce_multi"] and float(raw["drain_budget"]["max_share"]) >= 1:
        # A pin across nodes is a finding a job's user can cause: it drains only within the budget.
        raise ConfigError("%s: preflight.allreduce_multi needs the drain budget on (drain_budget.max_share below 1): "
                          "its pins are budgeted, and with the budget off they would drain themselves without "
                          "bound" % source)
    commands = dict(DEFAULT_COMMANDS)
    commands.update(raw["commands"])
    return Settings(
        baseline=raw["baseline"], state_dir_template=raw["state_dir"], reason_tag=raw["reason_tag"],
        sysroot=raw["sysroot"], log=raw["log"], budgets=raw["budgets"],
        boot_grace_seconds=raw["healthcheck"]["boot_grace_seconds"],
        prometheus_textfile=raw["healthcheck"]["prometheus_textfile"],
        verdict_max_age_seconds=raw["prolog"]["verdict_max_age_seconds"],
        slurm=raw["slurm"], commands=commands, packages=raw["packages"], services=raw["services"],
        kernel_log=raw["kernel_log"]["path"], sim_fleet=raw["sim"]["fleet"],
        sweep=raw["sweep"], drain_budget=raw["drain_budget"], nhc=raw["nhc"], preflight=raw["preflight"],
        scheduler=raw["scheduler"], kubernetes=raw["kubernetes"], source=source)


def config_path(explicit: Optional[str] = None) -> str:
    return explicit or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG


def load_settings(path: Optional[str] = None, *, missing_ok: bool = False) -> Settings:
    """Load gpugate.toml.  A missing default file means "all defaults" only
    when ``missing_ok`` (admin tools); the node entry points require it."""
    path = config_path(path)
    if missing_ok and not os.path.exists(path):
        return parse_settings({}, "(defaults)")
    data = load_toml(path, "gpugate configuration")  # refused unless root's alone (gpugate.safety.trust)
    return parse_settings(data, path)


def load_checked_baseline(settings: Settings):
    from gpugate.model.baseline import load_baseline

    return load_baseline(settings.baseline)  # load_toml walks it like gpugate.toml


def check_state(*directories: str, files=()) -> None:
    """State gpugate acts on (the prolog reuses the health check's verdict;
    the sweep resumes what its journal says) must be root's alone; what does
    not exist yet is created by root in a directory only root can write."""
    for path in directories:
        _trusted(trust.check_dir, path)
    for path in files:
        _trusted(trust.check_file, path)


def _trusted(check, path: str) -> None:
    try:
        check(path, "gpugate state")
    except OSError as exc:
        raise ConfigError("%s: cannot check gpugate state: %s" % (path, exc.strerror or exc)) from None


__all__ = ["Settings", "load_settings", "parse_settings", "ConfigError", "config_path"]
