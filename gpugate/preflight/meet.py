"""Where a job's prologs meet for the proof across its nodes (issue 36):
one TCP connection from each node's prolog to the first node's, every
message signed with the drain budget key (gpugate.safety.budgetkey: root's on
every node), so a job's user can neither join, answer for a node, nor
replay an earlier job's messages.

A message is one line, ``MAC BODY``: the MAC (64 hex digits) is
HMAC-SHA256 over the body's bytes as sent, checked before the body is
parsed (a stranger's bytes are never parsed), and the body, JSON, carries
the job id, both sides' random nonces and a sequence number, checked on
receipt.  Lines are capped.  Anything that does not verify or does not come
in time breaks the channel for good (a late answer is never read as the
next one's): that node's part is undecided, never a finding.

Anyone may connect (issue 44): the ports are drawn from the job id under
the key, so no user can tell which; rank 0 listens on IPv6 and IPv4 and
serves every connection side by side, each with its own deadline, and
drops a stranger at its first byte that cannot begin a signed line."""

import errno
import hashlib
import hmac
import json
import os
import selectors
import socket
import time
from typing import Callable, Dict, List, Sequence, Tuple

from gpugate.errors import GpugateError

LINE_CAP = 256 * 1024  # a rank's output is capped well below (gpugate.preflight.cross)
JOIN_CAP = 4096  # a join is a few hundred bytes: a stranger's connection holds no more before it is dropped
HELLO_SECONDS = 2.0  # from a connection's accept to its verified join
PENDING_CAP = 256  # connections waiting for their join at once (file descriptors)
TRIES = 3  # ports per job: another job's meeting or a taken port costs a try, not the meeting
_HEX = frozenset(b"0123456789abcdef")


class MeetError(GpugateError):
    """The meeting broke: a peer gone, a deadline passed, a message that did
    not verify.  What it stops is undecided, never a node's fault."""


def ports_for(base: int, slots: int, job: str, key: bytes, tries: int = TRIES) -> List[int]:
    """The job's meeting ports in [base, base + slots), in the order tried:
    drawn from the job id under the key, so every node of the job finds the
    same ones and no user can (a job id is public, the key root's)."""
    out: List[int] = []
    for i in range(8 * tries):
        if len(out) >= min(tries, slots):
            break
        digest = hmac.new(key, ("gpugate-meet %s %d" % (job, i)).encode(), hashlib.sha256).digest()
        port = base + int.from_bytes(digest[:8], "big") % slots
        if port not in out:
            out.append(port)
    return out


def nonce() -> str:
    return os.urandom(16).hex()


class Channel:
    """One signed conversation over a connected socket."""

    def __init__(self, sock: socket.socket, key: bytes, job: str):
        self.sock, self.key, self.job = sock, key, job
        self.ours, self.theirs = nonce(), ""
        self.sent = self.received = 0
        self.broken = ""  # why, once a send or receive failed: nothing more is read or sent
        self._buffer = b""

    def send(self, kind: str, deadline: float, **fields) -> None:
        if self.broken:
            raise MeetError("the channel broke earlier: %s" % self.broken)
        self.sent += 1
        body = dict(fields, kind=kind, job=self.job, seq=self.sent, src=self.ours, dst=self.theirs)
        text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        try:
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            self.sock.sendall(_mac(self.key, text).encode() + b" " + text + b"\n")
        except OSError as exc:
            raise self._break("send %s: %s" % (kind, exc)) from None

    def receive(self, deadline: float, first: bool = False) -> dict:
        """The next verified body.  ``first``: the peer's nonce is learnt
        from this message (the greeting or the join), then held to."""
        if self.broken:
            raise MeetError("the channel broke earlier: %s" % self.broken)
        try:
            return self._verified(self._line(deadline), first)
        except MeetError as exc:
            raise self._break(str(exc)) from None

    def feed(self, data: bytes, cap: int) -> bool:
        """Bytes read by the caller (rank 0's meeting, gather); True once a
        whole line is here.  MeetError, and the channel closed, at the first
        byte that cannot begin a signed line or past ``cap`` bytes."""
        self._buffer += data
        try:
            _plausible(self._buffer, cap)
        except MeetError as exc:
            raise self._break(str(exc)) from None
        return b"\n" in self._buffer

    def _verified(self, line: bytes, first: bool) -> dict:
        mac, _, text = line.partition(b" ")
        if not hmac.compare_digest(_mac(self.key, text).encode(), mac):
            raise MeetError("a message that does not verify (not signed with this site's drain budget key)")
        try:
            body = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise MeetError("an unreadable message: %s" % str(exc)[:100]) from None
        if not isinstance(body, dict):
            raise MeetError("an unreadable message: not an object")
        if body.get("job") != self.job:
            raise MeetError("a message for job %r, not %s" % (str(body.get("job"))[:20], self.job))
        if first and not self.theirs:
            if not (isinstance(body.get("src"), str) and len(body["src"]) == 32):
                raise MeetError("a first message without its sender's nonce")
            self.theirs = body["src"]
        self.received += 1
        if body.get("src") != self.theirs or body.get("seq") != self.received:
            raise MeetError("a message out of order or replayed")
        if body.get("dst") not in ("", self.ours) or (self.received > 1 and body.get("dst") != self.ours):
            raise MeetError("a message meant for another conversation")
        return body

    def _break(self, why: str) -> MeetError:
        self.broken = why[:200]
        self.close()
        return MeetError(why)

    def _line(self, deadline: float) -> bytes:
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MeetError("no answer in time")
            try:
                self.sock.settimeout(left)
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise MeetError("no answer in time") from None
            except OSError as exc:
                raise MeetError("receive: %s" % exc) from None
            if not chunk:
                raise MeetError("the peer closed the connection")
            self._buffer += chunk
            _plausible(self._buffer, LINE_CAP)
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _plausible(buffer: bytes, cap: int) -> None:
    """MeetError unless ``buffer`` can begin with a signed line: 64 hex
    digits and a space, within ``cap`` bytes to its end of line."""
    head = buffer[:65]
    if any(c not in _HEX for c in head[:64]) or (len(head) == 65 and head[64] != 0x20):
        raise MeetError("a message that does not verify (not a signed line)")
    if b"\n" not in buffer[:cap + 1] and len(buffer) > cap:
        raise MeetError("a message over %d bytes" % cap)


