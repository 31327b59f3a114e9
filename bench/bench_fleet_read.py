"""Benchmark: what each way of reading the whole fleet costs Slurm's own
commands, against a real slurmctld holding N nodes (no slurmd: the nodes
are never contacted, their records are what is read).

    python3 bench/bench_fleet_read.py [--nodes 2000,4000,8000] [--partitions 16] [--skip-over 60]
                                      [--reads sinfo,json,text]
    scripts/chroot-run 25.11 python3 bench/bench_fleet_read.py      # another release's Slurm

Every node is in partition "gpu" and in one of --partitions pools, and
carries a published span in its Comment (a fleet-wide event), so each
read prints what the keeper reads at its worst.  For each size it times,
one after the other, each command as gpugate runs it (the same arguments
and environment), wall and CPU (the command's own user + system time),
and prints the bytes it wrote and how the time grew from the size
before (2.0 for a read whose cost grows with the square of the fleet):

- ``sinfo --Node`` text (gpugate.slurm.nodestate.SINFO_TEXT_ARGV: the
  budget keeper's read before issue 48's last step);
- ``scontrol --json show node`` (23.02+; the fleet reads' JSON, and the
  reference of bench_budget.py);
- ``scontrol show node`` text (SCONTROL_TEXT_ARGV: the keeper's read).

A command past --skip-over seconds at one size is not run at the larger
ones (its figure there would be minutes).  Needs root (slurmctld and
munged run as root, as in the test rig) and Slurm's commands in /usr.
Prints figures; exits 1 only when the rig cannot start."""

import argparse
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

COMMENT = ("[gpugate-pending @1795744000 seen @1795744030 proof 0123456789abcdef0123456789abcdef] "
           "gpugate: drift driver=580.65.06 (want 580.95.05) [/gpugate-pending]")


def _conf(d: str, nodes: int, pools: int, port: int) -> str:
    lines = [
        "ClusterName=bench%d" % nodes, "SlurmctldHost=localhost", "SlurmctldPort=%d" % port,
        "AuthType=auth/munge", "CredType=cred/munge", "AuthInfo=socket=%s/munge.sock" % d,
        "SlurmUser=root", "StateSaveLocation=%s/ctld" % d, "SlurmctldPidFile=%s/slurmctld.pid" % d,
        "SlurmctldLogFile=%s/slurmctld.log" % d, "SlurmctldDebug=error",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "MpiDefault=none", "SelectType=select/cons_tres",
        "SlurmdTimeout=3000", "ReturnToService=2",
    ]
    # Slurm refuses a hostlist range of over 65,536 hosts: blocks of 50,000.
    blocks = ["%06d-%06d" % (first, min(nodes, first + 49999)) for first in range(1, nodes + 1, 50000)]
    lines += ["NodeName=gpu[%s] NodeAddr=127.0.0.1 Port=6999 CPUs=1 RealMemory=100 State=UNKNOWN" % block
              for block in blocks]
    lines.append("PartitionName=gpu Nodes=gpu[%s] Default=YES State=UP" % ",".join(blocks))
    per = -(-nodes // pools)
    for pool in range(pools):  # contiguous blocks: a short line whatever the fleet
        first, last = pool * per + 1, min(nodes, (pool + 1) * per)
        if first <= last:
            lines.append("PartitionName=pool%d Nodes=gpu[%06d-%06d] State=UP" % (pool, first, last))
    return "\n".join(lines) + "\n"


class Rig:
    """munged and a slurmctld with ``nodes`` nodes in a directory of its own."""

    def __init__(self, nodes: int, pools: int):
        from gpugate.testbed.procs import free_ports

        self.dir = tempfile.mkdtemp(prefix="gpugate-fleet-read.")
        d = self.dir
        os.makedirs(d + "/ctld")
        os.chmod(d, 0o700)
        with open(d + "/munge.key", "wb") as handle:
            handle.write(os.urandom(1024))
        os.chmod(d + "/munge.key", 0o400)
        subprocess.run(["/usr/sbin/munged", "--force", "--socket=%s/munge.sock" % d, "--key-file=%s/munge.key" % d,
                        "--pid-file=%s/munged.pid" % d, "--log-file=%s/munged.log" % d,
                        "--seed-file=%s/munge.seed" % d], check=True, timeout=30)
        with open(d + "/slurm.conf", "w") as handle:
            handle.write(_conf(d, nodes, pools, free_ports(1)[0]))
        self.env = dict(os.environ, SLURM_CONF=d + "/slurm.conf")
        subprocess.run(["/usr/sbin/slurmctld", "-f", d + "/slurm.conf", "-i"], check=True, timeout=60, env=self.env)
        deadline = time.monotonic() + 600  # 100,000 nodes take minutes to load
        while subprocess.run(["/usr/bin/scontrol", "ping"], env=self.env, capture_output=True).returncode:
            if time.monotonic() > deadline:
                raise SystemExit("slurmctld did not answer (see %s/slurmctld.log)" % d)
            time.sleep(0.5)
        for first in range(1, nodes + 1, 50000):
            block = "NodeName=gpu[%06d-%06d]" % (first, min(nodes, first + 49999))
            subprocess.run(["/usr/bin/scontrol", "update", block, "Comment=" + COMMENT], env=self.env, check=True,
                           timeout=600, capture_output=True)

    def timed(self, argv, env_extra=None):
        """(wall s, CPU s of the command, bytes printed, exit status, the end of what it said on stderr)."""
        env = dict(self.env, **(env_extra or {}))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as out:
            rc = subprocess.run(argv, env=env, stdout=out, stderr=err, timeout=3600).returncode
            size = out.tell()
            err.seek(0)
            said = err.read()[-300:].decode("utf-8", "replace").strip()
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), size, rc, said

    def close(self):
        for pid_file in ("slurmctld.pid", "munged.pid"):
            try:
                with open(os.path.join(self.dir, pid_file)) as handle:
                    os.kill(int(handle.read().split()[0]), 15)
            except (OSError, ValueError):
                pass
        time.sleep(1)
        shutil.rmtree(self.dir, ignore_errors=True)


