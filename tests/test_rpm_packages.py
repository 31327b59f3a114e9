"""Issue 12 item 8: RHEL-family nodes.  The recorded `rpm` outputs
(tests/fixtures/rpm, see its README) are parsed; the default patterns pick
the names Debian/Ubuntu and RHEL/Rocky install; a simulated node replays the
recordings through the production probe."""

import os

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from conftest import DEMO_BASELINE, ROOT, gpugate_cmd
from gpugate.model.baseline import load_baseline
from gpugate.model.config import DEFAULT_PACKAGES
from gpugate.errors import CommandError, ParseError
from gpugate.model.facts import ProbeFailure
from gpugate.model.toolfacts import Package
from gpugate.node.check import run_check
from gpugate.parsers import system
from gpugate.probes import commands

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "rpm")
BASELINE = load_baseline(DEMO_BASELINE)


def recorded(case):
    def read(ext):
        with open(os.path.join(FIXTURES, "%s.%s" % (case, ext))) as handle:
            return handle.read()
    return read("stdout"), read("stderr"), int(read("rc"))


def test_recorded_rpm_qa_epoch_none_and_set_and_two_versions_of_one_name():
    stdout, _, rc = recorded("qa-installed")
    assert rc == 0
    packages = system.parse_rpm_query(stdout)
    assert packages["nvidia-fabricmanager"] == Package("nvidia-fabricmanager", "580.65.06", False, "580.65.06-1")
    assert packages["kmod-nvidia-open-dkms"] == Package("kmod-nvidia-open-dkms", "580.65.06", False,
                                                        "3:580.65.06-1.el9")
    assert packages["datacenter-gpu-manager-4-core"].version == "4.2.3"
    assert packages["datacenter-gpu-manager-4-core"].raw_version == "1:4.2.3-1"
    # Two versions installed side by side match no single pin.
    assert packages["nvidia-container-toolkit"].version == "1.16.2,1.17.8"
    assert "nvidia-fabricmanager-devel" not in packages  # the glob 'nvidia-fabricmanager-[0-9]*' left it out


def test_recorded_rpm_q_not_installed_lines_and_empty_qa():
    stdout, _, rc = recorded("q-not-installed")
    assert rc == 2  # one per missing name: why gpugate runs -qa, whose exit is 0 for no match
    assert sorted(system.parse_rpm_query(stdout)) == ["nvidia-fabricmanager"]
    stdout, _, rc = recorded("qa-nomatch")
    assert (stdout, rc) == ("", 0) and system.parse_rpm_query(stdout) == {}


@pytest.mark.parametrize("line", ["error: rpmdb open failed", "nvidia-driver\t1:2\t550.54.15\t1\tx86_64",
                                  "nvidia-driver\t(none)\t\t1\tx86_64", "nvidia-driver 550.54.15 1",
                                  "a\t(none)\t1.0,2.0\t1\tx86_64"])
def test_rpm_lines_that_are_not_the_query_format_are_parse_errors(line):
    with pytest.raises(ParseError, match="rpm"):
        system.parse_rpm_query(line + "\n")


_name = st.from_regex(r"[a-z][a-z0-9_+.-]{0,30}", fullmatch=True).filter(lambda n: not n.startswith("package"))
_version = st.from_regex(r"[0-9][0-9a-z._+~^]{0,15}", fullmatch=True)


@hsettings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_name, st.one_of(st.none(), st.integers(0, 99)), _version,
                          st.from_regex(r"[0-9a-z._]{1,10}", fullmatch=True),
                          st.sampled_from(["x86_64", "aarch64", "noarch", "(none)"])), max_size=12))
def test_rpm_query_format_round_trips(rows):
    text = "".join("%s\t%s\t%s\t%s\t%s\n" % (n, "(none)" if e is None else e, v, r, a) for n, e, v, r, a in rows)
    packages = system.parse_rpm_query(text)
    assert set(packages) == {n for n, *_ in rows}
    for name, pkg in packages.items():
        mine = [row for row in rows if row[0] == name]
        assert pkg.version == ",".join(sorted({v for _, _, v, _, _ in mine}))
        assert not pkg.held
        raws = {("" if e is None else "%d:" % e) + "%s-%s" % (v, r) for _, e, v, r, _ in mine}
        assert pkg.raw_version == ",".join(sorted(raws))