def listen(ports: Sequence[int]) -> Tuple[List[socket.socket], int]:
    """Rank 0's listening sockets on the first of ``ports`` free, and that
    port; MeetError when every one is taken (by other jobs' meetings, or
    anyone's)."""
    last: Exception = MeetError("no port")
    for port in ports:
        try:
            return _bind(port), port
        except OSError as exc:
            last = exc
    raise MeetError("cannot listen on port %s: %s" % ("/".join(str(p) for p in ports), last))


def _bind(port: int) -> List[socket.socket]:
    """IPv6 and IPv4 alike, wherever a name resolves either way: one
    dual-stack socket, else one of each, else IPv4 alone (no IPv6 here)."""
    try:
        return [_server(socket.AF_INET6, port, v6only=False)]
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise
    servers = [_server(socket.AF_INET, port)]
    try:
        servers.append(_server(socket.AF_INET6, port, v6only=True))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:  # someone holds IPv6's side: a user's port is no meeting
            servers[0].close()
            raise
    return servers


def _server(family: int, port: int, v6only=None) -> socket.socket:
    server = socket.socket(family, socket.SOCK_STREAM)
    try:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if v6only is not None:
            if not hasattr(socket, "IPV6_V6ONLY"):
                raise OSError(errno.ENOPROTOOPT, "no IPV6_V6ONLY")
            server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
        server.bind(("::" if family == socket.AF_INET6 else "", port))
        server.listen(4096)  # the kernel caps it at somaxconn: a flood of strangers queues, joiners still do
        server.setblocking(False)
        return server
    except OSError:
        server.close()
        raise


def gather(servers: Sequence[socket.socket], key: bytes, job: str, until: float,
           admit: Callable[[dict], str], kept: Callable[[Channel, dict], bool]) -> None:
    """Rank 0's side until ``until``: every connection served side by side,
    each given HELLO_SECONDS from its accept to a verified join; a stranger's
    is dropped at its first byte that cannot begin a signed line, its first
    line that does not verify, JOIN_CAP bytes, or its deadline.  With
    PENDING_CAP waiting, the oldest of the address that holds most is dropped
    (a node's own comes again).  ``admit``: why a verified join is refused
    ("" to welcome it); ``kept``: the welcomed channel, True once all came."""
    chooser = selectors.DefaultSelector()
    pending: Dict[socket.socket, Tuple[Channel, float, str]] = {}

    def drop(sock):
        chooser.unregister(sock)
        pending.pop(sock)[0].close()

    try:
        for server in servers:
            chooser.register(server, selectors.EVENT_READ)
        while time.monotonic() < until:
            now = time.monotonic()
            for sock in [s for s, (_, t, _) in pending.items() if t <= now]:
                drop(sock)
            wake = min([until] + [t for _, t, _ in pending.values()])
            for ready, _ in chooser.select(max(0.01, wake - now)):
                if ready.data is None:
                    for sock, channel, peer in _accepted(ready.fileobj, key, job):
                        if len(pending) >= PENDING_CAP:
                            drop(_crowded(pending))
                        pending[sock] = (channel, time.monotonic() + HELLO_SECONDS, peer)
                        chooser.register(sock, selectors.EVENT_READ, channel)
                    continue
                sock, channel = ready.fileobj, ready.data
                try:
                    body = _join_read(sock, channel, admit)
                except MeetError:
                    drop(sock)
                    continue
                if body is None:
                    continue
                chooser.unregister(sock)
                del pending[sock]
                try:
                    channel.send("welcome", time.monotonic() + 1.0)
                except MeetError:
                    continue  # closed: that node comes again, or does not
                if kept(channel, body):
                    return
    finally:
        for sock in list(pending):
            drop(sock)
        chooser.close()


