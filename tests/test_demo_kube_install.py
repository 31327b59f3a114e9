"""`gpugate demo kubernetes` as a site's pip install runs it (issue 45,
"installed as sites install it"): from a wheel installed into a virtual
environment, away from this checkout, it finds the manifests gpugate ships
(the chart's defaults) and applies them; a write the real API server
refuses, a manifest's or a node agent's, stops it with the server's own
words and a non-zero exit (it used to apply nothing without a word and show
"?" in every row)."""

import json
import os
import subprocess
import sys

import pytest
from containerfile import build, wheel_stage_paths
from kube_builds import require_helm, require_kube

from gpugate.cli.demo_kube import _refusal
from gpugate.testbed import manifests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_refusal_reads_the_agents_record():
    refused = {"action": "failed", "verdict": "fit", "slurm_error": "kubernetes GET /api/v1/nodes/gpu01: 403 Forbidden"}
    assert _refusal(json.dumps(refused)) == refused["slurm_error"]
    assert _refusal(json.dumps({"action": "none", "verdict": "fit"})) == ""
    assert _refusal(json.dumps({"condition_error": "409 Conflict"})) == "409 Conflict"
    assert "not a record" in _refusal("Traceback (most recent call last):")
    assert "not a record" in _refusal("[1, 2]")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A virtual environment with gpugate's wheel installed (its
    dependencies from this Python's site-packages: no index is asked)."""
    require_kube()
    top = tmp_path_factory.mktemp("install")
    venv = str(top / "venv")
    wheel = build(wheel_stage_paths(), str(top))  # as the Containerfile's wheel stage builds it
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True, timeout=120)
    python = os.path.join(venv, "bin", "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                              "--disable-pip-version-check", wheel], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-2000:]
    where = subprocess.run([python, "-c", "import gpugate; print(gpugate.__file__)"], capture_output=True,
                           text=True, timeout=60, cwd=str(top))
    assert where.stdout.startswith(venv), where.stdout + where.stderr  # the wheel's, not this checkout
    return venv, str(top)


def _refused(installed, docs, path):
    """The demo run with ``docs``: it must stop (non-zero); its output."""
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    out = _demo(installed, "--manifests", str(path))
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    return text


def _demo(installed, *args):
    venv, cwd = installed
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([os.path.join(venv, "bin", "gpugate"), "demo", "kubernetes", "--nodes", "3"] + list(args),
                          capture_output=True, text=True, timeout=600, cwd=cwd, env=env)



@pytest.mark.kube
def test_the_demo_from_a_pip_install_applies_the_shipped_manifests(installed):
    out = _demo(installed)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    for kind, name in [(d["kind"], d["metadata"]["name"]) for d in manifests.packaged()]:
        assert "  %s/%s\n" % (kind, name) in text
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("gpu0")]
    assert rows and all(row[3] != "?" for row in rows), text[-3000:]  # each agent wrote its condition
    assert "returned: " in text


@pytest.mark.kube
def test_a_refused_agent_write_stops_the_demo_with_the_servers_words(installed, tmp_path):
    """The chart rendered with its policies off and the node agent's
    ClusterRoleBinding left out (an install that never granted it): the
    real API server's RBAC refuses the demo's node agent; the demo says so
    in the server's words and stops."""
    helm = require_helm()
    docs = manifests.parse(manifests.helm_template(helm, os.path.join(ROOT, manifests.CHART),
                                                   "--set", "policies.enabled=false"), "helm template")
    docs = [d for d in docs if (d["kind"], d["metadata"]["name"]) != ("ClusterRoleBinding", "gpugate-node-agent")]
    text = _refused(installed, docs, tmp_path / "ungranted.json")
    assert "the API server refused the node agent on gpu01: " in text, text[-3000:]
    assert ('403 Forbidden: nodes "gpu01" is forbidden: User "system:serviceaccount:gpugate:gpugate-node-agent" '
            'cannot get resource "nodes"') in text, text[-3000:]
    assert "== 2." not in text  # stopped at the first refusal


@pytest.mark.kube
def test_a_refused_manifest_stops_the_demo_with_the_servers_words(installed, tmp_path):
    docs = manifests.packaged()
    agent = next(d for d in docs if d["kind"] == "DaemonSet")
    agent["spec"]["template"]["spec"]["hostNetworking"] = True  # a typo of hostNetwork
    text = _refused(installed, docs, tmp_path / "typo.json")
    assert "the API server refused DaemonSet/gpugate-node-agent" in text, text[-3000:]
    assert 'unknown field "spec.template.spec.hostNetworking"' in text, text[-3000:]


def test_missing_manifests_are_said(tmp_path):
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_file(str(tmp_path / "none.json"))
    assert "cannot read the Kubernetes manifests" in str(err.value)
    (tmp_path / "empty.json").write_text('{"apiVersion": "v1", "kind": "List", "items": []}')
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_file(str(tmp_path / "empty.json"))
    assert "holds no Kubernetes objects" in str(err.value)
    with pytest.raises(manifests.ManifestError):
        manifests.load_dir(str(tmp_path))
