"""The proof across a job's nodes (issue 36, docs/explanation/preflight-design.md): after each
node's own proof, the job's prologs meet at its first node (rank 0,
gpugate.preflight.meet), run ``[preflight] allreduce_multi`` as one
collective over every node, and, when it fails, halve and re-pair until
one node is pinned (gpugate.preflight.culprit).  Rank 0 decides; every
node hears its verdict; the culprit's prolog publishes its pin
(``preflight_across``, budgeted: a job's user can slow a shared link) for
the keeper, rank 0 requeues the job once, and every prolog exits 0.

Each rank of a collective runs the site's command as root with an
environment of gpugate's making: the job's GPUs, and where to meet
(GPUGATE_PREFLIGHT_RANK, _NRANKS, _ROOT, _PORT, _NODES; the same as
``{rank}``, ``{nranks}``, ``{root}``, ``{port}``, ``{nodes}`` in its argv;
_TOKEN, the run's secret, in the environment only).
Rank 0 of a group judges its output as the sweep's pair job is judged,
against the baseline's ``[smoke] min_pair_busbw_gbps`` for the product.

What cannot be decided pins nothing: a node that does not come, a node
whose own proof already failed (Slurm requeues the job for it), a node
whose environment failed before it joined (gpugate.preflight.environment),
a job on part of a node's GPUs (another job's traffic shares the fabric),
a command that cannot run, an abort, an exit code without a result, a
hang, a meeting that breaks: only a result read and held to a rule (wrong
values, a bandwidth under the floor) fails a run."""

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from gpugate.model.findings import HEALTH, INVESTIGATE, Finding
from gpugate.core.record import dataclass
from gpugate.preflight import culprit as search_mod
from gpugate.preflight.environment import UNFIT
from gpugate.preflight.meet import Channel, MeetError, gather, join, listen, ports_for

ACROSS_COMPONENT = "preflight_across"  # a culprit's finding (budgeted: gpugate.model.findings.USER_CAUSED)
_OUTPUT_CAP = 32 * 1024  # characters: a JSON-escaped answer stays under meet.LINE_CAP
_JOIN_GRACE = 15.0  # a peer's own proof ends within its timeout; prologs start within seconds


@dataclass
class Across:
    """This node's view of the proof across the job's nodes."""
    ran: bool  # a collective ran
    finding: Optional[Finding]  # this node is the culprit
    why: str  # what was decided, or why nothing could be
    rounds: int = 0
    culprits: Tuple[str, ...] = ()
    busbw_gbps: Optional[float] = None  # the whole job's first run
    seconds: float = 0.0
    first: bool = False  # this node decided (the job's first node)
    failed: bool = False  # the first run across every node failed (not merely undecided)

    def to_json(self) -> dict:
        return {"ran": self.ran, "culprit": self.finding is not None, "why": self.why, "rounds": self.rounds,
                "culprits": list(self.culprits), "busbw_gbps": self.busbw_gbps, "seconds": round(self.seconds, 3),
                "first": self.first, "failed": self.failed}

    def counted(self) -> str:
        """The job's outcome across its nodes, counted by its first node only
        (gpugate_preflight_across_total): "" on every other node."""
        if not self.first:
            return ""
        if self.culprits:
            return "culprit"
        if self.why.startswith("not run"):
            return "not_run"
        return "passed" if self.why.startswith("passed") else "undecided"


@dataclass(frozen=True)
class Member:
    """What a node brings to the meeting."""
    node: str
    own: str  # passed | acute | budgeted | undecided (its own proof, gpugate.preflight.memory.outcome)
    whole: bool  # the job has every GPU of the node
    product: str = ""  # the node's GPU product, for the floor ("": unknown, no floor)


RunRank = Callable[[dict, float], dict]  # (run instruction, deadline) -> {"rc", "output", "timed_out", "error"}


def prove_across(settings, baseline, job: str, nodes: Sequence[str], me: Member, run_rank: RunRank,
                 started: float) -> Across:
    """Rank 0 coordinates, the others join; ``started``: the prolog's
    preflight start (monotonic), from which every deadline counts."""
    from gpugate.safety.budgetkey import KeyUnavailable, load

    cfg = settings.preflight
    begun = time.monotonic()
    deadline = started + float(cfg["timeout_seconds"]) + float(cfg["across_seconds"])
    try:
        key = load(settings)
    except KeyUnavailable as exc:
        return Across(False, None, "not run: %s" % exc)
    ports = ports_for(int(cfg["port"]), int(cfg["ports"]), job, key)  # no user can tell them (the key is root's)
    join_by = min(deadline - 2.0, started + float(cfg["timeout_seconds"]) + _JOIN_GRACE)
    try:
        if me.node == nodes[0]:
            result = _coordinate(settings, baseline, key, job, list(nodes), me, run_rank, ports, deadline, join_by)
        else:
            result = _join(key, job, rendezvous(cfg, nodes[0]), ports, me, run_rank, deadline, join_by + 2.0)
    except MeetError as exc:
        result = Across(False, None, "undecided: the meeting broke: %s" % exc)
    except Exception as exc:  # noqa: BLE001 - a proof that cannot decide never takes capacity (no prolog error)
        result = Across(False, None, "undecided: %s: %s" % (type(exc).__name__, str(exc)[:200]))
    result.seconds, result.first = time.monotonic() - begun, me.node == nodes[0]
    return result