def _accepted(server: socket.socket, key: bytes, job: str):
    """The connections waiting on ``server`` (a bounded batch), each greeted."""
    for _ in range(64):
        try:
            sock, peer = server.accept()
        except OSError:  # none left (EAGAIN), or one that went away before its accept
            return
        channel = Channel(sock, key, job)
        try:
            channel.send("greeting", time.monotonic() + 0.5)
        except MeetError:
            continue
        yield sock, channel, str(peer[0])


def _join_read(sock: socket.socket, channel: Channel, admit: Callable[[dict], str]):
    """A readable waiting connection: its verified join, None for more to
    come, MeetError to drop it."""
    try:
        sock.settimeout(0.5)  # readable: recv returns at once
        data = sock.recv(JOIN_CAP)
    except OSError as exc:
        raise MeetError("receive: %s" % exc) from None
    if not data:
        raise MeetError("the peer closed the connection")
    if not channel.feed(data, JOIN_CAP):
        return None
    body = channel.receive(time.monotonic() + 0.1, first=True)
    why = admit(body) if body.get("kind") == "join" else "not a join"
    if why:
        raise MeetError(why)
    return body


def _crowded(pending: Dict[socket.socket, Tuple[Channel, float, str]]) -> socket.socket:
    """The oldest waiting connection of the address holding the most."""
    counts: Dict[str, int] = {}
    for _, _, peer in pending.values():
        counts[peer] = counts.get(peer, 0) + 1
    worst = max(counts, key=counts.get)
    return min((t, i, s) for i, (s, (_, t, peer)) in enumerate(pending.items()) if peer == worst)[2]


def join(host: str, ports: Sequence[int], key: bytes, job: str, join_by: float, deadline: float,
         hello: Callable[[], dict]) -> Channel:
    """This node's place at rank 0's meeting: a connection to one of
    ``ports`` at any address ``host`` resolves to (IPv6 or IPv4) whose
    greeting verifies, this node's join (``hello()``'s fields) and rank 0's
    welcome; tried again until ``join_by`` (rank 0 may listen later; a port
    held by someone else, or a connection dropped before its welcome, costs
    one try)."""
    addresses = _resolve(host, max(0.1, min(5.0, join_by - time.monotonic())))
    last = "no time left"
    while time.monotonic() < join_by:
        for port in ports:
            try:
                sock = _connect_any(addresses, port, join_by)
            except OSError as exc:
                last = "port %d: %s" % (port, exc)
                continue
            channel = Channel(sock, key, job)
            step = min(deadline, time.monotonic() + HELLO_SECONDS)
            try:
                if channel.receive(step, first=True).get("kind") != "greeting":
                    raise MeetError("not a greeting")
                channel.send("join", step, **hello())
                if channel.receive(step).get("kind") != "welcome":
                    raise MeetError("not a welcome")
                return channel
            except MeetError as exc:
                last = "port %d: %s" % (port, exc)
                channel.close()
        time.sleep(0.1)
    raise MeetError("cannot join at %s port %s: %s" % (host, "/".join(str(p) for p in ports), last))


def _connect_any(addresses, port: int, until: float) -> socket.socket:
    """A connection to the first of ``addresses`` that answers, each tried
    for at most 2 s."""
    last: OSError = OSError("no address")
    for family, address in addresses:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(0.05, min(2.0, until - time.monotonic())))
            sock.connect((address[0], port) + tuple(address[2:]))
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last


def _resolve(host: str, seconds: float) -> List[Tuple[int, tuple]]:
    """Every (family, address) of the first node, or MeetError: getaddrinfo
    has no timeout of its own, and a resolver that hangs must not hang the
    prolog past slurmd's limit (Slurm would drain the node "Prolog error")."""
    import threading

    found: dict = {}

    def lookup():
        try:
            found["info"] = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
        except OSError as exc:
            found["error"] = exc

    worker = threading.Thread(target=lookup, daemon=True)
    worker.start()
    worker.join(seconds)
    out: List[Tuple[int, tuple]] = []
    for family, _, _, _, address in found.get("info") or ():
        if family in (socket.AF_INET, socket.AF_INET6) and (family, address) not in out:
            out.append((family, address))
    if not out:
        raise MeetError("cannot resolve %s: %s" % (host, found.get("error") or "no answer in %.0fs" % seconds))
    return out


def _mac(key: bytes, text: bytes) -> str:
    return hmac.new(key, text, hashlib.sha256).hexdigest()
