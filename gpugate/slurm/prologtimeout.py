"""How long slurmd must let gpugate's prolog run: the one rule (issue 44,
item 4) that `gpugate slurm-conf` writes and `gpugate audit` holds Slurm to.

slurmd kills a prolog at PrologEpilogTimeout (PrologTimeout from 25.05, which
wins where both are set), then drains the node with its own reason ("Prolog
error") and requeues the job: every node of a preflight job, healthy ones
too, when the meeting across them is slow (a user can make it slow).  The
prolog's worst case, part by part (gpugate.node.prolog):

- the passive gate: ``[budgets] prolog`` (8 s), its drain within it;
- where a preflight can run (a partition listed, or the job word, which
  every job may use: it cannot be switched off, so any job can ask) and has
  something to run: the node's own proof, ``[preflight] timeout_seconds``;
- across the job's nodes, where ``allreduce_multi`` is set: the meeting,
  collective and culprit search end ``across_seconds`` later, counted from
  the same start (gpugate.preflight.cross), then the first node's job note
  and requeue, NOTE_SECONDS (one connection, both calls within it);
- the drain of what the proof found: ``ACT_RESERVE["prolog"]`` (3 s);
- MARGIN_SECONDS: interpreter start and exit, the preflight's counts and
  log line, the meeting's last answer (up to 0.5 s past its deadline) and
  the verdict's (0.5 s).

With the defaults: 8 + 120 + 300 + 5 + 3 + 4 = 440 s with allreduce_multi,
8 + 120 + 3 + 4 = 135 s without.  Never less than DEFAULT, the fragment's
value without a preflight."""

import math
from typing import Mapping, Optional, Tuple

DEFAULT = 120  # seconds: PrologEpilogTimeout when no preflight can run (the gate's 8 s, the epilog's 50)
NOTE_SECONDS = 5.0  # the first node's job note and requeue (gpugate.node.prolog._note_job)
# The prolog's reserve for acting on what its proof found (gpugate.node.check's
# ACT_RESERVE["prolog"]; held equal by tests/test_prolog_timeout.py: slurm/
# stands below node/ and imports nothing of it).
DRAIN_SECONDS = 3.0
MARGIN_SECONDS = 4.0
# scontrol show config's value for "wait forever": NO_VAL16 (unset), INFINITE16.
UNLIMITED = (65534, 65535)


def preflight_runs(cfg: Mapping[str, object]) -> bool:
    """Can a job's prolog run a preflight: someone may ask for one (a
    partition, or the job word), and it has something to run."""
    asked = bool(cfg.get("partitions")) or bool(cfg.get("job_word"))
    work = int(cfg.get("dcgm_level") or 0) > 0 or bool(cfg.get("allreduce")) or bool(cfg.get("allreduce_multi"))
    return asked and work


def worst_case(preflight: Mapping[str, object], budgets: Mapping[str, float]) -> Tuple[float, str]:
    """(seconds, the sum said) the prolog may run at most."""
    parts = [("the gate", float(budgets["prolog"]))]
    if preflight_runs(preflight):
        parts.append(("the node's proof", float(preflight["timeout_seconds"])))
        if preflight.get("allreduce_multi"):
            parts += [("across nodes", float(preflight["across_seconds"])), ("the job note", NOTE_SECONDS)]
    parts += [("the drain", DRAIN_SECONDS), ("a margin", MARGIN_SECONDS)]
    total = sum(seconds for _, seconds in parts)
    return total, " + ".join("%g s %s" % (seconds, what) for what, seconds in parts) + " = %g s" % total


def prolog_timeout(preflight: Mapping[str, object], budgets: Mapping[str, float]) -> int:
    """The PrologEpilogTimeout to set: the worst case, whole seconds, never under DEFAULT."""
    return max(DEFAULT, int(math.ceil(worst_case(preflight, budgets)[0])))


def parse_show_config(text: str) -> Tuple[bool, Optional[int]]:
    """(found, seconds) of the prolog's timeout in `scontrol show config`:
    PrologTimeout where Slurm prints it (25.05+, when it differs from the
    epilog's), else PrologEpilogTimeout; seconds None: no limit."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("PrologTimeout", "PrologEpilogTimeout"):
            values[key.strip()] = value.strip()
    raw = values.get("PrologTimeout", values.get("PrologEpilogTimeout"))
    if raw is None:
        return False, None
    if not raw.isdigit():  # "UNLIMITED", "(null)": no limit
        return True, None
    return True, None if int(raw) in UNLIMITED else int(raw)


def judge(slurm_seconds: Optional[int], needed: int) -> Optional[str]:
    """What to set, when Slurm kills the prolog before its worst case; None when it does not."""
    if slurm_seconds is None or slurm_seconds >= needed:
        return None
    return ("PrologEpilogTimeout=%d (Slurm) is under gpugate's prolog worst case of %d s: slurmd would kill a "
            "preflight's prolog and drain the job's nodes \"Prolog error\"; set PrologEpilogTimeout=%d "
            "(PrologTimeout on 25.05+)" % (slurm_seconds, needed, needed))


def check_slurm(settings) -> dict:
    """For `gpugate audit`: {"slurm": seconds or "unlimited", "needed": N,
    "sum": "...", "short": what to set, or "unread": why Slurm did not say}."""
    from gpugate.errors import GpugateError
    from gpugate.slurm.commands import CommandSlurm

    needed = prolog_timeout(settings.preflight, settings.budgets)
    out = {"needed": needed, "sum": worst_case(settings.preflight, settings.budgets)[1]}
    slurm = CommandSlurm(str(settings.slurm["bin_dir"]), settings.slurm_env, float(settings.slurm["timeout_seconds"]))
    try:
        found, seconds = parse_show_config(slurm.show_config())
    except (GpugateError, OSError) as exc:
        out["unread"] = str(exc)[:200]
        return out
    if not found:
        out["unread"] = "scontrol show config names no PrologEpilogTimeout or PrologTimeout"
        return out
    out["slurm"] = "unlimited" if seconds is None else seconds
    short = judge(seconds, needed)
    if short:
        out["short"] = short
    return out
