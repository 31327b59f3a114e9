"""The GPUs' history of application Xids, kept in the state directory
(gpugate.judges.apprepeat judges it): the epilog records its job's and
judges, the health check judges.  A file that cannot be read or written
never fails a run: the history restarts (said in the log line)."""

import os

from ..judges import apprepeat
from . import state as st

FILE = "xid-history.json"
CAP = 1024 * 1024  # MAX_GPUS x (MAX_JOBS entries + MAX_SEEN keys) of a few dozen bytes fit below


def _path(settings, node: str) -> str:
    return os.path.join(settings.state_dir(node), FILE)


def after_job(settings, node: str, facts, job: str, user: str, gpus, policy, record: dict) -> list:
    """The epilog: add this job's application Xids on its own GPUs (host
    indices; None: slurmd did not say which, and nothing is recorded: on a
    shared node an Xid must not count for a job that did not hold its GPU),
    then judge."""
    path = _path(settings, node)
    before = st.read_json(path, CAP)
    if job and gpus is None:
        record["xid_history"] = "the job's GPUs unknown (no SLURM_JOB_GPUS): its Xids not recorded"
    history = apprepeat.record(before, facts, job, user, gpus, facts.collected_at, policy)
    if history != before and (history["gpus"] or before):
        try:
            st.write_json(path, history, durable=False)  # losing it in a crash loses only history
        except OSError as exc:
            record["state_error"] = ("xid history: %s" % exc)[:200]
    return apprepeat.judge(history, facts, facts.collected_at, policy)


def judged(settings, node: str, facts, policy) -> list:
    """The health check: what the history says (it records nothing: it
    does not know which job an Xid came from)."""
    return apprepeat.judge(st.read_json(_path(settings, node), CAP), facts, facts.collected_at, policy)
