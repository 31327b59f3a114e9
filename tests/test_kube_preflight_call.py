"""The preflight init container's client (gpugate.node.kube_preflight_call,
`gpugate kube-preflight`) against a real TCP server speaking the agent's
side of the contract: passed and undecided exit 0, failed exits 1; anything
else it could meet (a garbled line, a line too long, a connection closed
early, the wait spent, no agent at all) is undecided, exit 0."""

import json
import socket
import threading
import time

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st

from gpugate.node import kube_preflight_call as call

NODE = "gpu07"


class Agent:
    """One answer per connection: reads the request line, sends ``answer``,
    then holds the connection ``hold`` seconds (or until stopped) and closes it."""

    def __init__(self, answer=b"", hold=0.0, listen_after=0.0, on_request=None):
        """on_request: called with each request line before the answer (an agent's hold)."""
        self.answer, self.hold, self.requests, self.on_request = answer, hold, [], on_request
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))  # bound, not yet listening: a connect is refused
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        if not listen_after:
            self.sock.listen(8)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(listen_after,), daemon=True)
        self.thread.start()

    def _serve(self, listen_after):
        if listen_after:
            time.sleep(listen_after)
            self.sock.listen(8)
        self.sock.settimeout(0.05)
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                self.requests.append(data)
                if self.on_request:
                    self.on_request(data)
                try:
                    conn.sendall(self.answer)
                except OSError:
                    continue
                self.stopping.wait(self.hold)

    def close(self):
        self.stopping.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def agent():
    made = []

    def make(*args, **kwargs):
        made.append(Agent(*args, **kwargs))
        return made[-1]

    yield make
    for one in made:
        one.close()


def lines(*docs):
    return b"".join(json.dumps(d).encode() + b"\n" for d in docs)


def env(address, seconds=5):
    return {"GPUGATE_POD_NAME": "trainer-0", "GPUGATE_POD_NAMESPACE": "ml", "GPUGATE_POD_UID": "u-1",
            "GPUGATE_NODE_NAME": NODE, "GPUGATE_PREFLIGHT_AGENT": address, "GPUGATE_PREFLIGHT_SECONDS": str(seconds)}


def run(address, tmp_path, seconds=5):
    said = []
    code = call.run(env(address, seconds), say=said.append, termination=str(tmp_path / "termination-log"))
    return code, said, json.loads(said[-1])


@pytest.mark.parametrize("verdict,code", [("passed", 0), ("failed", 1), ("undecided", 0)])
def test_each_verdict_and_its_exit_code(agent, tmp_path, verdict, code):
    server = agent(lines({"progress": "own proof: passed"}, {"progress": "gang of 4: pairing"},
                         {"verdict": verdict, "why": "the agent's reason", "node": NODE}))
    got, said, final = run(server.address, tmp_path)
    assert got == code
    assert said[:2] == ["gpugate-preflight: own proof: passed", "gpugate-preflight: gang of 4: pairing"]
    assert final["verdict"] == verdict and final["why"] == "the agent's reason" and final["node"] == NODE
    assert final["pod"] == "trainer-0" and final["namespace"] == "ml"
    assert json.loads(server.requests[0]) == {"namespace": "ml", "pod": "trainer-0", "uid": "u-1"}
    assert server.requests[0].count(b"\n") == 1
    assert json.loads((tmp_path / "termination-log").read_text()) == final


@pytest.mark.parametrize("answer,why", [
    (b"not json\n", "not JSON"),
    (b"[1, 2]\n", "not a JSON object"),
    (lines({"verdict": "broken", "why": "", "node": NODE}), "without verdict"),
    (lines({"verdict": "failed", "node": NODE}), "without verdict"),
    (lines({"verdict": "failed", "why": "x", "node": "gpu99"}), "not this Pod's"),
    (lines({"progress": 3}), "neither progress nor a verdict"),
    (b"\xff\xfe\n", "not JSON"),
    (b"[" * 5000 + b"\n", "not JSON"),
    (lines({"progress": "starting"}), "closed the connection"),
    (b"", "closed the connection"),
    (b'{"progress": "' + b"x" * (call.MAX_LINE + 10) + b'"}\n', "over 65536 bytes"),
    (b'{"verdict": "failed", "why": "' + b"x" * (call.MAX_LINE + 10), "over 65536 bytes"),
])
def test_anything_malformed_is_undecided(agent, tmp_path, answer, why):
    got, _, final = run(agent(answer).address, tmp_path)
    assert (got, final["verdict"]) == (0, "undecided")
    assert why in final["why"]


