"""`gpugate baseline`: capture a baseline from a known-good node, and review
a change between two baselines before it is pushed to the fleet."""

import json
import os
import socket
import sys
import time

import click

from gpugate.errors import ConfigError

_config_opt = click.option("--config", "-c", type=click.Path(dir_okay=False), default=None,
                           help="gpugate.toml (default: $GPUGATE_CONFIG or /etc/gpugate/gpugate.toml).")

_audit_opt = click.option("--audit", "audit_file", type=click.Path(dir_okay=False), default=None,
                          help="The latest audit's facts (default: audit.json next to the sweep journal).")


@click.group()
def baseline():
    """Write a baseline from a known-good node; compare two baselines;
    check a new one against the drain budget before it is pushed.

    \b
    Examples:
      gpugate baseline capture --node gpu001 --nodes 'gpu[001-200]' --output new-baseline.toml
      gpugate baseline capture --sim /tmp/fleet --node gpu01
      gpugate baseline diff /etc/gpugate/baseline.toml new-baseline.toml
      gpugate baseline diff old.toml new.toml --audit /var/lib/gpugate/audit.json --json
      gpugate baseline check new-baseline.toml --audit audit.json
    """


def _node_facts(settings, node):
    """The node's facts, as `gpugate facts` collects them (DCGM always asked)."""
    from gpugate.fleet.capture import probe_baseline
    from gpugate.model.config import load_checked_baseline
    from gpugate.model.facts import to_jsonable
    from gpugate.node.check import run_check

    try:
        current = load_checked_baseline(settings)  # only to run the probes
    except ConfigError:
        current = None
    result = run_check(settings, probe_baseline(current, node, settings.node_root(node)), node, "healthcheck")
    return result, to_jsonable(result.facts)


def _write_new(path: str, text: str, force: bool) -> None:
    """Write atomically (a temporary file, then rename); never replace an
    existing file unless ``force``."""
    path = os.path.abspath(path)
    if not force and os.path.lexists(path):
        raise ConfigError("%s exists: not overwriting it (use --force)" % path)
    from gpugate.safety.safeio import write_atomic

    try:
        # A random O_EXCL|O_NOFOLLOW temporary name; without --force a hard link that fails if the file appeared.
        write_atomic(path, text.encode(), mode=0o644, exact_mode=True, replace=force)
    except FileExistsError:
        raise ConfigError("%s exists: not overwriting it (use --force)" % path) from None
    except OSError as exc:
        raise ConfigError("cannot write %s: %s" % (path, exc)) from None


@baseline.command("capture")
@_config_opt
@click.option("--sim", type=click.Path(file_okay=False), default=None,
              help="Capture from a simulated node of this fleet directory.")
@click.option("--node", "-n", required=True, help="The known-good node to capture from.")
@click.option("--nodes", "-w", "nodes", default=None, metavar="HOSTLIST",
              help="The nodes the [nodes] section covers, a hostlist as ClusterShell writes it "
                   "(e.g. 'gpu[001-200]'): every node of the same shape.  Default: --node alone (said on stderr: "
                   "every other node reads `probe uncovered` until a section names it).")