def rendezvous(cfg, node: str) -> str:
    return str(cfg["rendezvous_host"]).replace("{node}", node)


def _join(key, job, host, ports, me: Member, run_rank: RunRank, deadline: float, join_by: float) -> Across:
    # The time this node has left, said in its join: rank 0 ends its rounds within every node's.
    channel = join(host, ports, key, job, join_by, deadline, lambda: dict(
        node=me.node, own=me.own, whole=me.whole, product=me.product, left=round(deadline - time.monotonic(), 3)))
    try:
        while True:
            body = channel.receive(deadline)
            if body["kind"] == "run":
                # Rank 0's budget for this run: a rank still running when rank 0 moved on would miss the next.
                seconds = body.get("seconds")
                seconds = float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else 0
                if time.monotonic() + seconds > deadline + 0.5:
                    answer = {"rc": None, "output": "", "timed_out": False,
                              "error": "%s: less time left than the run's %.0fs" % (me.node, seconds)}
                else:
                    answer = run_rank(body, time.monotonic() + max(0.0, seconds))
                channel.send("result", deadline, **answer)
            elif body["kind"] == "verdict":
                return _from_verdict(body)
            else:
                raise MeetError("an unknown message %r" % str(body["kind"])[:20])
    finally:
        channel.close()


def _from_verdict(body: dict) -> Across:
    finding = Finding.from_json(body["finding"]) if body.get("finding") else None
    return Across(bool(body.get("ran")), finding, str(body.get("why", ""))[:300], int(body.get("rounds") or 0),
                  tuple(body.get("culprits") or ()), body.get("busbw_gbps"), failed=bool(body.get("failed")))


def _coordinate(settings, baseline, key, job, nodes: List[str], me: Member, run_rank: RunRank, ports: List[int],
                deadline: float, join_by: float) -> Across:
    servers, port = listen(ports)
    try:
        members, joined, left = _gather(servers, key, job, nodes, me, join_by)
    finally:
        for server in servers:
            server.close()
    try:
        # The rounds end 3 s before the nearest of every node's own deadline, so the verdict reaches them all.
        deadline = min([deadline] + [time.monotonic() + s for s in left])
        verdicts = _decide(settings, baseline, nodes, me, members, joined, run_rank, port, deadline - 3.0)
        told = max(deadline, time.monotonic() + 0.5)
        for node, channel in members.items():
            if channel is None:
                continue
            try:
                channel.send("verdict", told, **verdicts[node].to_wire())
            except MeetError:
                pass  # that node decides nothing alone: undecided, and its job runs
        return verdicts[me.node].across()
    finally:
        for channel in members.values():
            if channel is not None:
                channel.close()


def _gather(servers, key, job, nodes, me: Member, join_by: float
            ) -> Tuple[Dict[str, Optional[Channel]], Dict[str, Member], List[float]]:
    """Every other node's signed join, until ``join_by``, and the seconds
    each has left.  Anyone may connect to the port: meet.gather serves every
    connection side by side, so strangers cost the joiners nothing."""
    members: Dict[str, Optional[Channel]] = {me.node: None}
    joined: Dict[str, Member] = {me.node: me}
    left: Dict[str, float] = {}
    wanted = set(nodes)

    def admit(body: dict) -> str:
        seconds = body.get("left")
        if not isinstance(body.get("node"), str) or body["node"] not in wanted or body["node"] == me.node:
            return "not a join of this job's"
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
            return "a join without its time left"
        return ""

    def kept(channel: Channel, body: dict) -> bool:
        node = body["node"]
        if members.get(node) is not None:  # it came again (its welcome lost): the newer connection holds
            members[node].close()
        members[node], left[node] = channel, float(body["left"])
        joined[node] = Member(node, str(body.get("own")), bool(body.get("whole")), str(body.get("product") or ""))
        return set(joined) == wanted

    if set(joined) != wanted:
        gather(servers, key, job, join_by, admit, kept)
    return members, joined, list(left.values())