def main(argv=None) -> int:
    from gpugate.slurm.nodestate import (SCONTROL_JSON_ARGV, SCONTROL_TEXT_ARGV, SCONTROL_TEXT_ENV, SINFO_TEXT_ARGV,
                                         SINFO_TEXT_ENV)

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="2000,4000,8000", help="fleet sizes, comma-separated")
    parser.add_argument("--partitions", type=int, default=16, help="pools besides the partition of all")
    parser.add_argument("--skip-over", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("--reads", default="sinfo,json,text",
                        help="which reads to time: sinfo (--Node text), json (scontrol --json), text (scontrol)")
    args = parser.parse_args(argv)
    reads = [("sinfo", "sinfo --Node text (the keeper's before)", ["/usr/bin/sinfo"] + list(SINFO_TEXT_ARGV),
              SINFO_TEXT_ENV),
             ("json", "scontrol --json show node", ["/usr/bin/scontrol"] + list(SCONTROL_JSON_ARGV), None),
             ("text", "scontrol show node text (the keeper's)", ["/usr/bin/scontrol"] + list(SCONTROL_TEXT_ARGV),
              SCONTROL_TEXT_ENV)]
    wanted = set(args.reads.split(","))
    reads = [read[1:] for read in reads if read[0] in wanted]
    print("every node in partition gpu and one of %d pools, a published span in its Comment; %d CPU cores here"
          % (args.partitions, os.cpu_count() or 1))
    last, skipped = {}, set()
    for nodes in [int(n) for n in args.nodes.split(",")]:
        rig = Rig(nodes, args.partitions)
        try:
            if not last:
                print(subprocess.run(["/usr/bin/sinfo", "--version"], capture_output=True, text=True,
                                     env=rig.env).stdout.strip())
            for what, argv, env in reads:
                if what in skipped:
                    print("%7d nodes  %-40s not run (over %g s at a smaller fleet)" % (nodes, what, args.skip_over))
                    continue
                wall, cpu, size, rc, said = rig.timed(argv, env)
                grew = ""
                if what in last and rc == 0:
                    n0, w0 = last[what]
                    grew = "  grew as size^%.2f" % (math.log(max(wall, 1e-3) / max(w0, 1e-3)) / math.log(nodes / n0))
                print("%7d nodes  %-40s wall %8.2f s  CPU %8.2f s  %6.1f MB%s%s" % (
                    nodes, what, wall, cpu, size / 1e6, grew, "" if rc == 0 else "  (exit %d: %s)" % (rc, said)))
                if rc == 0:
                    last[what] = (nodes, wall)
                if wall > args.skip_over:
                    skipped.add(what)
        finally:
            rig.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
