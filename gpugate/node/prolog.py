"""Prolog: the fast gate before every job.

Healthy path: reuse the last health check (when fresh), re-read only what
can change between runs and matters to this job (NVML answers, GPU count,
Xid/ECC/remap of the job's GPUs), record the job's start counters for the
epilog, exit 0.  No controller RPC.  Unfit: drain with the precise reason,
then exit 1 so Slurm requeues the job.  A job whose partition or own
comment asks for a preflight (gpugate.preflight) gets this node's active
proof after the gate passed."""

import os
import time

from gpugate.node.jobenv import job_gpus


def run(settings, node: str, record: dict, reader=None) -> int:
    deadline = time.monotonic() + float(settings.budgets["prolog"])
    gpus = job_gpus()
    # NVML first: the child reads the job's GPUs while this process loads
    # the judges (hence the imports below, not above).
    nvml = reader
    if nvml is None:
        from gpugate.node.prolog_reader import start_reader

        nvml = start_reader()  # None: no fork now; the collection forks (and reports) on its own
    if nvml is not None:
        try:
            nvml.send({"sim_fleet": settings.sim_fleet, "node": node, "gpus": gpus, "sim_dir": _sim_dir(settings, node)})
        except OSError:  # the child is gone: the collection forks (and reports) on its own
            nvml.cancel()
            nvml = None
    from gpugate.judges import lost
    from gpugate.judges.job import start_counters
    from gpugate.probes import files
    from gpugate.safety import state as st
    from gpugate.node.act import settle
    from gpugate.node.check import run_check
    from gpugate.node.hold import HELD
    from gpugate.probes.reuse import fresh_baseline, last_state, reset_cursor

    job_id = os.environ.get("SLURM_JOB_ID", "")
    record["job"] = job_id
    boot_id = files.boot_id(settings.node_root(node))
    last = last_state(settings, node)
    if last and last.get("pending_drain") and last.get("boot_id") == boot_id:
        # The health check found the node unfit but could not drain it
        # (slurmctld was away): no job starts here meanwhile.
        if nvml is not None:
            nvml.cancel()
        if last.get("config_error"):
            record["config_error"] = last["config_error"]  # judged with the last good copy
        return _refuse(settings, node, record, last, deadline)
    baseline, cursor = fresh_baseline(settings, node, last, boot_id)
    cursor = max(cursor, reset_cursor(settings, node, boot_id))  # not the sweep's own GPU reset again
    record["reused"] = baseline is not None
    if baseline is not None and last.get("config_error"):
        record["config_error"] = last["config_error"]  # judged with the last good copy
    if baseline is None:
        from gpugate.node.lastgood import load_baseline

        baseline = load_baseline(settings, record, node)  # on an error, the entry point cancels the reader
    high, expected = lost.high_for(last or {}, baseline.vendor_for(node)), baseline.expect_for(node).gpus
    result = run_check(settings, baseline, node, "prolog", xid_after=cursor, gpus=gpus, nvml_started=nvml,
                       extra=lambda facts: lost.judge(high, expected, facts))
    facts = result.facts
    if job_id:
        try:
            st.write_json(st.job_path(settings.state_dir(node), job_id), {
                "job": job_id, "at": time.time(), "boot_id": boot_id if isinstance(boot_id, str) else None,
                "kmsg_seq": facts.kernel_log_seq, "gpus": gpus, "counters": start_counters(facts)},
                durable=False)  # losing it in a crash only loses the epilog's deltas
        except OSError as exc:
            record["state_error"] = str(exc)[:200]
    settle(settings, node, result, record, deadline)
    if record.get("action") == HELD:
        return 0  # the drain budget keeps this node in service: so does its job
    if result.verdict.fit:
        return _preflight(settings, baseline, node, gpus, result, record)
    # Unfit: exit 1 whether or not our drain went through, so Slurm requeues
    # the job (and drains the node itself, "Prolog error", if ours failed).
    return result.verdict.exit_code


def _sim_dir(settings, node: str) -> str:
    """A simulated node's files this run reads (gpugate.model.simview), for the NVML reader forked before."""
    if not settings.sim_fleet:
        return ""
    from gpugate.model.simview import node_dir

    return node_dir(settings.sim_fleet, node)


def _preflight(settings, baseline, node: str, gpus, gate, record: dict) -> int:
    """The job's preflight, where a partition or the job asks for it
    (gpugate.preflight): this node's own proof, after the passive gate
    passed.  Acted on as the gate's verdict is: an acute finding drains and
    exits 1 (Slurm requeues the job), a budgeted one is published and the
    job runs, an undecided proof lets the job run."""
    cfg, env = settings.preflight, os.environ
    word = cfg["job_word"]
    if not (set(env.get("SLURM_JOB_PARTITION", "").split(",")) & set(cfg["partitions"])
            or word in env.get("SLURM_JOB_COMMENT", "") or word in env.get("SLURM_JOB_EXTRA", "")):
        return 0  # nobody asked: every job's case, and nothing more is loaded for it
    from gpugate.preflight.select import wanted

    run_it, why = wanted(cfg, env)
    if why:
        record["preflight"] = {"why": why}
    if not run_it:
        return 0
    from gpugate.preflight import memory
    from gpugate.preflight.node import prove
    from gpugate.preflight.select import exclusive_gpus
    from gpugate.probes import files
    from gpugate.model.verdict import decide
    from gpugate.node.act import settle
    from gpugate.node.check import ACT_RESERVE, CheckResult
    from gpugate.node.hold import HELD

    started = time.monotonic()
    gpus = gpus or exclusive_gpus(env, baseline.expect_for(node).gpus)
    proof = prove(settings, baseline, node, gpus, started + float(settings.preflight["timeout_seconds"]))
    passed = not proof.findings and not proof.undecided
    record["preflight"] = dict(proof.to_json(), why=why, passed=passed)
    across = _across(settings, baseline, node, gpus, proof, started)
    if across is not None:
        record["preflight"]["across"] = across.to_json()
        record["preflight"]["undecided"] = list(proof.undecided)  # its environment's, where it failed
        if across.finding is not None:
            proof.findings.append(across.finding)
    record["preflight"]["seconds_total"] = round(time.monotonic() - started, 3)
    if across is not None and across.first:
        _note_job(settings, record, _requeue_once(settings, across))
    boot_id = files.boot_id(settings.node_root(node))
    try:  # the health check judges a budgeted finding again, and writes the counts (gpugate.preflight.memory)
        memory.remember(settings, node, [f for f in proof.findings if not f.acute], passed and proof.floor_judged,
                        boot_id if isinstance(boot_id, str) else None)
        memory.count(settings, node, memory.outcome(proof.findings, proof.undecided),
                     record["preflight"]["seconds_total"], across=across.counted() if across is not None else "")
    except OSError as exc:
        record["state_error"] = str(exc)[:200]
    if not proof.findings:
        return 0
    judged = CheckResult(gate.facts, decide(proof.findings, settings.reason_tag))
    settle(settings, node, judged, record, time.monotonic() + ACT_RESERVE["prolog"])
    if record.get("action") == HELD:
        return 0
    return judged.verdict.exit_code