@pytest.mark.parametrize("installed, picked", [
    (["nvidia-fabricmanager-535", "nvidia-fabricmanager-dev-535"], "nvidia-fabricmanager-535"),  # Ubuntu
    (["nvidia-fabricmanager", "nvidia-fabricmanager-devel"], "nvidia-fabricmanager"),  # RHEL 9, 580+
    (["nvidia-fabric-manager", "nvidia-fabric-manager-devel"], "nvidia-fabric-manager"),  # RHEL, before 580
    (["cuda-drivers-fabricmanager-550", "nvidia-fabricmanager-550"], "nvidia-fabricmanager-550"),
    (["cuda-drivers-fabricmanager-550"], "cuda-drivers-fabricmanager-550"),
    (["nvidia-fabricmanager-devel"], None),
])
def test_default_fabricmanager_patterns_pick_the_package_debian_and_rhel_install(installed, picked):
    found = {n: Package(n, "580.65.06", False) for n in installed}
    pkg = commands._pick(found, DEFAULT_PACKAGES["fabricmanager"])
    assert (pkg.name if pkg else None) == picked
    toolkit = commands._pick({"nvidia-container-toolkit-base": Package("nvidia-container-toolkit-base", "1", False),
                              "nvidia-container-toolkit": Package("nvidia-container-toolkit", "2", False)},
                             DEFAULT_PACKAGES["container_toolkit"])
    assert toolkit.name == "nvidia-container-toolkit"


SETTINGS = {"manager": "rpm", **DEFAULT_PACKAGES}


def test_rpm_is_run_with_qa_the_query_format_and_the_globs(monkeypatch):
    seen = {}

    def fake_run(argv, timeout, env=None, ok_codes=(0,)):
        seen.update(argv=list(argv), timeout=timeout, ok_codes=ok_codes)
        raise CommandError(argv, "rpm exited 1", rc=1)

    monkeypatch.setattr(commands, "run", fake_run)
    result = commands.packages(SETTINGS, "/usr/bin/dpkg-query", "/usr/bin/rpm", 5.0)
    assert seen["argv"][:4] == ["/usr/bin/rpm", "-qa", "--qf", system.RPM_QUERYFORMAT]
    assert set(seen["argv"][4:]) == set(DEFAULT_PACKAGES["fabricmanager"] + DEFAULT_PACKAGES["container_toolkit"])
    assert seen["timeout"] == 5.0 and tuple(seen["ok_codes"]) == (0,)  # any other exit is rpm failing
    assert all(isinstance(v, ProbeFailure) and v.kind == "error" for v in result.values())


@pytest.mark.parametrize("case, toolkit, fabricmanager", [
    ("qa-installed", ("drift", "1.16.2,1.17.8"), None),
    ("qa-nomatch", ("drift", "absent"), ("drift", "absent")),
    ("qa-corrupt-db", ("probe", "error"), ("probe", "error")),  # never "absent"
])
def test_recorded_rpm_outputs_on_a_simulated_node(fleet, settings_for, case, toolkit, fabricmanager):
    stdout = os.path.join(FIXTURES, case + ".stdout")
    stderr = os.path.join(FIXTURES, case + ".stderr")
    _, _, rc = recorded(case)
    result = gpugate_cmd("sim", "replay", fleet, "gpu01", "--stdout-file", stdout, "--stderr-file", stderr,
                         "--exit-code", str(rc), "--", "rpm", "-qa", "*")
    assert result.returncode == 0, result.stderr
    settings = settings_for(fleet, packages=SETTINGS)
    findings = {f.component: (f.cls, f.observed) for f in run_check(settings, BASELINE, "gpu01",
                                                                    "healthcheck").verdict.findings}
    assert findings.get("container_toolkit") == toolkit
    assert findings.get("fabricmanager") == fabricmanager


def test_simulated_rpm_node_on_the_pin_is_fit(fleet, settings_for):
    verdict = run_check(settings_for(fleet, packages=SETTINGS), BASELINE, "gpu01", "healthcheck").verdict
    assert verdict.fit, verdict.findings
