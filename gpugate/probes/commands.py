"""Facts from external commands: modinfo, dkms, lspci, the package manager,
systemctl, dcgmi.  Each is bounded by the caller's timeout; an error or a
timeout becomes a ProbeFailure."""

from typing import Any, Callable, Mapping, Optional, Sequence

from gpugate.errors import CommandError, ParseError
from gpugate.model.facts import UNCHECKED, ProbeFailure
from gpugate.parsers import dcgm as dcgm_parse
from gpugate.parsers import system
from gpugate.core.record import replace
from gpugate.safety.runner import run
from gpugate.model.toolfacts import DcgmDiag

# What the tools need: slurmd gives us no environment at all.
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


def _run(source: str, argv: Sequence[str], timeout: float, parse: Callable[[Any], Any],
         ok_codes: Sequence[int] = (0,), absent_codes: Sequence[int] = ()) -> Any:
    try:
        result = run(argv, timeout, env=ENV, ok_codes=tuple(ok_codes) + tuple(absent_codes))
    except CommandError as exc:
        # refused: not root's alone, so not run; never "missing" (dkms reads
        # that as "no dkms here") and never a healthy answer.
        kind = ("refused" if exc.refused else "timeout" if exc.timed_out else "missing" if exc.missing
                else "overflow" if exc.overflow else "error")
        return ProbeFailure(source, kind, str(exc)[:200], exc.rc)
    if result.rc in absent_codes:
        return ProbeFailure(source, "absent", (result.stderr or result.stdout).strip()[:200], result.rc)
    try:
        return parse(result)
    except ParseError as exc:
        return ProbeFailure(source, "error", str(exc)[:200], result.rc)


def module_on_disk(modinfo: str, timeout: float) -> Any:
    """The module a reboot would load.  A tool here: no kernel file says it
    (/sys/module/nvidia/version is the loaded one); modinfo finds the .ko for
    the running kernel and reads its version.  Without modinfo (no kmod, as
    in many containers) nothing pinned goes unread: unchecked, not a finding."""
    # modinfo exits 1 when there is no nvidia module for the running kernel.
    value = _run("modinfo", [modinfo, "-F", "version", "nvidia"], timeout,
                 _stdout(system.parse_modinfo_version), absent_codes=(1,))
    if isinstance(value, ProbeFailure) and value.kind == "missing":
        return ProbeFailure("modinfo", UNCHECKED, "%s not installed (kmod): the module on disk is not compared "
                            "with the loaded one" % modinfo)
    return value


def dkms_status(dkms: str, timeout: float) -> Any:
    value = _run("dkms", [dkms, "status"], timeout, _stdout(system.parse_dkms_status))
    if isinstance(value, ProbeFailure) and value.kind == "missing":
        return None  # precompiled-module distributions have no dkms: not a failure
    return value


def lspci(lspci_bin: str, timeout: float) -> Any:
    return _run("lspci", [lspci_bin, "-n", "-d", "10de:"], timeout, _stdout(system.parse_lspci_nvidia))


def packages(settings_packages: Mapping[str, Any], dpkg_query: str, rpm: str, timeout: float) -> Any:
    """role -> Package | None (not installed) | ProbeFailure."""
    manager = settings_packages["manager"]
    roles = {role: tuple(settings_packages[role]) for role in ("container_toolkit", "fabricmanager")}
    if manager == "none":
        # Not read, so neither "absent" (drift) nor a value that could match a pin.
        return {role: ProbeFailure("packages", UNCHECKED, 'packages.manager = "none"') for role in roles}
    patterns = sorted({p for pats in roles.values() for p in pats})
    if manager == "dpkg":
        fmt = "${Package}\t${Version}\t${db:Status-Abbrev}\t${Status}\n"
        # dpkg-query exits 1 when a pattern matches nothing: still a valid answer.
        found = _run("packages", [dpkg_query, "-W", "-f=" + fmt]
                     + patterns, timeout, _stdout(system.parse_dpkg_query), ok_codes=(0, 1))
    else:
        # -qa takes globs and exits 0 when nothing matches; `rpm -q` adds one
        # to its exit code per missing name, which hides real rpm failures.
        found = _run("packages", [rpm, "-qa", "--qf", system.RPM_QUERYFORMAT] + patterns, timeout,
                     _stdout(system.parse_rpm_query))
    if isinstance(found, ProbeFailure):
        return {role: found for role in roles}
    return {role: _pick(found, pats) for role, pats in roles.items()}


