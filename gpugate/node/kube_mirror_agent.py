"""`gpugate agent --mirror-from FILE`: the sidecar of a slurmd pod (Slinky,
soperator) that writes the Node from the mirror file slurmd's gpugate
writes (gpugate.kube.mirror).  Its ServiceAccount token is projected into
this container only: no job process, which runs in the slurmd container,
can read it.

It writes what slurmd's gpugate decided, as that gpugate would have
written it on the Node itself (gpugate.kube.paired): gpugate's hold
(taint and record, never a cordon: Slinky's signal) when the file's hold
is written anew (a drain slurmd's gpugate decided: the file's "held"), a
lift only when the file's hold changes to none (the sweep's own hold,
written on the Node by the sweep's token, is never lifted by a file that
merely says nothing; a hold the sweep lifted after its proof is not put
back from a file that still names it, only by a new drain), and the GpugateHealthy condition with the
file's time as its heartbeat (slurmd's checks stopping shows as a stale
heartbeat even while this sidecar runs).  A Node registered anew (another
uid) without gpugate's hold is held again from the file: the hold
survives the Node object.  The file is read every --poll seconds when it
changed, and at least every RECHECK seconds for a Node registered anew."""

from __future__ import annotations

import os
import sys
import time

from gpugate.model import reason as reasons
from gpugate.errors import GpugateError
from gpugate.kube import mirror

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Optional

RECHECK = 10.0


class MirrorAgent:
    def __init__(self, settings, node: str, path: str, poll: float = 2.0, clock=time.monotonic,
                 sleep=time.sleep):
        self.settings, self.node, self.path, self.poll = settings, node, path, float(poll)
        self.clock, self.sleep = clock, sleep
        self.hold: Optional[str] = None  # the file's hold as last applied (None: none yet, since start)
        self.held = -1  # the file's "held" (the seq of its last drain) as last applied
        self.uid = ""  # the Node object it was applied on
        self.written = None  # (seq, uid) of the condition last written
        self.said = ""  # a refusal said once, not every poll

    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        seen, last = None, -RECHECK
        while not stop():
            try:
                st = os.stat(self.path)
                now_seen = (st.st_mtime_ns, st.st_size, st.st_ino)
            except OSError:
                now_seen = None
            if now_seen != seen or self.clock() - last >= RECHECK:
                if self.once():
                    seen = now_seen
                last = self.clock()
            self.sleep(self.poll)

    def once(self) -> bool:
        """Apply the file to the Node; False when it could not be (said, tried again)."""
        from gpugate.kube.nodes import connect

        tag = self.settings.reason_tag
        try:
            record = mirror.read_trusted(self.path, tag)
        except GpugateError as exc:
            return self._say("the mirror file is refused, nothing written: %s" % exc)
        if record is None:
            return True  # slurmd's gpugate has written nothing yet
        try:
            backend = connect(self.settings, timeout=10.0, cordon=False)
        except GpugateError as exc:
            return self._say(str(exc))
        backend.no_execute = False  # NoExecute would evict slurmd's own pod (gpugate.kube.paired)
        try:
            self._apply(backend, record, tag)
        except (GpugateError, ValueError) as exc:
            return self._say("the Node %s was not written: %s" % (self.node, exc))
        finally:
            backend.close()
        self.said = ""
        return True

    def _apply(self, backend, record, tag: str) -> None:
        state = backend.own_record(self.node)
        if state is None:
            raise GpugateError("no Node named %s yet" % self.node)
        uid = str((backend.node_object(self.node).get("metadata") or {}).get("uid") or "")
        hold, ours = record["hold"], reasons.parse(state.reason, tag) is not None
        changed = self.hold is not None and hold != self.hold
        # A Node without gpugate's hold is held from the file when the hold
        # is new to this sidecar (its start, a drain written since) or the
        # Node is another object (registered anew); not when the same Node
        # was lifted since (the sweep's return after its proof).
        fresh = self.hold is None or record["held"] != self.held or uid != self.uid
        if hold and state.reason != hold and ((not ours and fresh) or changed):
            backend.drain(self.node, hold)
        elif not hold and ours and changed and self.hold:
            backend.undrain(self.node)  # slurmd's gpugate lifted its hold
        want = record["condition"]
        if want is not None and self.written != (record["seq"], uid):
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record["at"]))
            backend.write_condition(self.node, want, at)
        self.hold, self.held, self.uid, self.written = hold, record["held"], uid, (record["seq"], uid)

    def _say(self, text: str) -> bool:
        if text != self.said:
            sys.stderr.write("gpugate agent --mirror-from: %s\n" % text[:400])
            self.said = text
        return False