@click.option("--name", default=None, help="The baseline's name (default: captured-NODE-YYYYMMDD).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="Write the baseline to this file (atomically) instead of printing it.")
@click.option("--force", is_flag=True, help="Replace --output when it exists.")
def capture(config, sim, node, nodes, name, output, force):
    """Write a baseline from a known-good node's facts: every version it runs
    as the pin, its VBIOS per GPU product, and a [nodes."HOSTLIST"] section
    (--nodes; default [nodes."NODE"], that node alone) with its GPU count,
    product, NVSwitch, MIG and persistence.  A node no section names reads
    `probe uncovered` on every check (drained within the drain budget): give
    --nodes every node of this shape.  Facts that could
    not be read are left out with a comment saying why; [health] is left out
    (the defaults apply).  A node whose GPUs of one product disagree on the
    VBIOS is refused: it is not a good reference.

    \b
    Examples:
      gpugate baseline capture --node gpu001 --nodes 'gpu[001-200]' -o new-baseline.toml
      gpugate baseline capture --node gpu001
      gpugate baseline capture --node gpu001 --name h100-r590-2027.01 --output new-baseline.toml
      gpugate baseline capture --sim /tmp/fleet --node gpu01 -o /tmp/captured.toml --force
    """
    from gpugate.model.findings import BROKEN, HEALTH
    from gpugate.fleet.capture import capture as capture_text
    from gpugate.fleet import coverage
    from gpugate.cli.context import load_context

    key = coverage.section_key(nodes) if nodes is not None else None
    settings = load_context(config, sim, None)
    # The facts are this machine's unless a simulated fleet is read: --node only names the result.
    for line in coverage.host_notes(node, None if settings.sim_fleet else socket.gethostname()):
        click.echo(line, err=True)
    result, facts = _node_facts(settings, node)
    name = name or "captured-%s-%s" % (node, time.strftime("%Y%m%d", time.gmtime()))
    text = capture_text(node, facts, name, nodes=key)
    for line in coverage.capture_notes(node, key):
        click.echo(line, err=True)
    unwell = [f for f in result.verdict.findings if f.cls in (HEALTH, BROKEN)]
    if unwell:
        click.echo("gpugate: warning: %s has %d finding%s besides versions (e.g. %s): check it is really a good "
                   "reference" % (node, len(unwell), "" if len(unwell) == 1 else "s",
                                  "%s %s" % (unwell[0].cls, unwell[0].component)), err=True)
    if output:
        _write_new(output, text, force)
        click.echo("wrote %s (from %s; [nodes.\"%s\"])" % (output, node, key or node), err=True)
    else:
        click.echo(text, nl=False)


def read_audit(path: str):
    """The latest audit's {"at", "baseline", "facts", "partitions"}; None when there is none."""
    from gpugate.safety.safeio import AUDIT_CAP, read_capped

    try:
        data = json.loads(read_capped(path, AUDIT_CAP))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError("%s: cannot read the audit: %s" % (path, exc)) from None
    if not isinstance(data, dict) or not isinstance(data.get("facts"), dict):
        raise ConfigError("%s: not an audit file (expected {\"at\", \"baseline\", \"facts\": {node: facts}})" % path)
    parts = data.get("partitions")
    if parts is not None and not (isinstance(parts, dict) and all(
            isinstance(v, list) and all(isinstance(p, str) for p in v) for v in parts.values())):
        raise ConfigError("%s: \"partitions\" must map each node to its partitions" % path)
    return data


def _latest_audit(config, audit_file):
    """(settings, path, audit or None): --audit when given (it must exist),
    else audit.json next to the sweep journal."""
    from gpugate.model.config import load_settings
    from gpugate.cli.fleet import audit_path

    settings = load_settings(config, missing_ok=True)
    path = audit_file or audit_path(settings)
    audit = read_audit(path)
    if audit is None and audit_file:
        raise ConfigError("%s: no such audit file" % path)
    return settings, path, audit


def _predict(settings, old, new, audit):
    from gpugate.fleet.predict import predict

    return predict(old, new, audit["facts"], audit.get("partitions"),
                   float(settings.drain_budget["max_share"]), settings.reason_tag)


def _when(audit) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(float(audit.get("at"))))
    except (TypeError, ValueError, OverflowError, OSError):
        return "an unknown time"


@baseline.command("diff")
@_config_opt
@click.argument("old", type=click.Path(dir_okay=False))
@click.argument("new", type=click.Path(dir_okay=False))
@_audit_opt
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: pin, previous, rollout, nodesets, health, would_drift, would_drift_now, "
                   "unreachable, prediction, audit.")
def diff(config, old, new, audit_file, as_json):
    """Show what changes between two baselines and, from the latest audit,
    what the new one would do to each node before it is pushed: the
    findings of every class it adds and removes (the judges `gpugate check`
    runs, on each node's audited facts), acute or within the drain budget,
    and per partition how many nodes it leaves unfit against the budget.
    Exit 0 (`gpugate baseline check` is the gate that fails).

    \b
    Examples:
      gpugate baseline diff /etc/gpugate/baseline.toml new-baseline.toml
      gpugate baseline diff old.toml new.toml --json
      gpugate baseline diff old.toml new.toml --audit /var/lib/gpugate/audit.json
    """
    from gpugate.model.baseline import load_baseline
    from gpugate.fleet import predict as prediction
    from gpugate.fleet.review import diff as diff_baselines
    from gpugate.fleet.review import diff_text

    old_b, new_b = load_baseline(old), load_baseline(new)
    settings, path, audit = _latest_audit(config, audit_file)
    result = diff_baselines(old_b, new_b, audit["facts"] if audit else None)
    predicted = _predict(settings, old_b, new_b, audit) if audit else None
    result["prediction"] = prediction.to_json(predicted) if predicted else None
    if audit:
        result["audit"] = {"path": path, "at": audit.get("at"), "baseline": audit.get("baseline"),
                           "nodes": len(audit["facts"])}
    else:
        result["audit"] = None
        result["note"] = "no audit yet: run gpugate audit"
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
        sys.exit(0)
    click.echo(diff_text(result))
    click.echo("")
    if audit:
        click.echo(prediction.to_text(predicted))
        click.echo("")
        click.echo("(from the audit of %d nodes at %s: %s)" % (len(audit["facts"]), _when(audit), path))
    else:
        click.echo("no audit yet: run gpugate audit (%s not found): no node prediction" % path)
    sys.exit(0)


