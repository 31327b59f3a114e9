"""Slurm on Kubernetes with no writable token where jobs run (Slinky,
soperator).  slurmd's gpugate (health check, prolog, epilog) runs in the
slurmd container, beside the jobs it forks; a ServiceAccount token there
would be any job's to read.  So with ``[kubernetes] mirror_file`` set,
slurmd's gpugate writes no Node: what it would write (gpugate's hold, its
reason, the GpugateHealthy condition) goes into the mirror file, on a volume
it shares with a sidecar container of the same pod; the sidecar (`gpugate
agent --mirror-from FILE`, gpugate.node.kube_mirror_agent) alone has a token,
projected into its own container only, and writes the Node.

``MirrorFile`` stands in for gpugate.kube.nodes.KubeNodes inside
gpugate.kube.paired.PairedNodes on the node side: the Slurm side and its
rules are unchanged; the Node's hold as this node last wrote it is read
back from the file.  The file is root's (0644 in a 0755 directory: a job's
user can neither write nor replace it); the sidecar reads it only through
gpugate.safety.trust (every directory on the way and the file owned by root, not
writable by others) and only when it has gpugate's shape (``parse``)."""

from __future__ import annotations

import os
import stat
import time

from gpugate.model import reason as reasons
from gpugate.errors import GpugateError
from gpugate.core.jsontext import loads_bounded
from gpugate.slurm.nodestate.record import NodeState
from gpugate.kube import condition as cond

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional

VERSION = 1
CAP = 16 << 10  # a reason (<= 255 bytes), a condition message (<= 1024): far below


class MirrorFileError(GpugateError):
    """The mirror file is not one gpugate wrote: nothing is written on the Node."""


def path_for(template: str, node: str) -> str:
    return template.replace("{node}", node)


def parse(data, tag: str) -> Dict[str, Any]:
    """The mirror record, checked; MirrorFileError when it is not gpugate's shape."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise MirrorFileError("not a gpugate mirror record (version %d)" % VERSION)
    hold, seq, at = data.get("hold"), data.get("seq"), data.get("at")
    if not isinstance(hold, str) or (hold and reasons.parse(hold, tag) is None):
        raise MirrorFileError("its hold is not a gpugate reason: %r" % str(hold)[:100])
    held = data.get("held", 0)  # the seq of the write that last held (a drain decided anew)
    for count in (seq, held):
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise MirrorFileError("its seq is not a count")
    if not isinstance(at, (int, float)) or isinstance(at, bool) or not 0 <= at < 1e10:
        raise MirrorFileError("its time is not a time")
    want = data.get("condition")
    if want is not None:
        if not (isinstance(want, list) and len(want) == 3 and all(isinstance(w, str) for w in want)
                and want[0] in ("True", "False", "Unknown") and cond.REASON_RE.match(want[1])
                and len(want[1]) <= cond.REASON_MAX and len(want[2]) <= 1024):
            raise MirrorFileError("its condition is not GpugateHealthy's shape")
    return {"hold": hold, "seq": seq, "held": held, "at": float(at), "condition": tuple(want) if want else None,
            "node": str(data.get("node") or "")}


def read_trusted(path: str, tag: str) -> Optional[Dict[str, Any]]:
    """The sidecar's read: None while there is no file yet; MirrorFileError
    when it (or a directory above it) could be someone else's, or is not
    gpugate's shape."""
    from gpugate.safety.safeio import read_fd
    from gpugate.safety.trust import Untrusted, open_file

    try:
        fd = open_file(path, "the mirror file")
    except FileNotFoundError:
        return None
    except (Untrusted, OSError) as exc:
        raise MirrorFileError(str(exc)[:300]) from None
    try:
        text = read_fd(fd, CAP, path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise MirrorFileError("%s: %s" % (path, exc)) from None
    finally:
        os.close(fd)
    try:
        return parse(loads_bounded(text), tag)
    except ValueError as exc:
        raise MirrorFileError("%s: not JSON: %s" % (path, exc)) from None


class MirrorFile:
    """The node side's mirror: PairedNodes' ``kube`` where slurmd's
    gpugate holds no token.  ``template``: [kubernetes] mirror_file."""

    name = "mirror-file"

    def __init__(self, template: str, tag: str, clock=time.time):
        self.template, self.tag, self.clock = template, tag, clock

    def close(self) -> None:
        return None

    def _read(self, node: str) -> Dict[str, Any]:
        from gpugate.safety.state import read_json

        data = read_json(path_for(self.template, node), CAP)
        try:
            return parse(data, self.tag)
        except MirrorFileError:
            return {"hold": "", "seq": 0, "held": 0, "at": 0.0, "condition": None}

    def own_record(self, node: str) -> NodeState:
        """The Node's hold as this node last wrote it (the sidecar writes it there)."""
        hold = self._read(node)["hold"]
        return NodeState(name=node, state="IDLE", flags=frozenset({"DRAIN"} if hold else ()), reason=hold,
                         reason_time=None, reason_user="", partitions=(), comment="")

    def drain(self, node: str, reason: str) -> None:
        self._write(node, hold=reason, held=None)  # held: this write's seq

    def undrain(self, node: str) -> None:
        self._write(node, hold="")

    def report_verdict(self, node: str, verdict, state) -> None:
        held = state.reason if state is not None and verdict.fit and reasons.parse(
            state.reason, self.tag) is not None else ""
        pending = "; ".join(reasons.render_finding(f) for f in verdict.notes) if verdict.fit else ""
        self._write(node, condition=list(cond.wanted(verdict.fit, verdict.cls, verdict.reason, self.tag, held,
                                                     pending)))

    def _write(self, node: str, **change) -> None:
        from gpugate.safety.state import write_json

        path = path_for(self.template, node)
        _close_directory(os.path.dirname(path))
        old = self._read(node)
        record = {"version": VERSION, "node": node, "hold": old["hold"], "seq": old["seq"] + 1, "held": old["held"],
                  "at": round(self.clock(), 3), "condition": list(old["condition"]) if old["condition"] else None}
        record.update(change)
        if record["held"] is None:
            record["held"] = record["seq"]
        try:
            write_json(path, record)
        except OSError as exc:
            raise MirrorFileError("the mirror file %s could not be written: %s" % (path, exc)) from None


def _close_directory(directory: str) -> None:
    """The shared volume as the kubelet makes an emptyDir is 0777: closed
    to 0755 (ours) before the first write, so no job's user can put a file
    of theirs in its place.  Made when absent.  A sticky one (as /tmp)
    stays as it is: there no one else can replace the file."""
    from gpugate.safety.safeio import makedirs

    makedirs(directory)
    st = os.lstat(directory)
    if (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o022
            and not st.st_mode & stat.S_ISVTX):  # (a sticky directory, /tmp's kind, is left as it is)
        os.chmod(directory, 0o755)
