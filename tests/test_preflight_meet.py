"""The meeting of a job's prologs (gpugate.preflight.meet, issue 44): a
job's user can connect to it from anywhere, so it must hold against
strangers that connect in a loop, hold connections open or send garbage;
its ports must be the key's to know; it must serve IPv6 as IPv4; its
channel must refuse replays, reordering, other conversations and other
jobs; and the run's token must never be on a command line."""

import json
import os
import socket
import threading
import time

import pytest

from gpugate.preflight import meet
from gpugate.preflight.cross import run_rank_command
from gpugate.preflight.meet import Channel, MeetError
from test_preflight_across import NODES, _job, _settings, _sim, fleet8  # noqa: F401 - fleet8 is a fixture

KEY = bytes(range(32))
PEER = "ab" * 16


def _stranger(port, stop, held, said):
    """A job's user at the meeting port: connections opened and held silent
    (each cost the old meeting 2 s, one at a time), and a loop of connects
    sending unsigned lines and garbage."""
    while not stop.is_set() and len(held) < 40:
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=1))
        except OSError:
            time.sleep(0.01)
    lines = (b'{"kind": "join", "job": "4242", "node": "gpu02", "seq": 1}\n', b"\x00" * 70 + b"\n",
             b"0" * 64 + b" " + b"[" * 3000 + b"\n", b"GET / HTTP/1.1\r\n\r\n")
    while not stop.is_set():
        for line in lines:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(line)
                    said.append(s.recv(4096))
            except OSError:
                time.sleep(0.01)


def test_a_stranger_looping_connects_at_the_port_does_not_hide_the_bad_node(settings_for, fleet8, tmp_path):
    """The stranger knows the port (ports = 1: the worst case) and starts
    first; the job's other nodes come 1.5 s later, behind its connections.
    The meeting serves them side by side: the slow node is still pinned."""
    _sim(fleet8, "gpu03", "smoke=pair-slow")
    settings = _settings(settings_for, fleet8, tmp_path)
    stop, held, said = threading.Event(), [], []
    threads = [threading.Thread(target=_stranger, args=(settings.preflight["port"], stop, held, said))]
    threads[0].start()
    try:
        out = _job(settings, NODES[:4], others_after=1.5)
    finally:
        stop.set()
        threads[0].join(30)
        for s in held:
            s.close()
    assert [n for n, a in out.items() if a.finding] == ["gpu03"], out
    assert len(held) == 40 and said, (len(held), said[:3])  # the stranger was there throughout
    assert "busbw=17." in out["gpu03"].finding.observed  # a bandwidth read and held to the floor
    assert all(a.culprits == ("gpu03",) for a in out.values())


def _has_ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_the_meeting_is_served_where_rank_0_resolves_to_ipv6_only(settings_for, fleet8, tmp_path):
    out = _job(_settings(settings_for, fleet8, tmp_path, rendezvous_host="::1"), NODES[:3])
    assert set(out) == set(NODES[:3])
    assert all(a.ran and a.why.startswith("passed: 3 nodes") for a in out.values()), out


def test_a_joiner_tries_every_address_rank_0_resolves_to(settings_for, fleet8, tmp_path, monkeypatch):
    """rank 0's name resolves first to an address that does not answer
    (another interface, a stale record), then to the one that does."""
    real = socket.getaddrinfo

    def resolver(host, *args, **kwargs):
        if host != "rank0.test":
            return real(host, *args, **kwargs)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.0.2.1", args[0] if args else 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", args[0] if args else 0))]

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    out = _job(_settings(settings_for, fleet8, tmp_path, rendezvous_host="rank0.test"), NODES[:3])
    assert all(a.ran and a.why.startswith("passed: 3 nodes") for a in out.values()), out


def test_the_meeting_ports_are_the_keys_to_know():
    """All nodes of a job find the same ports; another key (a user's guess)
    finds others for most jobs; every port lies in [port, port + ports)."""
    other = bytes(32)
    jobs = [str(j) for j in range(1000, 1200)]
    mine = {j: meet.ports_for(7150, 64, j, KEY) for j in jobs}
    assert all(meet.ports_for(7150, 64, j, KEY) == mine[j] for j in jobs)
    assert all(len(set(p)) == len(p) == 3 and all(7150 <= x < 7214 for x in p) for p in mine.values())
    same = sum(meet.ports_for(7150, 64, j, other)[0] == mine[j][0] for j in jobs)
    assert same < 20, same  # 1 in 64 by chance
    assert len({p[0] for p in mine.values()}) > 40  # spread over the range, not job id % ports
    assert meet.ports_for(7150, 1, "7", KEY) == [7150]


def test_a_taken_port_costs_one_try(settings_for, fleet8, tmp_path):
    """A user (or another job's meeting) holds the job's first port on rank
    0's node: rank 0 listens on the next, and the joiners find it there."""
    from gpugate.safety.budgetkey import load

    squatter = socket.socket()
    for attempt in range(50):  # a range whose first port is free here (other tests' sockets come and go)
        settings = _settings(settings_for, fleet8, tmp_path, ports=64,
                             port=20000 + (os.getpid() * 7 + attempt * 131) % 20000)
        first = meet.ports_for(settings.preflight["port"], 64, "4242", load(settings))[0]
        try:
            squatter.bind(("127.0.0.1", first))
            break
        except OSError:
            continue
    with squatter:
        squatter.listen(8)
        out = _job(settings, NODES[:3])
    assert all(a.ran and a.why.startswith("passed: 3 nodes") for a in out.values()), out