@baseline.command("check")
@_config_opt
@click.argument("new", type=click.Path(dir_okay=False))
@click.option("--old", "old_path", type=click.Path(dir_okay=False), default=None,
              help="The baseline the fleet runs now (default: the configured one): what NEW changes is "
                   "counted against it.")
@_audit_opt
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: new, old, audit, prediction (nodes, changes, partitions, unknown, "
                   "uncovered, over_budget), uncovered_refused (count, nodes).")
def check_cmd(config, new, old_path, audit_file, as_json):
    """Would NEW make more nodes of a partition unfit than its drain budget
    allows?  For a site's git CI, before NEW is pushed: NEW is validated,
    then judged on every node's facts from the last `gpugate audit` (the
    judges `gpugate check` runs), against the baseline the fleet runs now.
    Read-only: nothing is changed.  NEW must also cover every node the
    audit reached (a [nodes."..."] section naming it): one it leaves
    uncovered would read `probe uncovered` and be drained within the
    budget, so NEW is refused (`gpugate baseline capture --nodes HOSTLIST`
    writes the section for a hostlist).  There is no override: cover the
    node, or audit without it (`gpugate audit -p`/`-w`).

    \b
    Exit 0: within every partition's budget, every audited node covered.
    Exit 1: over budget; one line per partition names the count, the budget
            and the first findings with their nodes.  Or NEW leaves nodes
            the audit reached uncovered: they are named, with what to do.
    Exit 2: NEW does not load (the loader's error), no audit, or an audit
            without Slurm's partitions.

    \b
    Examples:
      gpugate baseline check new-baseline.toml
      gpugate baseline check baseline.toml --old /etc/gpugate/baseline.toml --audit audit.json
      gpugate baseline check baseline.toml --audit audit.json --json
    """
    from gpugate.model.baseline import load_baseline
    from gpugate.fleet import coverage
    from gpugate.fleet import predict as prediction
    from gpugate.fleet.audit import hostlist

    new_b = load_baseline(new)
    settings, path, audit = _latest_audit(config, audit_file)
    if audit is None:
        raise ConfigError("no audit at %s: run gpugate audit first (on the controller), or give --audit FILE"
                          % path)
    if audit.get("partitions") is None:
        raise ConfigError("%s: the audit records no partitions (Slurm did not answer, or an older gpugate "
                          "wrote it): run gpugate audit again where Slurm answers" % path)
    old = old_path or settings.baseline
    old_b = load_baseline(old) if old_path or os.path.exists(old) else None
    predicted = _predict(settings, old_b, new_b, audit)
    over = prediction.over_lines(predicted)
    refused, unreached = coverage.uncovered_audited(new_b, audit["facts"])
    code = 1 if over or refused else 0
    if as_json:
        click.echo(json.dumps({"new": new, "old": old if old_b else None, "exit_code": code,
                               "audit": {"path": path, "at": audit.get("at"), "nodes": len(audit["facts"])},
                               "prediction": prediction.to_json(predicted),
                               "uncovered_refused": {"count": len(refused), "nodes": hostlist(refused)}},
                              sort_keys=True))
        sys.exit(code)
    click.echo("%s (%s) against the audit of %d nodes at %s (%s), compared with %s"
               % (new, new_b.name, len(audit["facts"]), _when(audit), path,
                  old if old_b else "no current baseline (%s not found): every finding is new" % old))
    click.echo(prediction.to_text(predicted))
    if over:
        click.echo("gpugate baseline check: %s would drain more than the budget allows in partition %s"
                   % (new, ", ".join(p.partition for p in predicted.over)), err=True)
    if refused:
        for line in coverage.refusal(new, refused, unreached):
            click.echo(line, err=True)
    sys.exit(code)
