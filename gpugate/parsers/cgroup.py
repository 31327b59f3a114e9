"""Which Slurm job a process is in, from /proc/PID/cgroup, and whether
Slurm confines each job to its own GPUs (cgroup.conf ConstrainDevices).

Slurm's layouts (src/plugins/cgroup, 22.05 to 25.11):

- cgroup v2: ``0::/system.slice/slurmstepd.scope/job_201/step_0/user/task_0``
  (the slice is CgroupSlice, default system.slice; ``<node>_slurmstepd.scope``
  where one host runs several slurmd; a step's slurmstepd itself sits in
  ``.../job_201/step_0/slurm``);
- cgroup v1: one line per hierarchy, ``7:freezer:/slurm/uid_1000/job_201/step_0/task_0``
  (CgroupPrepend, default ``/slurm``; the slurmstepd in the step's freezer
  cgroup, proctrack/cgroup).

Pure: text in, job id out.
"""

import re
from typing import Optional

from gpugate.errors import ParseError

_KEY_VALUE = re.compile(r'(?:^|\s)([A-Za-z0-9_.]+)\s*=\s*(?:("[^"]*")|([^\s"]\S*))(?=\s|$)')
_MAX_JOB = 0xFFFFFFFD  # Slurm's job ids are uint32; the top values are NO_VAL and friends


def slurm_job(text: str) -> Optional[int]:
    """The Slurm job whose cgroup holds the process, or None for a process
    in no job.  A path below a user's own delegated subtree (user.slice,
    ``user@UID.service``: systemd lets the user make cgroups there, named as
    they like) is no job's.  Raises ParseError on a malformed line, no line,
    or lines that name different jobs: unknown, never "no job"."""
    jobs = set()
    lines = [line for line in text.split("\n") if line]
    if not lines:
        raise ParseError("/proc/PID/cgroup: empty")
    for line in lines:
        hierarchy, sep1, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep1 and sep2 and hierarchy.isdigit() and hierarchy.isascii() and path.startswith("/")):
            raise ParseError("/proc/PID/cgroup: not hierarchy:controllers:path: %r" % line[:120])
        if controllers.startswith("name="):
            continue  # a named v1 hierarchy (systemd's own): Slurm makes none
        job = _job_in(path.split("/")[1:], v2=hierarchy == "0" and not controllers)
        if job is not None:
            jobs.add(job)
    if len(jobs) > 1:
        raise ParseError("/proc/PID/cgroup: lines name different jobs (%s)" % ", ".join(map(str, sorted(jobs))))
    return jobs.pop() if jobs else None


def _job_in(parts, v2: bool) -> Optional[int]:
    for i, part in enumerate(parts[:-1]):
        if part == "user.slice" or part.startswith("user@"):
            return None  # the user's own subtree: any name can be made there
        if v2:
            anchor = part == "slurmstepd.scope" or part.endswith("_slurmstepd.scope")
        else:
            anchor = _number(part, "uid_") is not None
        if anchor:
            return _number(parts[i + 1], "job_")
    return None


def _number(part: str, prefix: str) -> Optional[int]:
    """N of "<prefix>N" as Slurm writes it (%u: no sign, no leading zero)."""
    digits = part[len(prefix):]
    if not part.startswith(prefix) or not digits.isdigit() or not digits.isascii() or len(digits) > 10:
        return None
    if digits != "0" and digits.startswith("0"):
        return None
    value = int(digits)
    return value if value <= _MAX_JOB else None


def conf_value(text: str, name: str) -> Optional[str]:
    """KEY=VALUE of a Slurm configuration file (slurm.conf, cgroup.conf):
    the last one wins, as in Slurm; keys are case-insensitive; None when absent."""
    value = None
    for line in text.splitlines():
        # Slurm's parse_config.c: key, spaces, "=", spaces, a "quoted value" or a word; several on a line
        for key, quoted, word in _KEY_VALUE.findall(line.split("#", 1)[0]):
            if key.lower() == name.lower():
                value = quoted[1:-1] if quoted else word
    return value


def constrain_devices(text: str) -> bool:
    """cgroup.conf confines jobs to their devices: ConstrainDevices=yes, or
    another of Slurm's words for true (parse_value.c s_p_handle_boolean:
    yes, up, true, 1; absent: no, Slurm's default), and the cgroup plugin
    not disabled."""
    return (conf_value(text, "ConstrainDevices") or "").lower() in ("yes", "up", "true", "1") and \
        (conf_value(text, "CgroupPlugin") or "").lower() != "disabled"
