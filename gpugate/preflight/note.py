"""The line a job's first node leaves in the job's AdminComment (issue 36):
what its preflight proved, how long it took, and what it decided.  Pure:
the prolog's log record of the preflight in, one ASCII line out."""

_CAP = 240


def job_note(pf: dict, requeued: bool = False) -> str:
    across = pf.get("across") or {}
    parts = []
    seconds = pf.get("seconds") or {}
    for name, label in (("dcgm", "dcgm"), ("rvs", "rvs"), ("allreduce", "all_reduce")):
        if name in seconds:
            parts.append("%s %.1fs" % (label, seconds[name]))
    own = "this node: %s" % (", ".join(parts) or "nothing run")
    if across.get("culprits"):
        verdict = "culprit %s (its prolog drains it and fails: Slurm requeues or ends the job)" % ",".join(
            across["culprits"][:4])
    else:
        verdict = str(across.get("why") or ("passed" if pf.get("passed") else "undecided"))
    text = "gpugate preflight %.1fs: %s; across: %s (%d round%s)%s" % (
        float(pf.get("seconds_total") or 0.0), own, verdict, int(across.get("rounds") or 0),
        "" if across.get("rounds") == 1 else "s", "; requeued once" if requeued else "")
    text = "".join(c if 32 <= ord(c) < 127 else "?" for c in text)
    return text if len(text) <= _CAP else text[:_CAP - 2] + ".."
