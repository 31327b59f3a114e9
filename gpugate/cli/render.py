"""Human output of a check."""

from gpugate.vendors.seam import runbook_steps


def _finding_line(f) -> str:
    where = " gpu%d" % f.gpu if f.gpu is not None else ""
    return "  %-7s %-18s observed %s, expected %s  -> %s" % (f.cls, f.component + where, f.observed,
                                                          f.expected, f.action)


def verdict_text(result) -> str:
    v, facts = result.verdict, result.facts
    took = sum(facts.durations.values())
    lines = ["%s (%s): %s" % (facts.node, facts.mode, "FIT" if v.fit else "UNFIT (%s)" % v.cls)]
    if v.reason:
        lines.append("reason: %s" % v.reason)
    for f in v.findings:
        lines.append(_finding_line(f))
    for f in v.notes:
        lines.append("  pending %-18s on %s, rollout to %s in progress" % (f.component, f.observed, f.expected))
    for f in v.not_verified:
        lines.append(_not_run_line(f))
    lines += _unchecked_lines(facts)
    lines.append("probes: " + ", ".join("%s %.2fs" % (k, t) for k, t in sorted(facts.durations.items()))
                 + " (sum %.2fs)" % took)
    return "\n".join(lines)


def _not_run_line(f) -> str:
    return "  NOT VERIFIED %s %s (want %s): %s" % (f.component, f.observed, f.expected, f.detail)


def _unchecked_lines(facts) -> list:
    from gpugate.model.facts import unchecked_facts

    return ["  unchecked %s: %s" % item for item in unchecked_facts(facts)]


def explain_text(result) -> str:
    v = result.verdict
    if v.fit and v.not_verified:
        return "\n".join(["%s: fit on everything checked; not verified:" % result.facts.node]
                         + [_not_run_line(f) for f in v.not_verified] + _unchecked_lines(result.facts))
    if v.fit:
        return "\n".join(["%s: fit; nothing to do." % result.facts.node] + _unchecked_lines(result.facts))
    lines = ["%s is unfit (%s)." % (result.facts.node, v.cls), "reason: %s" % v.reason, ""]
    for n, f in enumerate(v.findings, 1):
        lines.append("%d. %s" % (n, _finding_line(f).strip()))
        if f.detail:
            lines.append("   detail: %s" % f.detail)
        for step in runbook_steps(f, "amd" if getattr(result.facts, "amd", None) is not None else "nvidia"):
            lines.append("   - %s" % step)
    lines += ["not verified:"] + [_not_run_line(f) for f in v.not_verified] if v.not_verified else []
    return "\n".join(lines + _unchecked_lines(result.facts))