@dataclass
class _Verdict:
    ran: bool
    finding: Optional[Finding]
    why: str
    rounds: int
    culprits: Tuple[str, ...]
    busbw_gbps: Optional[float]
    failed: bool = False

    def to_wire(self) -> dict:
        return {"ran": self.ran, "finding": self.finding.to_json() if self.finding else None, "why": self.why,
                "rounds": self.rounds, "culprits": list(self.culprits), "busbw_gbps": self.busbw_gbps,
                "failed": self.failed}

    def across(self) -> Across:
        return Across(self.ran, self.finding, self.why, self.rounds, self.culprits, self.busbw_gbps,
                      failed=self.failed)


def _decide(settings, baseline, nodes, me, members, joined: Dict[str, Member], run_rank, port, deadline
            ) -> Dict[str, _Verdict]:
    why = _not_run(nodes, joined)
    if why:
        return {n: _Verdict(False, None, why, 0, (), None) for n in nodes}
    channels = {n: c for n, c in members.items() if c is not None}
    run_groups = _group_runner(settings, baseline.smoke_min_pair_busbw, joined, me, channels, run_rank, port,
                               deadline)
    found = search_mod.search(nodes, run_groups)
    first = found.runs[0] if found.runs else None
    busbw = _busbw(first.problem) if first is not None and first.outcome == search_mod.PASS else None
    out = {}
    for node in nodes:
        finding = None
        if found.verdicts.get(node) == search_mod.CULPRIT:
            run = found.pinned_by[node]
            partners = [n for r in (found.first_strike[node], run) for n in r.nodes if n != node]
            # Budgeted (findings.USER_CAUSED): another job's traffic on a shared link can slow a run, so a
            # pin is published for the keeper, within the drain budget and the preflight allowance.
            finding = Finding(HEALTH, ACROSS_COMPONENT, "%s pairs=%s" % (run.problem, ",".join(partners)),
                              run.expected or "a pass", INVESTIGATE,
                              detail="failed the all_reduce across %d nodes, then with %s (each proven)" % (
                                  len(nodes), " and ".join(partners)))
        if found.culprits:
            text = "culprit %s in %d rounds" % (",".join(found.culprits), found.rounds)
        elif first is not None and first.outcome == search_mod.PASS:
            text = "passed: %d nodes%s" % (len(nodes), " busbw=%sGB/s" % busbw if busbw is not None else "")
        else:
            text = "undecided: %s" % found.why
        out[node] = _Verdict(True, finding, text[:300], found.rounds, tuple(found.culprits), busbw,
                             failed=first is not None and first.outcome == search_mod.FAIL)
    return out


def _not_run(nodes, joined: Dict[str, Member]) -> str:
    missing = [n for n in nodes if n not in joined]
    if missing:
        return "undecided: %s did not come in time" % ",".join(missing[:5])
    failed = [n for n in nodes if joined[n].own == "acute"]
    if failed:
        return "not run: %s failed its own proof (Slurm requeues the job)" % ",".join(failed[:5])
    unfit = [n for n in nodes if joined[n].own == UNFIT]
    if unfit:  # what a job's user may have left or run there: nobody is a suspect (its log says what)
        return "not run: %s's environment is not fit for the run (gpugate.preflight.environment)" % ",".join(
            unfit[:5])
    part = [n for n in nodes if not joined[n].whole]
    if part:
        return "not run: the job has part of %s's GPUs (the proof across nodes needs whole nodes)" % ",".join(
            part[:5])
    return ""


def _busbw(problem: str) -> Optional[float]:
    try:
        return float(problem.partition("busbw=")[2].partition("GB/s")[0]) if "busbw=" in problem else None
    except ValueError:
        return None


def _group_runner(settings, floors, joined, me, channels, run_rank, port, deadline):
    cfg = settings.preflight

    def run_groups(groups: List[Tuple[str, ...]]) -> List[search_mod.GroupRun]:
        left = deadline - time.monotonic()
        if left < 1.0:
            return [search_mod.GroupRun(g, search_mod.UNDECIDED, "no time left") for g in groups]
        until = time.monotonic() + min(float(cfg["run_seconds"]), left - 0.5)
        jobs = []
        for group in groups:
            root = rendezvous(cfg, group[0])
            token = os.urandom(16).hex()  # the run's own secret, for a site's rank script to check its peers with
            for rank, node in enumerate(group):
                jobs.append((group, node, {"rank": rank, "nranks": len(group), "root": root, "port": port + 1,
                                           "nodes": ",".join(group), "token": token}))
        with ThreadPoolExecutor(max(1, len(jobs))) as pool:
            answers = list(pool.map(lambda j: _one_rank(j[1], j[2], me, channels, run_rank, until), jobs))
        by_group: Dict[Tuple[str, ...], List[dict]] = {}
        for (group, _, _), answer in zip(jobs, answers):
            by_group.setdefault(group, []).append(answer)
        return [_judge_group(joined, floors, group, by_group[group], until) for group in groups]

    return run_groups


