"""A real OpenSSH sshd on loopback for the transport tests: a throwaway host
key and client key, StrictModes on, and an ssh_config that makes each
simulated node reachable by its name.

Node kinds: "ok" (sshd runs the remote command), "hang" (a port whose
ForceCommand sleeps), "closed" (a port nothing listens on), "mismatch"
(known_hosts holds another key for it)."""

import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

SSHD = "/usr/sbin/sshd"
KEYGEN = "/usr/bin/ssh-keygen"
HANG_SECONDS = 30


def require_sshd():
    if not (os.path.exists(SSHD) and os.path.exists("/usr/bin/ssh")):
        why = "OpenSSH is not installed (apt-get install openssh-server openssh-client; scripts/setup does)"
        if os.environ.get("GPUGATE_REQUIRE_SSH"):
            pytest.fail(why)
        pytest.skip(why)
    if os.geteuid() != 0:
        pytest.skip("sshd runs as root in these tests")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _keygen(path: str) -> str:
    subprocess.run([KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "gpugate-test", "-f", path],
                   check=True, timeout=30, capture_output=True)
    with open(path + ".pub") as handle:
        return " ".join(handle.read().split()[:2])


class SshRig:
    def __init__(self):
        require_sshd()
        # Not under /tmp: sshd's StrictModes refuses a world-writable directory
        # above authorized_keys, sticky or not.
        self.dir = tempfile.mkdtemp(prefix="gpugate-ssh-", dir="/run")
        os.chmod(self.dir, 0o700)
        self.host_pub = _keygen(os.path.join(self.dir, "host_key"))
        self.other_pub = _keygen(os.path.join(self.dir, "other_host_key"))  # never served
        client_pub = _keygen(os.path.join(self.dir, "client_key"))
        self._write("authorized_keys", client_pub + "\n", 0o600)
        self.port, self.hang_port = free_port(), free_port()
        # The closed node's port stays bound and never listens: connecting is
        # refused at once, and no other test's server can take the port in
        # the meantime (a freed port can be, and then ssh waits for a banner).
        self._closed = socket.socket()
        self._closed.bind(("127.0.0.1", 0))
        self.closed_port = self._closed.getsockname()[1]
        self.config = self._write("sshd_config", "\n".join([
            "ListenAddress 127.0.0.1:%d" % self.port,
            "ListenAddress 127.0.0.1:%d" % self.hang_port,
            "HostKey %s/host_key" % self.dir,
            "PidFile %s/sshd.pid" % self.dir,
            "AuthorizedKeysFile %s/authorized_keys" % self.dir,
            "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes yes", "LogLevel ERROR",
            "Match LocalPort %d" % self.hang_port,
            "    ForceCommand /bin/sleep %d" % HANG_SECONDS, ""]), 0o600)
        self.proc = None

    def _write(self, name: str, text: str, mode: int = 0o644) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w") as handle:
            handle.write(text)
        os.chmod(path, mode)
        return path

    def start(self) -> "SshRig":
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        log = open(os.path.join(self.dir, "sshd.log"), "w")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", self.config], stdout=log, stderr=log,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("sshd exited %s: %s" % (self.proc.returncode, self.log()))
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not listen within 10 s: %s" % self.log())

    def log(self) -> str:
        with open(os.path.join(self.dir, "sshd.log")) as handle:
            return handle.read()[-2000:]

    def ssh_config(self, nodes: dict) -> str:
        """node -> kind; writes the ssh_config and its known_hosts."""
        ports = {"ok": self.port, "mismatch": self.port, "hang": self.hang_port, "closed": self.closed_port}
        known, hosts = [], []
        for node, kind in nodes.items():
            # HostKeyAlias: every node is 127.0.0.1, each has its own known_hosts line.
            known.append("%s %s" % (node, self.other_pub if kind == "mismatch" else self.host_pub))
            hosts += ["Host %s" % node, "    HostName 127.0.0.1", "    Port %d" % ports[kind],
                      "    HostKeyAlias %s" % node]
        self._write("known_hosts", "\n".join(known) + "\n")
        hosts += ["Host *", "    User root", "    IdentityFile %s/client_key" % self.dir,
                  "    IdentitiesOnly yes", "    UserKnownHostsFile %s/known_hosts" % self.dir,
                  "    GlobalKnownHostsFile /dev/null", "    StrictHostKeyChecking yes", "    CheckHostIP no",
                  "    LogLevel ERROR", ""]
        return self._write("ssh_config", "\n".join(hosts), 0o600)

    def stop(self) -> None:
        self._closed.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)
