"""gpugate.toml and the baseline from a Kubernetes Secret or ConfigMap
volume, through the trust checks (gpugate.safety.trust).  The kubelet lays such a
volume out with its atomic writer: the volume's root (tmpfs, root's,
drwxrwxrwt), a timestamped directory holding the files, a ``..data``
symlink to it, and one symlink per key to ``..data/KEY``; an update writes
a new timestamped directory and swaps ``..data``.  The layout is built here
as the kubelet leaves it (the file-system boundary); the loading is
gpugate's own."""

import os

import pytest

from gpugate.model.config import load_checked_baseline, load_settings
from gpugate.safety.trust import Untrusted

DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpugate", "data",
                    "demo-baseline.toml")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the kubelet's files are root's: run as root")


def kubelet_volume(root, files, mode=0o644, stamp="..2026_11_28_07_31_19.1234567890"):
    """``files`` (key -> text) as the kubelet's atomic writer leaves them
    (defaultMode ``mode``); returns the volume's root."""
    os.makedirs(root, exist_ok=True)
    os.chmod(root, 0o1777)
    data = os.path.join(root, stamp)
    os.mkdir(data)
    os.chmod(data, 0o755)
    for key, text in files.items():
        with open(os.path.join(data, key), "w") as handle:
            handle.write(text)
        os.chmod(os.path.join(data, key), mode)
    link = os.path.join(root, "..data_tmp")
    os.symlink(stamp, link)
    os.rename(link, os.path.join(root, "..data"))  # the atomic swap
    for key in files:
        if not os.path.islink(os.path.join(root, key)):
            os.symlink(os.path.join("..data", key), os.path.join(root, key))
    return str(root)


def config_text(volume, state):
    return 'baseline = "%s/baseline.toml"\nstate_dir = "%s/{node}"\nscheduler = "kubernetes"\n' % (volume, state)


def test_a_secret_volume_loads_through_the_trust_checks_and_an_update_is_read(tmp_path):
    volume = str(tmp_path / "etc-gpugate")
    kubelet_volume(volume, {"gpugate.toml": config_text(volume, tmp_path / "state"),
                            "baseline.toml": open(DEMO).read()})
    settings = load_settings(os.path.join(volume, "gpugate.toml"))
    assert settings.scheduler == "kubernetes"
    assert load_checked_baseline(settings).name == "demo-h100-r580"
    # The kubelet's update: a new timestamped directory, ..data swapped to it.
    newer = open(DEMO).read().replace('name = "demo-h100-r580"', 'name = "demo-h100-r580-next"', 1)
    kubelet_volume(volume, {"gpugate.toml": config_text(volume, tmp_path / "state"), "baseline.toml": newer},
                   stamp="..2026_11_28_08_00_00.2222222222")
    assert load_checked_baseline(load_settings(os.path.join(volume, "gpugate.toml"))).name == "demo-h100-r580-next"


def test_a_volume_whose_files_others_could_change_is_refused(tmp_path):
    # defaultMode 0666 (a careless manifest): anyone in the pod could rewrite the baseline.
    volume = str(tmp_path / "etc-gpugate")
    kubelet_volume(volume, {"gpugate.toml": config_text(volume, tmp_path / "state")}, mode=0o666)
    with pytest.raises(Untrusted):
        load_settings(os.path.join(volume, "gpugate.toml"))
    # A key whose timestamped directory is not root's: refused, though the link is root's.
    other = str(tmp_path / "other")
    kubelet_volume(other, {"gpugate.toml": config_text(other, tmp_path / "state")})
    os.chown(os.path.join(other, "..2026_11_28_07_31_19.1234567890"), 1000, 1000)
    with pytest.raises(Untrusted):
        load_settings(os.path.join(other, "gpugate.toml"))
