"""`scontrol show node`'s text for a made-up fleet, as each release's
slurm_sprint_node_table prints it: a record recorded from the real
release (tests/fixtures/slurm/RELEASE/libslurm-show-node.json, an idle
node's) with the node's name, state, partitions, reason and comment put
where sprint puts them (src/api/node_info.c).  For the tests and the
benchmark of gpugate.slurm.nodestate.show_fleet; the real command's text
is read in tests/test_slurm_fleet_read.py."""

import json
import os
from typing import Iterable

_FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "tests", "fixtures", "slurm")
RELEASES = ("22.05", "24.11", "25.11", "26.05")


def template(release: str) -> str:
    """The release's record of an idle node without reason or comment (gpu01's)."""
    with open(os.path.join(_FIXTURES, release, "libslurm-show-node.json")) as handle:
        text = json.load(handle)["gpu01"]["text"]
    lines = text[:-2].split("\n")
    kept = [line for line in lines if not line.startswith(("   Reason=", "   Comment=", "   Partitions="))]
    return "\n".join(kept) + "\n\n"


class Records:
    """Renders records on one release's template."""

    def __init__(self, release: str):
        text = template(release)
        head, rest = text.split(" ", 1)  # "NodeName=gpu01", the rest of the record
        state_at = rest.index("\n   State=") + len("\n   State=")
        state_end = rest.index(" ", state_at)
        line_end = rest.index("\n", state_end)
        self.before_state = rest[:state_at]
        self.after_state = rest[state_end:line_end + 1]  # " ThreadsPerCore=... MCS_label=N/A\n"
        self.tail = rest[line_end + 1:-2]  # "   BootTime=... AveWatts=0" (no final line break)

    def record(self, name: str, state: str, partitions=(), reason: str = "", reason_time=None,
               reason_user: str = "root", comment=None, mcs_label=None, features=None, extra=None) -> str:
        """One record: state as scontrol prints it ("IDLE+DRAIN"; a reboot
        asked prints NextState), the reason's time as epoch seconds
        (SLURM_TIME_FORMAT=%s); mcs_label (a job's, on the node it runs
        on), features (AvailableFeatures) and extra (Extra) as written."""
        before = self.before_state
        if features is not None:
            before = before.replace("AvailableFeatures=(null)", "AvailableFeatures=" + features, 1)
        after = self.after_state
        if mcs_label is not None:
            after = after.replace("MCS_label=N/A", "MCS_label=" + mcs_label, 1)
        out = ["NodeName=", name, " ", before, state, after]
        if "REBOOT" in state:
            out.append("   NextState=RESUME\n")
        if partitions:
            out += ["   Partitions=", ",".join(partitions), " \n"]
        out.append(self.tail)
        if reason:  # strtok_r on line breaks: each further line ten spaces in
            lines = [line for line in reason.split("\n") if line]
            out += ["\n   Reason=", lines[0] if lines else ""]
            if reason_time is not None:
                out.append(" [%s@%d]" % (reason_user, reason_time))
            out += ["\n          " + line for line in lines[1:]]
        if comment is not None:
            out += ["\n   Comment=", comment]
        if extra is not None:
            out += ["\n   Extra=", extra]
        out.append("\n\n")
        return "".join(out)


def fleet_text(release: str, nodes: Iterable[dict]) -> str:
    """The text of every node (each a dict of Records.record's arguments)."""
    records = Records(release)
    return "".join(records.record(**node) for node in nodes)
