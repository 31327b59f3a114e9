"""gpugate.toml's [preflight] table (gpugate.preflight, docs/explanation/preflight-design.md):
an active proof on a job's fresh allocation, in the prolog, before the
job's own code.  Off until a partition or a job asks for it.  The
validators for commands, words and hosts are config.py's."""

from gpugate.model.schema import Bool, Choice, Int, ListOf, Number, Str, Table

# The gangs a Pod can belong to on Kubernetes (gpugate.kube.gangs), in the order asked.
GANG_KINDS = ("workload", "jobset", "kueue", "volcano")


def table(argv, word, host) -> Table:
    return Table({
        "partitions": (ListOf(Str("gpu-train", lambda v: word(v, "a partition name"))), ()),
        # A job asks for it with this word in its --comment or --extra (data to
        # gpugate: it can switch the preflight on, never off, never change what runs).
        "job_word": (Str("gpugate-preflight", lambda v: word(v, "one word")), "gpugate-preflight"),
        "min_nodes": (Int(1, 1000000), 2),  # smaller jobs skip it
        "dcgm_level": (Int(0, 4), 1),  # dcgmi diag -r N on the job's GPUs (RVS level on AMD); 0: none
        # The single-node all_reduce, judged against the baseline's [smoke] min_busbw_gbps; () for none.
        "allreduce": (argv, ("/opt/nccl-tests/build/all_reduce_perf", "-b", "256M", "-e", "256M", "-g", "{gpus}",
                              "-c", "1", "-n", "20")),
        # The whole per-node proof; PrologEpilogTimeout covers it (gpugate.slurm.prologtimeout).
        "timeout_seconds": (Number(5, 3600), 120.0),
        # The all_reduce across the job's nodes (gpugate.preflight.cross): each node
        # runs its rank with {rank} {nranks} {root} {port} {nodes} {gpus}; () for none.
        "allreduce_multi": (argv, ()),
        "rendezvous_host": (Str("{node}", host), "{node}"),  # rank 0's address
        # The meeting's ports: drawn in [port, port + ports) by meet.ports_for (the collective's: one above).
        "port": (Int(1024, 65000), 7150),
        "ports": (Int(1, 512), 64),
        "across_seconds": (Number(5, 3600), 300.0),  # meeting, collective and culprit search, after timeout_seconds
        "run_seconds": (Number(2, 3600), 60.0),  # one collective
        # A failure across the nodes no node could be pinned for: the job starts,
        # or is requeued once (its first start only: SLURM_JOB_RESTART_COUNT=0).
        "undecided": (Choice("start", "requeue_once"), "start"),
        # A pin across nodes is budgeted (a job's user can slow a shared link): the keeper drains at most
        # this many pinned nodes per partition and hour, within the drain budget (0: pins stay published).
        "pins_per_hour": (Int(0, 1000), 1),
        # Before a node joins the run across nodes, its environment as the run needs it (free MiB in
        # /dev/shm and /tmp, no other job on the node): one that fails is undecided, never a suspect.
        "shm_free_mb": (Int(0, 1 << 20), 1024),
        "tmp_free_mb": (Int(0, 1 << 20), 256),
        # Kubernetes (gpugate.node.kube_preflight): the node agent serves the preflight init container
        # of opted-in GPU Pods on this port (the chart's Service, internalTrafficPolicy Local).
        "kubernetes": (Bool(), False),
        "kube_port": (Int(1024, 65535), 9412),
        # Which gangs a Pod's peers are found through, in this order (gpugate.kube.gangs).
        "gangs": (ListOf(Choice(*GANG_KINDS)), GANG_KINDS),
    })
