"""The preflight init container's side of a gang's preflight on Kubernetes
(`gpugate kube-preflight`): it asks the node-local agent
(gpugate.node.kube_preflight) for its Pod's verdict and turns it into an
exit code.  Everything comes from the environment the init container is
given (init_container() writes that container; the chart's
MutatingAdmissionPolicy injects the same one):

    GPUGATE_POD_NAME, GPUGATE_POD_NAMESPACE, GPUGATE_POD_UID   downward API
    GPUGATE_NODE_NAME          spec.nodeName
    GPUGATE_PREFLIGHT_AGENT    HOST:PORT of the node's agent
    GPUGATE_PREFLIGHT_SECONDS  the whole wait (default 900)

The exchange, over one TCP connection: the container sends one line of JSON
{"namespace", "pod", "uid"}; the agent answers with lines of JSON, zero or
more {"progress": text} (printed as they come) and one final
{"verdict": "passed"|"failed"|"undecided", "why": text, "node": name}.

Exit 0 for passed and undecided (a preflight that cannot decide never takes
capacity: the Pod runs), 1 for failed (this node is its gang's culprit:
the Pod fails, its controller makes it anew elsewhere).  Undecided is
whatever else happens: the agent not reachable within the connect wait
(it is retried: it may be starting), a line over MAX_LINE bytes, one that
is not such a JSON object, the connection closed before a verdict, the
whole wait spent, a failed verdict naming another node than this Pod's,
an error of its own.
One JSON line ends the output; the same goes to the kubelet's
terminationMessagePath (/dev/termination-log, or GPUGATE_TERMINATION_LOG:
the testbed kubelet's file) where it is writable."""

import json
import os
import socket
import time

VERDICTS = ("passed", "failed", "undecided")
MAX_LINE = 64 * 1024
DEFAULT_SECONDS = 900.0
MAX_SECONDS = 86400.0  # a longer (or unreadable) wait is taken as the default
CONNECT_SECONDS = 60.0  # at most; never more than the whole wait
RETRY_SECONDS = 0.5
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_MAX = 4096  # what the kubelet keeps of a termination message
CONTAINER_NAME = "gpugate-preflight"
# The env the init container is given: (variable, downward API field).
# In name order: the chart's template writes them so (a Helm dict ranges in key order).
FIELDS = (("GPUGATE_NODE_NAME", "spec.nodeName"), ("GPUGATE_POD_NAME", "metadata.name"),
          ("GPUGATE_POD_NAMESPACE", "metadata.namespace"), ("GPUGATE_POD_UID", "metadata.uid"))
NEEDED = ("GPUGATE_POD_NAME", "GPUGATE_POD_NAMESPACE", "GPUGATE_POD_UID", "GPUGATE_PREFLIGHT_AGENT")


