"""What the Kubernetes tests need built on this machine (kube-apiserver by
scripts/kube-build, Helm by scripts/helm-build): found, or the test is
skipped saying so; under CI (CI=true), which builds both, failed."""

import os

import pytest


def _require(found, message):
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail(message + "; CI=true: CI builds it", pytrace=False)
    pytest.skip(message)


def require_kube() -> None:
    from gpugate.testbed.kube import built_versions, cache_dir

    _require(built_versions(), "no kube-apiserver built in %s (scripts/kube-build; scripts/test --kube builds it)"
             % cache_dir())


def require_helm() -> str:
    from gpugate.testbed.manifests import helm_binary

    return _require(helm_binary(), "no helm built (scripts/helm-build; scripts/test --kube builds it)")