def _across(settings, baseline, node: str, gpus, proof, started: float):
    """The all_reduce across the job's nodes (gpugate.preflight.cross), where
    the site set ``[preflight] allreduce_multi`` and the job has two nodes
    or more; None otherwise."""
    from gpugate.preflight import memory
    from gpugate.preflight.cross import Member, prove_across, run_rank_command
    from gpugate.preflight.environment import UNFIT
    from gpugate.preflight.environment import check as check_environment
    from gpugate.preflight.select import job_nodes

    nodes = job_nodes(os.environ)
    if not settings.preflight["allreduce_multi"] or len(nodes) < 2 or node not in nodes:
        return None
    # A node whose GPUs for the job are unknown still comes to the meeting
    # (as not whole): the others hear at once that no collective runs.
    gpus, whole = gpus or [], baseline.expect_for(node).gpus
    own = memory.outcome(proof.findings, proof.undecided)
    # Its environment before it joins: one that a job's user can have spoilt (a full /dev/shm or /tmp,
    # another job on the node) makes the run undecided, and this node never a suspect.
    unfit = check_environment(settings, node, os.environ) if own != "acute" else ""
    if unfit:
        proof.undecided.append("environment: %s" % unfit)
        own = UNFIT
    me = Member(node, own, bool(gpus) and whole is not None and len(gpus) >= whole,
                baseline.expect_for(node).product or "")
    run_rank = run_rank_command(settings, node, gpus, baseline.vendor_for(node) == "amd")
    return prove_across(settings, baseline, os.environ.get("SLURM_JOB_ID", ""), nodes, me, run_rank, started)


def _requeue_once(settings, across) -> bool:
    """The job is requeued on its first start only: where a node was pinned
    (its pin is budgeted: published for the keeper, so the culprit may
    still be in service and the job would run on it), and, with
    ``[preflight] undecided = "requeue_once"``, where a collective failed
    with no node pinned."""
    if os.environ.get("SLURM_JOB_RESTART_COUNT") != "0":
        return False
    return bool(across.culprits) or (settings.preflight["undecided"] == "requeue_once" and across.failed)


def _note_job(settings, record: dict, requeue: bool) -> None:
    """The job's first node says in the job's AdminComment what was proved
    and how long it took (one RPC per preflighted job, none per node), and
    requeues it where the site asked; a failure is only logged."""
    from gpugate.errors import GpugateError
    from gpugate.preflight.note import job_note
    from gpugate.slurm import connect

    job = os.environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return
    pf = record["preflight"]
    from gpugate.slurm.prologtimeout import NOTE_SECONDS

    try:  # both calls within NOTE_SECONDS: a part of the prolog's worst case (PrologEpilogTimeout)
        slurm = connect(settings, deadline=time.monotonic() + NOTE_SECONDS)
    except (GpugateError, OSError) as exc:
        pf["note_error"] = str(exc)[:200]
        return
    try:
        if requeue:
            try:
                slurm.requeue_job(job)
                pf["requeued"] = True
            except (GpugateError, OSError) as exc:  # e.g. a --no-requeue job: the note still says what was found
                pf["requeue_error"] = str(exc)[:200]
        try:
            slurm.note_job(job, job_note(pf, requeued=bool(pf.get("requeued"))))
        except (GpugateError, OSError) as exc:
            pf["note_error"] = str(exc)[:200]
    finally:
        slurm.close()


def _refuse(settings, node: str, record: dict, last: dict, deadline: float) -> int:
    from gpugate.model.findings import Finding
    from gpugate.model.verdict import decide
    from gpugate.node.act import act
    from gpugate.node.hold import HELD, UNPUBLISHED, applies

    findings = [Finding.from_json(f) for f in last.get("findings", [])]
    verdict = decide(findings, settings.reason_tag)

    outcome = act(settings, node, verdict, deadline=deadline)
    held = outcome["action"] == HELD or (not outcome["ok"] and applies(settings, verdict))
    record.update(verdict="unfit", cls=verdict.cls, reason=verdict.reason, action=HELD if held else outcome["action"],
                  why=outcome.get("why") if outcome["action"] == HELD
                  else UNPUBLISHED if held
                  else "the last health check's drain is still pending")
    return 0 if held else 1