def _pick(found: Mapping[str, Any], patterns: Sequence[str]) -> Optional[Any]:
    import fnmatch

    for pattern in patterns:
        for name in sorted(found):
            if fnmatch.fnmatchcase(name, pattern):
                return found[name]
    return None


def service_state(systemctl: str, unit: str, timeout: float) -> Any:
    # is-active exits 3 for inactive units and still prints the state.
    return _run("systemctl", [systemctl, "is-active", unit], timeout,
                _stdout(system.parse_systemctl_is_active), ok_codes=(0, 3, 4))


def dcgm_version(dcgmi: str, timeout: float) -> Any:
    return _run("dcgmi", [dcgmi, "--version"], timeout, _stdout(dcgm_parse.parse_dcgmi_version))


def dcgm_health(dcgmi: str, timeout: float) -> Any:
    # Without watches dcgmi prints a plain-text error and exits non-zero: the
    # parser reads that as "watches not set", so every exit code is parsed.
    return _run("dcgmi health", [dcgmi, "health", "-c", "-j"], timeout, _stdout(dcgm_parse.parse_health_json),
                ok_codes=range(256))


def dcgm_diag(dcgmi: str, level: int, timeout: float, gpus=None) -> Any:
    """The diagnostic on the given GPUs only (the job's, in the epilog:
    other GPUs may be busy with other jobs)."""
    argv = [dcgmi, "diag", "-r", str(level)]
    if gpus:
        argv += ["-i", ",".join(str(g) for g in gpus)]
    # Every exit code is parsed: a refusal on MIG is not a report, whatever its
    # code; the parser reads a report only with the codes that carry one.
    return _run("dcgmi diag", argv + ["-j"], timeout, lambda r: _diag(r, level), ok_codes=range(256))


def dcgm_diag_staged(dcgmi: str, levels, time_left: Callable[[], float], gpus=None) -> Any:
    """The levels in order, cheapest first (verify: -r 1 in seconds, then
    -r 3's ~15 minutes); the first one that does not pass cleanly is the
    result, and no later level runs.  The result names the levels passed."""
    passed = []
    for i, level in enumerate(levels):
        diag = dcgm_diag(dcgmi, level, time_left(), gpus)
        clean = (isinstance(diag, DcgmDiag) and diag.exit_code == 0 and not diag.failures and not diag.not_run
                 and any(r.status == "Pass" for r in diag.results))
        if not clean or i == len(levels) - 1:
            return replace(diag, passed_levels=tuple(passed)) if isinstance(diag, DcgmDiag) else diag
        passed.append(level)
    return None


def _diag(result, level: int) -> Any:
    # dcgmi prints its refusal on stdout; read stderr only when stdout is empty.
    text = result.stdout if result.stdout.strip() else result.stderr
    diag = dcgm_parse.parse_diag_json(text, level, result.rc)
    if result.rc not in dcgm_parse.DIAG_EXIT_OK and not diag.not_run:
        raise ParseError("dcgmi diag exited %d: a report counts only with exit 0, 205 or 226" % result.rc)
    return diag


def _stdout(parse: Callable[[str], Any]) -> Callable[[Any], Any]:
    return lambda result: parse(result.stdout)


def imex_status(imex_ctl: str, timeout: float) -> Any:
    """nvidia-imex-ctl -q (this node's service) then -N (the domain), within
    one timeout; either failing makes the whole fact a ProbeFailure."""
    from time import monotonic

    from gpugate.parsers import imex as imex_parse
    from gpugate.model.toolfacts import ImexStatus

    started = monotonic()
    service = _run("nvidia-imex-ctl", [imex_ctl, "-q"], timeout, _stdout(imex_parse.parse_query))
    if isinstance(service, ProbeFailure):
        return service
    left = max(timeout - (monotonic() - started), 0.1)
    domain = _run("nvidia-imex-ctl -N", [imex_ctl, "-N"], left, _stdout(imex_parse.parse_domain))
    if isinstance(domain, ProbeFailure):
        return domain
    return ImexStatus(service=service, domain=domain[0], nodes=domain[1])
