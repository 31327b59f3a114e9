"""deploy/container/Containerfile, held to what matters without a container
tool (these machines and CI have none: no podman, buildah or docker daemon,
and no registry to pull a base image from; hadolint is not packaged here).
What is checked: the image installs the wheel and nothing else of the tree,
its base is pinned, it says why it runs as root, its entry point is gpugate;
the wheel stage copies everything setup.cfg builds from, and a wheel built
from exactly those paths holds the Kubernetes manifests.  What is not: that
the image builds and starts (docs/how-to/kubernetes.md, "The Helm chart, the image, the wheel")."""

import configparser
import json
import os
import re
import zipfile

import pytest
from containerfile import CONTAINERFILE, build, copied_into_build, instructions, stages

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def parsed():
    with open(CONTAINERFILE) as handle:
        return stages(instructions(handle.read()))


def test_parser_reads_continuations_and_comments():
    text = "ARG B=img:1.2.3\nFROM ${B} AS w\n# why\nRUN a \\\n  && b\n\n# not this\n\n# root: because\nUSER 0\n"
    assert stages(instructions(text)) == [("img:1.2.3 AS w", [("RUN", "a && b", ["why"]),
                                                              ("USER", "0", ["root: because"])])]


def test_two_stages_the_image_installs_the_wheel_only(parsed):
    assert len(parsed) == 2, "a wheel stage and the image"
    (build_from, build), (_, final) = parsed
    build_name = build_from.split()[-1]
    wheel_runs = [a for k, a, _ in build if k == "RUN" and "pip wheel" in a]
    assert wheel_runs and wheel_runs[0].rstrip().endswith(" .")
    # What gpugate-healthcheck needs on a node (setup.cfg install_requires: nvidia-ml-py, click,
    # ClusterShell) is built beside the wheel and installed with it: neither step skips them.
    assert "--no-deps" not in wheel_runs[0]
    copies = [a for k, a, _ in final if k in ("COPY", "ADD")]
    assert copies and all(a.startswith("--from=%s " % build_name) for a in copies), \
        "the image takes the wheels from the wheel stage and nothing from the source tree: %s" % copies
    installs = [a for k, a, _ in final if k == "RUN" and "pip install" in a]
    assert installs and "--no-index" in installs[0] and "--find-links" in installs[0], \
        "installed from the wheels alone, nothing fetched in the image's stage"
    assert "--no-deps" not in installs[0]
    assert re.search(r"\bgpugate\b", installs[0].split("--find-links")[1])


def test_base_image_pinned(parsed):
    for base, _ in parsed:
        image = base.split()[0]
        if "@sha256:" in image:
            assert re.fullmatch(r"\S+@sha256:[0-9a-f]{64}", image)
            continue
        tag = image.rsplit(":", 1)[-1] if ":" in image.rsplit("/", 1)[-1] else ""
        assert re.match(r"\d+\.\d+\.\d+(-|$)", tag), "%s: pinned by digest or an exact release tag" % image


def test_runs_as_root_only_saying_why(parsed):
    users = [(a, c) for k, a, c in parsed[-1][1] if k == "USER"]
    assert users, "the image says whom it runs as"
    user, why = users[-1]
    if user.split(":")[0] in ("0", "root"):
        reason = " ".join(why)
        for need in ("/dev/kmsg", "NVML", "root's alone"):
            assert need in reason, "USER root without saying why (%s)" % need


def test_entrypoint_is_gpugate_and_every_workload_runs_it(parsed):
    entry = [a for k, a, _ in parsed[-1][1] if k == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["gpugate"]
    from gpugate.testbed import manifests

    commands = []
    for doc in manifests.packaged():
        spec = doc.get("spec", {})
        pod = (spec.get("jobTemplate", {}).get("spec", spec)).get("template", {}).get("spec", {})
        commands += [c["command"] for c in pod.get("containers", [])]
    assert len(commands) >= 3 and all(c[0] == "gpugate" for c in commands), commands


def test_wheel_stage_copies_what_setup_cfg_builds_from(parsed):
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    needed = {"setup.cfg", "pyproject.toml", "gpugate"}
    needed |= {p.split("/")[0] for p in cfg["options"]["scripts"].split()}
    needed.add(cfg["metadata"]["long_description"].split("file:")[1].strip())
    assert needed <= set(copied_into_build(parsed)), needed - set(copied_into_build(parsed))


def test_a_wheel_from_those_paths_alone_holds_the_manifests(parsed, tmp_path):
    """The wheel stage's copy, built as it builds it (offline here: no
    isolation), is a wheel that ships gpugate/data/kubernetes.json equal to
    the source tree's (the demo's manifests, from a pip install)."""
    wheel_path = build(copied_into_build(parsed), str(tmp_path))
    with zipfile.ZipFile(wheel_path) as wheel:
        shipped = json.loads(wheel.read("gpugate/data/kubernetes.json"))
        names = wheel.namelist()
    with open(os.path.join(ROOT, "gpugate", "data", "kubernetes.json")) as handle:
        assert shipped == json.load(handle)
    assert shipped["kind"] == "List" and {d["kind"] for d in shipped["items"]} >= {"DaemonSet", "Namespace"}
    assert "gpugate/testbed/manifests.py" in names and "gpugate/cli/demo_kube.py" in names