# The channel's checks, on a socket pair: what reaches rank 0 from anyone.

def _line(body, key=KEY):
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return meet._mac(key, text).encode() + b" " + text + b"\n"


@pytest.fixture
def pair():
    ours, theirs = socket.socketpair()
    channel = Channel(ours, KEY, "42")
    yield channel, theirs
    channel.close()
    theirs.close()


def _body(channel, seq, **over):
    return dict({"kind": "join", "job": "42", "seq": seq, "src": PEER, "dst": channel.ours}, **over)


def _receive(channel, first=False):
    return channel.receive(time.monotonic() + 2, first=first)


def test_a_replayed_message_breaks_the_channel(pair):
    channel, peer = pair
    peer.sendall(_line(_body(channel, 1)) * 2)
    assert _receive(channel, first=True)["seq"] == 1
    with pytest.raises(MeetError, match="out of order or replayed"):
        _receive(channel)
    with pytest.raises(MeetError, match="broke earlier"):  # for good: nothing more is read
        _receive(channel)


def test_a_message_out_of_order_breaks_the_channel(pair):
    channel, peer = pair
    peer.sendall(_line(_body(channel, 1)) + _line(_body(channel, 3)))
    _receive(channel, first=True)
    with pytest.raises(MeetError, match="out of order"):
        _receive(channel)


def test_a_message_of_another_conversation_or_sender_is_refused(pair):
    channel, peer = pair
    peer.sendall(_line(_body(channel, 1)) + _line(_body(channel, 2, dst="cd" * 16)))
    _receive(channel, first=True)
    with pytest.raises(MeetError, match="another conversation"):
        _receive(channel)
    ours, theirs = socket.socketpair()
    other = Channel(ours, KEY, "42")
    theirs.sendall(_line(_body(other, 1)) + _line(_body(other, 2, src="ef" * 16)))
    _receive(other, first=True)
    with pytest.raises(MeetError, match="out of order"):
        _receive(other)
    theirs.close()


def test_a_first_message_without_its_senders_nonce_is_refused(pair):
    channel, peer = pair
    peer.sendall(_line(_body(channel, 1, src="")))
    with pytest.raises(MeetError, match="nonce"):
        _receive(channel, first=True)


def test_a_message_for_another_job_is_refused(pair):
    channel, peer = pair
    peer.sendall(_line(_body(channel, 1, job="43")))
    with pytest.raises(MeetError, match="for job '43'"):
        _receive(channel, first=True)


def test_deeply_nested_json_in_a_signed_body_is_a_meet_error(pair):
    channel, peer = pair
    text = b"[" * 100000 + b"]" * 100000
    peer.sendall(meet._mac(KEY, text).encode() + b" " + text + b"\n")
    with pytest.raises(MeetError, match="unreadable"):
        _receive(channel, first=True)


def test_an_over_long_line_and_an_unsigned_one_are_refused(pair):
    channel, peer = pair
    sender = threading.Thread(target=lambda: peer.sendall(b"0" * 64 + b" " + b"x" * (meet.LINE_CAP + 10)))
    sender.start()
    with pytest.raises(MeetError, match="over"):
        _receive(channel, first=True)
    sender.join(10)
    ours, theirs = socket.socketpair()
    unsigned = Channel(ours, KEY, "42")
    theirs.sendall(_line(_body(unsigned, 1), key=bytes(32)))
    with pytest.raises(MeetError, match="does not verify"):
        _receive(unsigned, first=True)
    theirs.close()


# The run's token: in the environment, never on a command line.

def test_the_token_is_never_in_argv(settings_for, fleet8, tmp_path, monkeypatch):
    import gpugate.safety.runner
    from gpugate.core.record import replace
    from gpugate.safety.runner import Result

    settings = _settings(settings_for, fleet8, tmp_path)
    cfg = dict(settings.preflight, allreduce_multi=("/bin/true", "{rank}", "--token={token}", "{token}"))
    seen = []

    def run(argv, timeout, env=None, **kwargs):
        seen.append((list(argv), dict(env)))
        return Result(tuple(argv), 0, "", "")

    monkeypatch.setattr(gpugate.safety.runner, "run", run)
    token = os.urandom(16).hex()
    rank = run_rank_command(replace(settings, preflight=cfg), "gpu01", [0, 1], False)
    rank({"rank": 1, "nranks": 2, "root": "gpu02", "port": 7151, "nodes": "gpu02,gpu01", "token": token},
         time.monotonic() + 5)
    argv, env = seen[0]
    assert argv[:2] == ["/bin/true", "1"] and not any(token in word for word in argv), argv
    assert env["GPUGATE_PREFLIGHT_TOKEN"] == token


def test_a_command_that_asks_for_the_token_on_its_command_line_is_refused():
    from gpugate.model.config import parse_settings
    from gpugate.errors import ConfigError

    with pytest.raises(ConfigError, match="GPUGATE_PREFLIGHT_TOKEN"):
        parse_settings({"preflight": {"allreduce_multi": ["/opt/gpugate/allreduce-rank", "--token={token}"]}},
                       "(test)")
    parse_settings({"preflight": {"allreduce_multi": ["/opt/gpugate/allreduce-rank", "{rank}", "{port}"]}}, "(test)")
