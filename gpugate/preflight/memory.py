"""What a node's preflight found that the node keeps (``preflight.json``
in its state directory): a budgeted finding (a bus bandwidth under the
floor) that only a proof under load shows.  The health check, which runs
no such proof, judges it again from here, so the finding stays published
for the keeper instead of being cleared by the next passive check.

It is forgotten when a later preflight on the whole node passes, after
REMEMBER_SECONDS, and at the next boot (the sweep's repair reboots; its
verification and smoke job prove the node again)."""

import os
import time
from typing import List, Optional

from gpugate.model.findings import Finding
from gpugate.safety import state as st

NAME = "preflight.json"
# The budgeted findings a preflight leaves for the health checks to publish: the node's own
# bandwidth under the floor and deployment tests, and a pin by the run across the job's nodes.
KEPT = ("preflight_busbw", "preflight_setup", "preflight_across")
REMEMBER_SECONDS = 24 * 3600.0
_CAP = 64 << 10


def _path(settings, node: str) -> str:
    return os.path.join(settings.state_dir(node), NAME)


def remember(settings, node: str, budgeted: List[Finding], passed: bool, boot_id: Optional[str],
             now: Optional[float] = None) -> None:
    """After a preflight: keep its budgeted findings, or forget them when
    it passed; anything else (undecided, acute: drained) changes nothing."""
    path = _path(settings, node)
    if budgeted:
        st.write_json(path, {"at": time.time() if now is None else now, "boot_id": boot_id,
                             "findings": [f.to_json() for f in budgeted]})
    elif passed:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def judged(settings, node: str, boot_id: Optional[str], now: Optional[float] = None) -> List[Finding]:
    """The findings a preflight left on this boot within REMEMBER_SECONDS."""
    kept = st.read_json(_path(settings, node), _CAP)
    if not isinstance(kept, dict) or not boot_id or kept.get("boot_id") != boot_id:
        return []
    at = kept.get("at")
    now = time.time() if now is None else now
    if not isinstance(at, (int, float)) or not 0 <= now - at < REMEMBER_SECONDS:
        return []
    found = []
    for item in kept.get("findings") or []:
        try:
            finding = Finding.from_json(item)
        except (KeyError, TypeError, AttributeError):
            continue
        if finding.cls == "health" and finding.component in KEPT:  # its own only
            found.append(finding)
    return found


# What a node's preflights came to, counted for its metrics (the health
# check writes them: gpugate_preflight_runs_total, _seconds_total).
STATS = "preflight-stats.json"
OUTCOMES = ("passed", "acute", "budgeted", "undecided")
# The proof across a job's nodes, counted once per job by its first node
# (the one that decides, gpugate.preflight.cross).
ACROSS = ("passed", "culprit", "undecided", "not_run")


def outcome(findings: List[Finding], undecided: List[str]) -> str:
    if any(f.acute for f in findings):
        return "acute"  # drained at once, the job requeued
    if findings:
        return "budgeted"
    return "undecided" if undecided else "passed"


def count(settings, node: str, result: str, seconds: float, across: str = "") -> None:
    """One more preflight with this outcome.  Two jobs' prologs on one node
    at once take turns (the node's "preflight" lock, a second at most); a
    count that could not have it is written anyway (one lost count beats a
    prolog waiting on another)."""
    from gpugate.errors import GpugateError
    from gpugate.safety.lock import RunLock, lock_path

    lock = RunLock(lock_path(settings.state_dir(node), "preflight"))
    deadline = time.monotonic() + 1.0
    try:
        while not lock.acquire() and time.monotonic() < deadline:
            time.sleep(0.02)
    except (GpugateError, OSError):  # no lock could be had: counted unlocked, as above
        pass
    try:
        before = stats(settings, node) or {"runs": {o: 0 for o in OUTCOMES}, "seconds": 0.0}
        runs, jobs = dict(before["runs"]), dict(before.get("across") or {a: 0 for a in ACROSS})
        runs[result] += 1
        if across:
            jobs[across] += 1
        st.write_json(os.path.join(settings.state_dir(node), STATS),
                      {"runs": runs, "across": jobs, "seconds": round(before["seconds"] + max(seconds, 0.0), 3)},
                      durable=False)
    finally:
        lock.release()


def stats(settings, node: str) -> Optional[dict]:
    """{"runs": {outcome: n}, "across": {outcome: n}, "seconds": s}, or
    None before a first preflight."""
    data = st.read_json(os.path.join(settings.state_dir(node), STATS), _CAP)
    if not isinstance(data, dict) or not isinstance(data.get("runs"), dict):
        return None
    runs = {o: data["runs"].get(o) if isinstance(data["runs"].get(o), int) else 0 for o in OUTCOMES}
    jobs = data.get("across") if isinstance(data.get("across"), dict) else {}
    across = {o: jobs.get(o) if isinstance(jobs.get(o), int) else 0 for o in ACROSS}
    seconds = data.get("seconds") if isinstance(data.get("seconds"), (int, float)) else 0.0
    return {"runs": runs, "across": across, "seconds": seconds}