def init_container(image: str, agent: str, seconds: int = int(DEFAULT_SECONDS)) -> dict:
    """The preflight init container, as the chart's policy injects it and as a
    site without the policy API adds it to its own Pod template: unprivileged,
    no volumes, small (deploy/helm/gpugate/templates/preflight.yaml: the same,
    tests/test_kube_preflight_inject.py holds them equal)."""
    env = [{"name": name, "valueFrom": {"fieldRef": {"fieldPath": field}}} for name, field in FIELDS]
    env += [{"name": "GPUGATE_PREFLIGHT_AGENT", "value": agent},
            {"name": "GPUGATE_PREFLIGHT_SECONDS", "value": str(int(seconds))}]
    return {"name": CONTAINER_NAME, "image": image, "command": ["gpugate", "kube-preflight"], "env": env,
            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "allowPrivilegeEscalation": False,
                                "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                                "seccompProfile": {"type": "RuntimeDefault"}}}


def exit_code(verdict: str) -> int:
    return 1 if verdict == "failed" else 0


def _address(agent: str):
    """(host, port) of HOST:PORT or [V6]:PORT; ValueError where it is not one."""
    host, sep, port = agent.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("GPUGATE_PREFLIGHT_AGENT %r is not HOST:PORT" % agent)
    return host.strip("[]"), int(port)


def _connect(address, connect_deadline: float, clock):
    """A connected socket, retried until connect_deadline; None where none was made."""
    last = None
    while True:
        left = connect_deadline - clock()
        if left <= 0:
            return None, last
        try:
            return socket.create_connection(address, timeout=max(0.05, min(left, 5.0))), None
        except OSError as exc:
            last = exc
        time.sleep(max(0.0, min(RETRY_SECONDS, connect_deadline - clock())))


def _verdict(line: bytes, node: str):
    """(kind, value) of one line: ("progress", text), ("verdict", dict), or ("malformed", why)."""
    try:
        doc = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return "malformed", "a line that is not JSON"
    if not isinstance(doc, dict):
        return "malformed", "a line that is not a JSON object"
    if "verdict" in doc:
        verdict, why, named = doc.get("verdict"), doc.get("why"), doc.get("node")
        if verdict not in VERDICTS or not isinstance(why, str) or not isinstance(named, str):
            return "malformed", "a verdict line without verdict, why and node"
        if verdict == "failed" and node and named != node:
            return "malformed", "a failed verdict for node %r, not this Pod's %r" % (named[:200], node)
        return "verdict", {"verdict": verdict, "why": why, "node": named}
    if isinstance(doc.get("progress"), str) and len(doc) == 1:
        return "progress", doc["progress"]
    return "malformed", "a line that is neither progress nor a verdict"


def ask(agent: str, request: dict, seconds: float, node: str = "", say=print, clock=time.monotonic) -> dict:
    """The agent's verdict for the Pod ``request`` names: {"verdict", "why", "node"}
    (undecided, with why, for anything but a well-formed verdict line)."""
    started = clock()
    deadline = started + max(0.0, seconds)

    def undecided(why):
        return {"verdict": "undecided", "why": why, "node": node}

    try:
        address = _address(agent)
    except ValueError as exc:
        return undecided(str(exc))
    sock, error = _connect(address, min(deadline, started + CONNECT_SECONDS), clock)
    if sock is None:
        return undecided("the node agent at %s was not reachable in %.0fs (%s)" % (agent, clock() - started, error))
    buffer = b""
    with sock:
        try:
            sock.settimeout(max(0.05, deadline - clock()))
            sock.sendall(json.dumps(request, sort_keys=True).encode() + b"\n")
            while True:
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if len(line) > MAX_LINE:
                        return undecided("a line from the agent over %d bytes" % MAX_LINE)
                    kind, value = _verdict(line, node)
                    if kind == "verdict":
                        return value
                    if kind == "malformed":
                        return undecided("the agent sent %s" % value)
                    say("gpugate-preflight: %s" % value[:MAX_LINE])
                if len(buffer) > MAX_LINE:
                    return undecided("a line from the agent over %d bytes" % MAX_LINE)
                left = deadline - clock()
                if left <= 0:
                    raise socket.timeout()
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    return undecided("the agent closed the connection before its verdict")
                buffer += chunk
        except socket.timeout:
            return undecided("no verdict from the agent in %.0fs" % seconds)
        except OSError as exc:
            return undecided("the connection to the agent failed (%s)" % exc)


def _write_termination(path: str, text: str) -> None:
    """The kubelet's terminationMessagePath, where it is writable (it is not outside a Pod)."""
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text.encode("utf-8")[:TERMINATION_MAX].decode("utf-8", "ignore"))
    except OSError:
        pass


def run(environ=None, say=print, termination: str = TERMINATION_LOG, clock=time.monotonic) -> int:
    """The init container's whole run: its exit code, one JSON line said last."""
    env = os.environ if environ is None else environ
    termination = env.get("GPUGATE_TERMINATION_LOG") or termination  # the testbed kubelet's mount
    started = clock()
    node = env.get("GPUGATE_NODE_NAME", "")
    request = {"namespace": env.get("GPUGATE_POD_NAMESPACE", ""), "pod": env.get("GPUGATE_POD_NAME", ""),
               "uid": env.get("GPUGATE_POD_UID", "")}
    try:
        seconds = float(env.get("GPUGATE_PREFLIGHT_SECONDS") or DEFAULT_SECONDS)
        if not 0 < seconds <= MAX_SECONDS:  # NaN, infinite, or no wait at all
            raise ValueError
    except ValueError:
        seconds = DEFAULT_SECONDS
    missing = [name for name in NEEDED if not env.get(name)]
    if missing:
        result = {"verdict": "undecided", "why": "not set: %s" % ", ".join(missing), "node": node}
    else:
        try:
            result = ask(env["GPUGATE_PREFLIGHT_AGENT"], request, seconds, node=node, say=say, clock=clock)
        except Exception as exc:  # noqa: BLE001 (whatever else goes wrong here never fails the Pod)
            result = {"verdict": "undecided", "why": "the preflight's client failed: %r" % exc, "node": node}
    final = dict(result, mode="kube-preflight", namespace=request["namespace"], pod=request["pod"],
                 seconds=round(clock() - started, 3))
    line = json.dumps(final, sort_keys=True)
    try:
        say(line)
    except OSError:
        pass  # no stdout (closed): the termination message still says it
    _write_termination(termination, line)
    return exit_code(result["verdict"])
