"""Running gpugate on nodes from the controller: ClusterShell over ssh, or
locally with --node for simulated fleets.  Both return, per node, the JSON
object `gpugate check --json` printed, or an error string."""

import os
import re
import shlex
from typing import Dict, List, Sequence, Union

from gpugate.safety import trust
from gpugate.errors import CommandError, ConfigError
from gpugate.core.jsontext import loads_bounded
from gpugate.safety.runner import MAX_STDERR, MAX_STDOUT, _size, run
from gpugate.model.answers import problem

SSH = "/usr/bin/ssh"  # ClusterShell runs it itself (not through runner): checked here

Answer = Union[dict, str]  # the check's JSON object, or why there is none


def _parse(stdout: str, cap: int = MAX_STDOUT) -> Answer:
    """The node's answer: its last JSON line, within the limits of what the
    controller reads from a node (jsontext.loads_bounded, answers.problem).
    Anything else is this node's error text, never an exception: one node's
    answer cannot stop the others' (issue 33)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                data = loads_bounded(line, max_chars=cap, expect=dict)
            except ValueError as exc:
                return "unreadable answer (%s): %r" % (str(exc)[:200], line[:100])
            if "node" in data:
                return problem(data) or data
    return "no JSON answer in the output: %r" % stdout.strip()[-200:]


parse_output = _parse  # the node agent on Kubernetes reads its own command's output the same way


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

    def run(self, nodes: Sequence[str], args: Sequence[str], timeout: float,
            max_stdout: int = 0) -> Dict[str, Answer]:
        from concurrent.futures import ThreadPoolExecutor

        def one(node: str) -> Answer:
            argv = self.gpugate + list(args) + ["--json", "--node", node]
            if self.config:
                argv += ["--config", self.config]
            try:
                caps = {"max_stdout": max_stdout} if max_stdout else {}  # an evidence bundle: its own cap
                return _parse(run(argv, timeout, ok_codes=(0, 1), **caps).stdout, max_stdout or MAX_STDOUT)
            except CommandError as exc:
                return str(exc)
        with ThreadPoolExecutor(max_workers=max(1, min(self.fanout, len(nodes)))) as pool:
            return dict(zip(nodes, pool.map(one, nodes)))


class SshTransport(_Transport):
    """ClusterShell fan-out over ssh, one timeout for the whole batch."""

    def __init__(self, gpugate: Sequence[str], config: str = "", fanout: int = 64, ssh_config: str = "",
                 connect_timeout: int = 10):
        self.gpugate = list(gpugate)
        self.config = config
        self.fanout = fanout
        self.ssh_config = ssh_config
        self.connect_timeout = connect_timeout

    def run(self, nodes: Sequence[str], args: Sequence[str], timeout: float,
            max_stdout: int = 0) -> Dict[str, Answer]:
        argv = self.gpugate + list(args) + ["--json"]
        if self.config:
            argv += ["--config", self.config]
        fds = [open_ssh()]
        try:
            if self.ssh_config:
                fds.append(open_ssh_config(self.ssh_config))
            return self._run(nodes, argv, timeout, fds, max_stdout)
        finally:
            for fd in fds:
                os.close(fd)

    def _run(self, nodes: Sequence[str], argv: List[str], timeout: float, fds: List[int],
             max_stdout: int = 0) -> Dict[str, Answer]:
        """max_stdout: each node's output cap (0: runner's 16 MiB).  ssh's own
        stderr goes to the same stream (ssh_failure reads it), so one cap
        holds both; a node over it is killed and its answer says so, as
        runner.py's overflow does: the sweeper (root, holding its lock and
        reservation) keeps no more than the cap of any node's answer."""
        from ClusterShell.NodeSet import NodeSet
        from ClusterShell.Task import task_self

        from gpugate.core.names import check_node_name

        task = task_self()
        task.set_info("fanout", self.fanout)
        task.set_info("connect_timeout", self.connect_timeout)
        # ClusterShell forks without closing fds: ssh runs from the checked file.
        os.set_inheritable(fds[0], True)
        task.set_info("ssh_path", "/proc/self/fd/%d" % fds[0])
        # ssh closes every fd above 2 as it starts, so -F names the checked
        # file by its resolved path: every directory on it is root's alone.
        config = os.readlink("/proc/self/fd/%d" % fds[1]) if len(fds) > 1 else ""
        task.set_info("ssh_options", "-F %s" % shlex.quote(config) if config else "")
        workers = []
        for node in nodes:
            check_node_name(node, "Slurm node name")  # an ssh target: never an option
            # --node: judge the Slurm node name, whatever the host calls itself.
            # The remote side is a command line for ssh: every word is quoted.
            words = argv + ["--node", node]
            worker = capped_ssh_worker()(NodeSet(node), handler=None, timeout=timeout, stderr=False,
                                         command=" ".join(shlex.quote(a) for a in words))
            worker.caps = {worker.SNAME_STDOUT: max_stdout or MAX_STDOUT, worker.SNAME_STDERR: MAX_STDERR}
            worker.set_write_eof()  # nothing for its stdin
            task.schedule(worker)
            workers.append(worker)
        task.resume()
        out: Dict[str, Answer] = {}
        for worker in workers:
            for name, (sname, cap) in worker.overflow.items():
                out[name] = ("%s: printed more than %s on %s; killed (no answer kept)"
                             % (argv[0], _size(cap), sname))
        codes = {name: rc for rc, names in task.iter_retcodes() for name in names}
        for buf, names in task.iter_buffers():
            for name in names:
                if name not in out:  # not killed for its size
                    out[name] = answer(name, buf.message().decode("utf-8", "replace"), codes.get(name),
                                       max_stdout or MAX_STDOUT)
        for name in task.iter_keys_timeout():
            out[name] = "timed out after %.0fs (ssh connected or not, no answer in time)" % timeout
        for node in nodes:
            out.setdefault(node, ssh_failure(node, "", codes.get(node)) or
                           "no answer (ssh exited %s and printed nothing)" % codes.get(node))
        return out