def _one_rank(node, instruction, me, channels, run_rank, until) -> dict:
    if node == me.node:
        return run_rank(instruction, until)
    channel = channels[node]
    try:
        channel.send("run", until, seconds=round(until - time.monotonic(), 3), **instruction)
        body = channel.receive(until + 5.0)  # the rank's own deadline is ``until``; the answer travels after it
        if body["kind"] != "result":
            raise MeetError("not a result")
        return {k: body.get(k) for k in ("rc", "output", "timed_out", "error")}
    except MeetError as exc:
        return {"rc": None, "output": "", "timed_out": False, "error": "%s: %s" % (node, exc)}


def run_rank_command(settings, node: str, gpus: List[int], amd: bool) -> RunRank:
    """This node's rank of a collective: the site's ``allreduce_multi`` with
    gpugate's environment only."""
    from gpugate.errors import CommandError
    from gpugate.safety.runner import run
    from gpugate.judges.smoke import template

    def run_rank(instruction: dict, until: float) -> dict:
        fields = {k: str(instruction.get(k, "")) for k in ("rank", "nranks", "root", "port", "nodes")}
        argv = []
        for word in template(settings.preflight["allreduce_multi"], node, len(gpus), fields["nodes"]):
            for name, value in fields.items():
                word = word.replace("{%s}" % name, value)
            argv.append(word)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "HOME": "/root",
               "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        env["HIP_VISIBLE_DEVICES" if amd else "CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        env.update({"GPUGATE_PREFLIGHT_" + k.upper(): v for k, v in fields.items()})
        # The run's secret in the environment only: argv is every user's to read (/proc/PID/cmdline).
        env["GPUGATE_PREFLIGHT_TOKEN"] = str(instruction.get("token", ""))
        try:
            result = run(argv, until - time.monotonic(), env=env, ok_codes=range(-64, 256),  # a signal too
                         max_stdout=_OUTPUT_CAP, max_stderr=_OUTPUT_CAP)
        except CommandError as exc:
            return {"rc": None, "output": "", "timed_out": bool(exc.timed_out),
                    "error": "" if exc.timed_out else str(exc)[:300]}
        return {"rc": result.rc, "output": (result.stdout + result.stderr)[-_OUTPUT_CAP:], "timed_out": False,
                "error": ""}

    return run_rank


def _judge_group(joined, floors, group, answers: List[dict], until: float) -> search_mod.GroupRun:
    """Rank 0's output, judged as the sweep's pair job; a rank that could
    not run or answer makes the run undecided."""
    from gpugate.judges.smoke import cannot_run, judge_smoke
    from gpugate.parsers.nccl import parse_nccl_tests

    errors = [a["error"] for a in answers if a.get("error")]
    if errors:
        return search_mod.GroupRun(group, search_mod.UNDECIDED, errors[0][:200])
    head = answers[0]
    text = head.get("output") or ""
    parsed = parse_nccl_tests(text) if text else None
    rc = head.get("rc")
    timed_out = any(a.get("timed_out") for a in answers)
    site = "" if timed_out else cannot_run(parsed, rc, text)
    if site:
        return search_mod.GroupRun(group, search_mod.UNDECIDED, "cannot run: " + site)
    # Each node's own product, as it said in its join (a cached baseline knows its own node only):
    # mixed or unknown products have no one floor.
    products = {joined[n].product for n in group}
    product = products.pop() if len(products) == 1 else ""
    want = floors.get(product) if product else None
    verdict = judge_smoke(parsed, rc, timed_out, want, deadline_s=round(max(0.0, until - time.monotonic())))
    if verdict.passed:
        shown = "busbw=%.1fGB/s" % verdict.busbw_gbps if verdict.busbw_gbps is not None else ""
        return search_mod.GroupRun(group, search_mod.PASS, shown)
    kind = _PINNABLE.get(verdict.component)
    if kind is None or (kind == "busbw" and not verdict.expected.startswith(">=")):
        # An abort, an exit code, no result, a hang: the environment's as much as a node's (a /dev/shm
        # or /tmp a job's user filled, a port taken, a link another job saturates): undecided, as in a
        # node's own proof (gpugate.preflight.node).  Only a result read and held to a rule pins.
        return search_mod.GroupRun(group, search_mod.UNDECIDED, "%s: %s" % (verdict.component, verdict.problem))
    observed = "%s=%s" % (verdict.component, verdict.observed) if verdict.observed else verdict.problem
    return search_mod.GroupRun(group, search_mod.FAIL, observed, verdict.expected, kind)


# What a collective's result may pin: values read and wrong, or a bandwidth read and under the floor.
_PINNABLE = {"wrong": "wrong", "out_of_bounds": "wrong", "busbw": "busbw"}