def test_a_verdict_after_a_garbled_line_is_not_read(agent, tmp_path):
    got, _, final = run(agent(b"garbage\n" + lines({"verdict": "failed", "why": "", "node": NODE})).address,
                        tmp_path)
    assert (got, final["verdict"]) == (0, "undecided")


def test_the_whole_wait_spent_is_undecided(agent, tmp_path):
    server = agent(lines({"progress": "waiting for the gang"}), hold=30)
    started = time.monotonic()
    got, said, final = run(server.address, tmp_path, seconds=1)
    assert (got, final["verdict"]) == (0, "undecided") and "no verdict from the agent in 1s" in final["why"]
    assert 0.9 < time.monotonic() - started < 5
    assert said[0] == "gpugate-preflight: waiting for the gang"


def test_an_agent_not_reachable_is_undecided_after_retrying(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # nobody listens: refused at every try
    started = time.monotonic()
    try:
        got, _, final = run("127.0.0.1:%d" % sock.getsockname()[1], tmp_path, seconds=1.5)
    finally:
        sock.close()
    assert (got, final["verdict"]) == (0, "undecided") and "not reachable" in final["why"]
    assert 1.4 < time.monotonic() - started < 5  # it kept trying for the whole (short) wait


def test_an_agent_that_starts_late_is_reached(agent, tmp_path):
    server = agent(lines({"verdict": "failed", "why": "the gang's culprit", "node": NODE}), listen_after=1.2)
    got, _, final = run(server.address, tmp_path, seconds=10)
    assert (got, final["verdict"]) == (1, "failed")


def test_the_connect_wait_is_capped(monkeypatch, tmp_path):
    monkeypatch.setattr(call, "CONNECT_SECONDS", 1.0)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    started = time.monotonic()
    try:
        got, _, final = run("127.0.0.1:%d" % sock.getsockname()[1], tmp_path, seconds=600)
    finally:
        sock.close()
    assert (got, final["verdict"]) == (0, "undecided") and time.monotonic() - started < 4


@pytest.mark.parametrize("changes,why", [
    ({"GPUGATE_PREFLIGHT_AGENT": ""}, "not set: GPUGATE_PREFLIGHT_AGENT"),
    ({"GPUGATE_POD_UID": ""}, "not set: GPUGATE_POD_UID"),
    ({"GPUGATE_PREFLIGHT_AGENT": "no-port"}, "is not HOST:PORT"),
    ({"GPUGATE_PREFLIGHT_AGENT": "host:99999"}, "is not HOST:PORT"),
])
def test_a_container_not_set_up_is_undecided(tmp_path, changes, why):
    said = []
    code = call.run(dict(env("127.0.0.1:1"), **changes), say=said.append, termination=str(tmp_path / "t"))
    assert code == 0 and why in json.loads(said[-1])["why"]


@pytest.mark.parametrize("seconds", ["inf", "nan", "-5", "0", "abc", "1e309", "86401"])
def test_a_wait_that_is_not_one_is_the_default(agent, tmp_path, seconds):
    server = agent(lines({"verdict": "failed", "why": "x", "node": NODE}))
    said = []
    assert call.run(dict(env(server.address), GPUGATE_PREFLIGHT_SECONDS=seconds), say=said.append,
                    termination=str(tmp_path / "t")) == 1
    assert json.loads(said[-1])["verdict"] == "failed"


def test_an_unforeseen_error_is_undecided(monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(call, "_connect", broken)
    said = []
    assert call.run(env("127.0.0.1:1"), say=said.append, termination=str(tmp_path / "t")) == 0
    assert "a bug" in json.loads(said[-1])["why"]


def test_no_termination_log_outside_a_pod(agent, tmp_path):
    server = agent(lines({"verdict": "passed", "why": "", "node": NODE}))
    said = []
    assert call.run(env(server.address), say=said.append, termination=str(tmp_path / "no" / "such")) == 0
    assert json.loads(said[-1])["verdict"] == "passed"


def test_the_command_exits_with_the_verdict(agent, tmp_path):
    from gpugate.cli.main import main

    server = agent(lines({"progress": "proving"}, {"verdict": "failed", "why": "gpu3 failed", "node": NODE}))
    log = tmp_path / "termination-log"  # where the kubelet's mount would be (never this machine's /dev)
    result = CliRunner().invoke(main, ["kube-preflight"],
                                env=dict(env(server.address), GPUGATE_TERMINATION_LOG=str(log)))
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[0] == "gpugate-preflight: proving"
    assert json.loads(result.output.splitlines()[-1])["why"] == "gpu3 failed"
    assert json.loads(log.read_text()) == json.loads(result.output.splitlines()[-1])


def test_print_init_container_is_the_clients_own():
    import yaml

    from gpugate.cli.main import main

    out = CliRunner().invoke(main, ["kube-preflight", "--print-init-container", "--image", "reg/gpugate:1",
                                    "--agent", "10.0.0.1:9412", "--format", "json"])
    assert out.exit_code == 0, out.output
    container = json.loads(out.output)
    assert container == call.init_container("reg/gpugate:1", "10.0.0.1:9412")
    assert container["command"] == ["gpugate", "kube-preflight"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["runAsUser"] == 65534 and not security["allowPrivilegeEscalation"]
    assert security["capabilities"] == {"drop": ["ALL"]} and "privileged" not in security
    assert "volumeMounts" not in container
    names = {e["name"]: e for e in container["env"]}
    assert names["GPUGATE_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert names["GPUGATE_PREFLIGHT_AGENT"]["value"] == "10.0.0.1:9412"
    as_yaml = CliRunner().invoke(main, ["kube-preflight", "--print-init-container", "--image", "reg/gpugate:1",
                                        "--agent", "10.0.0.1:9412"])
    assert yaml.safe_load(as_yaml.output) == [container]


def _oracle(stream: bytes) -> int:
    """The exit code the contract asks for, read independently: 1 only where the
    first line that is not progress is a complete, well-formed failed verdict for NODE."""
    for line in stream.split(b"\n")[:-1]:
        if len(line) > call.MAX_LINE:
            return 0
        try:
            doc = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError):
            return 0
        if isinstance(doc, dict) and set(doc) == {"progress"} and isinstance(doc["progress"], str):
            continue
        return int(isinstance(doc, dict) and doc.get("verdict") == "failed" and isinstance(doc.get("why"), str)
                   and doc.get("node") == NODE)
    return 0


_LINE = st.one_of(
    st.builds(lambda t: lines({"progress": t}), st.text(max_size=40)),
    st.builds(lambda v, w, n: lines({"verdict": v, "why": w, "node": n}),
              st.sampled_from(["passed", "failed", "undecided", "FAILED", ""]), st.text(max_size=20),
              st.sampled_from([NODE, "gpu08", ""])),
    st.builds(lambda d: lines(d), st.dictionaries(st.sampled_from(["verdict", "why", "node", "progress"]),
                                                  st.one_of(st.text(max_size=8), st.integers(), st.none()))),
    st.binary(max_size=60),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=st.one_of(st.lists(_LINE, max_size=5).map(b"".join), st.binary(max_size=300)))
def test_any_answer_never_crashes_and_fails_only_on_a_failed_verdict(tmp_path, stream):
    server = Agent(stream)
    try:
        said = []
        code = call.run(env(server.address, seconds=2), say=said.append, termination=str(tmp_path / "t"))
    finally:
        server.close()
    final = json.loads(said[-1])
    assert code == (1 if final["verdict"] == "failed" else 0)
    assert code == _oracle(stream), (stream, final)