_CAPPED = []  # the worker class, made once ClusterShell is imported


def capped_ssh_worker():
    """ClusterShell's ssh worker whose clients count every byte read from a
    node, per stream (partial lines too: ClusterShell buffers a line until
    its newline), and kill that node's ssh once over worker.caps[stream],
    naming it in worker.overflow {node: (stream, cap)}."""
    if _CAPPED:
        return _CAPPED[0]
    from ClusterShell.Worker.Ssh import SshClient, WorkerSsh

    class _Overflow(Exception):
        pass

    class CappedSshClient(SshClient):
        def _read(self, sname, size=65536):
            data = SshClient._read(self, sname, size)
            seen = self.__dict__.setdefault("_gpugate_seen", {})
            seen[sname] = seen.get(sname, 0) + len(data)
            cap = self.worker.caps.get(sname, MAX_STDOUT)
            if seen[sname] > cap:
                self.worker.overflow[str(self.key)] = (sname, cap)
                raise _Overflow()
            return data

        def _handle_read(self, sname):
            try:
                SshClient._handle_read(self, sname)
            except _Overflow:
                self.abort()  # kills ssh; as safe here as Worker.abort() from ev_read

    class CappedWorkerSsh(WorkerSsh):
        SHELL_CLASS = CappedSshClient

        def __init__(self, *args, **kwargs):
            self.caps: Dict[str, int] = {}
            self.overflow: Dict[str, tuple] = {}
            WorkerSsh.__init__(self, *args, **kwargs)

    _CAPPED.append(CappedWorkerSsh)
    return CappedWorkerSsh


# What ssh (OpenSSH) prints when it cannot run the command on the node.
_UNREACHABLE = ("Connection refused", "Connection timed out", "No route to host", "Could not resolve hostname",
                "Network is unreachable", "Connection closed by", "Connection reset by", "Permission denied",
                "Name or service not known", "connect to host")


def ssh_failure(node: str, output: str, rc) -> str:
    """Why ssh did not run gpugate on the node (exit 255), or "" when it did.
    Pure: the transport's answer for the audit (UNREACHABLE) and the sweep."""
    if rc != 255:
        return ""
    # ssh names itself by its argv[0]: /proc/self/fd/N prints as "N: ".
    lines = [re.sub(r"^[0-9]+: ", "ssh: ", line.strip()) for line in output.splitlines()
             if line.strip() and not line.startswith("@@@")]
    if "Host key verification failed" in output:
        return ("host key verification failed: %s's host key is not the one its known_hosts file holds, so "
                "ssh refused to connect and nothing ran there. If the node was reinstalled, replace its key "
                "(ssh-keygen -R %s -f KNOWN_HOSTS, then add the new one); otherwise someone may be "
                "answering in its place" % (node, node))
    said = next((line for line in lines if any(m in line for m in _UNREACHABLE)), lines[-1] if lines else "")
    return "unreachable: ssh failed (exit 255): %s" % (said[:200] or "no message")


def answer(node: str, output: str, rc, cap: int = MAX_STDOUT) -> Answer:
    """One node's answer: the JSON object, or why there is none."""
    return ssh_failure(node, output, rc) or _parse(output, cap)


def open_ssh() -> int:
    """An fd on the checked ssh, or ConfigError: the sweep stops before it
    asks a node anything (a node without an answer would count as failed)."""
    try:
        return trust.open_executable(SSH, "ssh (the sweep's transport)")
    except OSError as exc:
        raise ConfigError("%s: cannot use ssh for the sweep's transport: %s" % (SSH, exc.strerror or exc)) from None


def open_ssh_config(path: str) -> int:
    """An fd on the checked [sweep] ssh_config (it names keys, known_hosts
    and commands ssh runs: root's alone, like ssh itself)."""
    try:
        return trust.open_file(path, "[sweep] ssh_config")
    except OSError as exc:
        raise ConfigError("%s: cannot read [sweep] ssh_config: %s" % (path, exc.strerror or exc)) from None


def make(settings) -> Union[LocalTransport, SshTransport]:
    sweep = settings.sweep
    from gpugate.schedulers.registry import transport_maker

    own = transport_maker(sweep["transport"])
    if own is not None:  # the scheduler's own channel (Kubernetes: the node agent, on the Node object: no ssh)
        return own(settings)
    if sweep["transport"] == "local":
        return LocalTransport(sweep["gpugate"], sweep["remote_config"] or settings.source, int(sweep["fanout"]))
    os.close(open_ssh())  # refuse before the first step, not in the middle of a batch
    if sweep["ssh_config"]:
        os.close(open_ssh_config(sweep["ssh_config"]))
    return SshTransport(sweep["gpugate"], sweep["remote_config"], int(sweep["fanout"]), sweep["ssh_config"],
                        int(sweep["connect_timeout"]))


def expand(template: Sequence[str], nodes: List[str]) -> List[str]:
    """An argv template with {node} or {nodes} (a hostlist): one argv."""
    from ClusterShell.NodeSet import NodeSet

    from gpugate.core.names import check_node_name

    for node in nodes:
        check_node_name(node, "Slurm node name")
    hostlist = str(NodeSet.fromlist(nodes))
    return [word.replace("{nodes}", hostlist).replace("{node}", nodes[0] if len(nodes) == 1 else hostlist)
            for word in template]
