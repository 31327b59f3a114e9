"""Where a job's prologs meet for the proof across its nodes (issue 36):
one TCP connection from each node's prolog to the first node's, every
message signed with the drain budget key (gpugate.budgetkey: root's on
every node), so a job's user can neither join, answer for a node, nor
replay an earlier job's messages.

A message is one line, ``MAC BODY``: the MAC (64 hex digits) is
HMAC-SHA256 over the body's bytes as sent, checked before the body is
parsed (a stranger's bytes are never parsed), and the body, JSON, carries
the job id, both sides' random nonces and a sequence number, checked on
receipt.  Lines are capped.  Anything that does not verify or does not come
in time breaks the channel for good (a late answer is never read as the
next one's): that node's part is undecided, never a finding."""

import hashlib
import hmac
import json
import os
import socket
import time
from typing import Optional

from ..errors import GpugateError

LINE_CAP = 256 * 1024  # a rank's output is capped well below (gpugate.preflight.cross)


class MeetError(GpugateError):
    """The meeting broke: a peer gone, a deadline passed, a message that did
    not verify.  What it stops is undecided, never a node's fault."""


def port_for(base: int, slots: int, job: str) -> int:
    """The job's meeting port: two jobs sharing a first node meet apart."""
    return base + (int(job) % slots if job.isdigit() else 0)


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
        self.sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
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
        if first and not self.theirs and isinstance(body.get("src"), str) and len(body["src"]) == 32:
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
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise MeetError("no answer in time") from None
            except OSError as exc:
                raise MeetError("receive: %s" % exc) from None
            if not chunk:
                raise MeetError("the peer closed the connection")
            self._buffer += chunk
            if len(self._buffer) > LINE_CAP and b"\n" not in self._buffer:
                raise MeetError("a message over %d bytes" % LINE_CAP)
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def listen(port: int, host: str = "") -> socket.socket:
    """The first node's listening socket, or MeetError (the port taken: by
    another job's meeting, or anyone's)."""
    try:
        server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, port))
        server.listen(128)
        return server
    except OSError as exc:
        raise MeetError("cannot listen on port %d: %s" % (port, exc)) from None


def connect(host: str, port: int, deadline: float) -> socket.socket:
    """A connection to the first node, tried until the deadline (its prolog
    may start after this one)."""
    last: Optional[Exception] = None
    address = _resolve(host, port, max(0.1, min(5.0, deadline - time.monotonic())))
    while time.monotonic() < deadline:
        try:
            return socket.create_connection(address, timeout=max(0.1, min(2.0, deadline - time.monotonic())))
        except OSError as exc:
            last = exc
            time.sleep(0.1)
    raise MeetError("cannot reach %s port %d: %s" % (host, port, last or "no time left"))


def _resolve(host: str, port: int, seconds: float):
    """(address, port) of the first node, or MeetError: getaddrinfo has no
    timeout of its own, and a resolver that hangs must not hang the prolog
    past slurmd's limit (Slurm would drain the node "Prolog error")."""
    import threading

    found: dict = {}

    def lookup():
        try:
            found["info"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            found["error"] = exc

    worker = threading.Thread(target=lookup, daemon=True)
    worker.start()
    worker.join(seconds)
    if not found.get("info"):
        raise MeetError("cannot resolve %s: %s" % (host, found.get("error") or "no answer in %.0fs" % seconds))
    return found["info"][0][4][:2]


def _mac(key: bytes, text: bytes) -> str:
    return hmac.new(key, text, hashlib.sha256).hexdigest()
