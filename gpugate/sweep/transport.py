"""Running gpugate on nodes from the controller: ClusterShell over ssh, or
locally with --node for simulated fleets.  Both return, per node, the JSON
object `gpugate check --json` printed, or an error string."""

import json
import os
import shlex
from typing import Dict, List, Sequence, Union

from .. import trust
from ..errors import CommandError, ConfigError
from ..runner import run

SSH = "/usr/bin/ssh"  # ClusterShell runs it itself (not through runner): checked here

Answer = Union[dict, str]  # the check's JSON object, or why there is none


def _parse(stdout: str) -> Answer:
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                break
            if isinstance(data, dict) and "node" in data:
                return data
    return "no JSON answer in the output: %r" % stdout.strip()[-200:]


class _Transport:
    def check(self, nodes: Sequence[str], args: Sequence[str], timeout: float) -> Dict[str, Answer]:
        """`gpugate check ARGS --json` on each node."""
        return self.run(nodes, ["check"] + list(args), timeout)

    def facts(self, nodes: Sequence[str], max_age: float, timeout: float) -> Dict[str, Answer]:
        """`gpugate facts --json`: the last health check's facts while fresh, else probed."""
        return self.run(nodes, ["facts", "--max-age", "%g" % max_age], timeout)


class LocalTransport(_Transport):
    """gpugate runs here and checks the simulated node named by --node."""

    def __init__(self, gpugate: Sequence[str], config: str = "", fanout: int = 8):
        self.gpugate = list(gpugate)
        self.config = config
        self.fanout = fanout

    def run(self, nodes: Sequence[str], args: Sequence[str], timeout: float) -> Dict[str, Answer]:
        from concurrent.futures import ThreadPoolExecutor

        def one(node: str) -> Answer:
            argv = self.gpugate + list(args) + ["--json", "--node", node]
            if self.config:
                argv += ["--config", self.config]
            try:
                return _parse(run(argv, timeout, ok_codes=(0, 1)).stdout)
            except CommandError as exc:
                return str(exc)
        with ThreadPoolExecutor(max_workers=max(1, min(self.fanout, len(nodes)))) as pool:
            return dict(zip(nodes, pool.map(one, nodes)))


class SshTransport(_Transport):
    """ClusterShell fan-out over ssh, one timeout for the whole batch."""

    def __init__(self, gpugate: Sequence[str], config: str = "", fanout: int = 64):
        self.gpugate = list(gpugate)
        self.config = config
        self.fanout = fanout

    def run(self, nodes: Sequence[str], args: Sequence[str], timeout: float) -> Dict[str, Answer]:
        argv = self.gpugate + list(args) + ["--json"]
        if self.config:
            argv += ["--config", self.config]
        ssh = open_ssh()
        try:
            return self._run(nodes, argv, timeout, ssh)
        finally:
            os.close(ssh)

    def _run(self, nodes: Sequence[str], argv: List[str], timeout: float, ssh: int) -> Dict[str, Answer]:
        from ClusterShell.NodeSet import NodeSet
        from ClusterShell.Task import task_self

        from ..names import check_node_name

        task = task_self()
        task.set_info("fanout", self.fanout)
        # ClusterShell forks without closing fds: ssh runs from the checked file.
        os.set_inheritable(ssh, True)
        task.set_info("ssh_path", "/proc/self/fd/%d" % ssh)
        for node in nodes:
            check_node_name(node, "Slurm node name")  # an ssh target: never an option
            # --node: judge the Slurm node name, whatever the host calls itself.
            # The remote side is a command line for ssh: every word is quoted.
            words = argv + ["--node", node]
            task.shell(" ".join(shlex.quote(a) for a in words), nodes=str(NodeSet(node)), timeout=timeout)
        task.resume()
        out: Dict[str, Answer] = {}
        for buf, names in task.iter_buffers():
            for name in names:
                out[name] = _parse(buf.message().decode("utf-8", "replace"))
        for name in task.iter_keys_timeout():
            out[name] = "timed out after %.0fs" % timeout
        for node in nodes:
            out.setdefault(node, "no answer (ssh failed or printed nothing)")
        return out


def open_ssh() -> int:
    """An fd on the checked ssh, or ConfigError: the sweep stops before it
    asks a node anything (a node without an answer would count as failed)."""
    try:
        return trust.open_executable(SSH, "ssh (the sweep's transport)")
    except OSError as exc:
        raise ConfigError("%s: cannot use ssh for the sweep's transport: %s" % (SSH, exc.strerror or exc)) from None


def make(settings) -> Union[LocalTransport, SshTransport]:
    sweep = settings.sweep
    if sweep["transport"] == "local":
        return LocalTransport(sweep["gpugate"], sweep["remote_config"] or settings.source, int(sweep["fanout"]))
    os.close(open_ssh())  # refuse before the first step, not in the middle of a batch
    return SshTransport(sweep["gpugate"], sweep["remote_config"], int(sweep["fanout"]))


def expand(template: Sequence[str], nodes: List[str]) -> List[str]:
    """An argv template with {node} or {nodes} (a hostlist): one argv."""
    from ClusterShell.NodeSet import NodeSet

    from ..names import check_node_name

    for node in nodes:
        check_node_name(node, "Slurm node name")
    hostlist = str(NodeSet.fromlist(nodes))
    return [word.replace("{nodes}", hostlist).replace("{node}", nodes[0] if len(nodes) == 1 else hostlist)
            for word in template]
