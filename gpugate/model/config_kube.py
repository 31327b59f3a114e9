"""gpugate.toml's [kubernetes] table: where the node agent, the keeper and
the sweep reach the API server, and what the sweep needs that Slurm gave
it (a reboot command, the smoke Pod's image).  Defaults: a pod's own
ServiceAccount.  The validators for paths and words are config.py's."""

from gpugate.model.schema import Bool, Int, ListOf, Number, Str, Table


def _node_template(value: str):
    rest = value.replace("{node}", "")
    if "{node}" not in value or "{" in rest or "}" in rest or "/" in value or " " in value:
        return "expected a Node name with {node} for the Slurm node's name (\"{node}\", \"{node}.example.com\")"
    return None


def _address(value: str):
    import ipaddress

    try:
        ipaddress.ip_address(value or "0.0.0.0")
    except ValueError:
        return "expected an IP address to serve metrics on (\"0.0.0.0\", \"127.0.0.1\", \"::\") or \"\" (every address)"
    return None


def table(opt_path, word) -> Table:
    return Table({
        "server": (Str("https://10.0.0.1:6443", lambda v: None if v == "" or v.startswith(("https://", "http://"))
                       else "expected https://HOST[:PORT] or \"\" (in a pod: KUBERNETES_SERVICE_HOST)"), ""),
        "token_file": (opt_path, "/var/run/secrets/kubernetes.io/serviceaccount/token"),
        "ca_file": (opt_path, "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"),
        "timeout_seconds": (Number(1, 600), 10.0),
        "pool_label": (Str("nvidia.com/gpu.product"), ""),  # the budget's pools, as partitions ("": one pool)
        "no_execute": (Bool(), False),  # NoExecute too (running pods evicted), for acute findings only
        # One GPU's own finding holds that GPU alone (a DRA DeviceTaintRule, Kubernetes 1.37+), not its Node.
        "device_holds": (Bool(), False),
        "namespace": (Str("gpugate", lambda v: word(v, "a namespace")), "gpugate"),  # the Lease, the smoke Pods
        # > a keeper run (25 s) + the watch interval (30 s): the leader renews in time
        "lease_seconds": (Number(60, 3600), 60.0),
        # The leader gives the Lease up after this many failed runs in a row: another replica takes over.
        "lease_give_up_runs": (Int(1, 1000), 3),
        # Prometheus metrics over HTTP from `gpugate budget --watch` and `gpugate agent` (0: none;
        # --metrics-port overrides), on this address ("": every address of the pod).
        "metrics_port": (Int(0, 65535), 0),
        "metrics_address": (Str("0.0.0.0", _address), ""),
        # The nodes the keeper and the sweep read ("": every Node; "nvidia.com/gpu.present=true": GPU nodes only).
        "node_selector": (Str("nvidia.com/gpu.present=true"), ""),
        # The sweep's reboot: Kubernetes has no reboot verb, so the site's own
        # command (run on the sweep's host, {node} the Node's name), e.g. a BMC
        # tool or ["ssh", "{node}", "systemctl", "reboot"].  []: a node that
        # needs a reboot stops the sweep, held, with this named.
        "reboot": (ListOf(Str("systemctl")), []),
        # The smoke Pods' namespace: Pod Security "baseline" enforced there (deploy/kubernetes), so
        # the sweep's right to make Pods is never a right to a privileged one.
        "smoke_namespace": (Str("gpugate-smoke", lambda v: word(v, "a namespace")), "gpugate-smoke"),
        # The smoke all_reduce as a Pod pinned to the node ("": no smoke on Kubernetes).
        "smoke_image": (Str("nvcr.io/nvidia/pytorch:25.01-py3"), ""),
        "smoke_resource": (Str("nvidia.com/gpu", lambda v: word(v.replace("/", "."), "a resource name")),
                           "nvidia.com/gpu"),  # what the device plugin calls the GPUs of an NVIDIA node
        # Where the GPU operators run their pods ([operator] image pins: the node's pods there are read).
        "operator_namespace": (Str("gpu-operator", lambda v: word(v, "a namespace")), "gpu-operator"),
        "operator_namespace_amd": (Str("kube-amd-gpu", lambda v: word(v, "a namespace")), "kube-amd-gpu"),
        # Slurm on Kubernetes (scheduler = "slurm+kubernetes"): the Node that runs a Slurm
        # node, {node} its Slurm name (Slinky's DaemonSet mode: the same name).
        "node_name": (Str("{node}", _node_template), "{node}"),
        # Slurm on Kubernetes: slurmd's gpugate writes the Node's hold and condition into this file
        # ({node}: the Slurm node's name), never the Node; the slurmd pod's sidecar (`gpugate agent
        # --mirror-from FILE`) alone holds a token and writes the Node ("": slurmd's gpugate writes it).
        "mirror_file": (opt_path, ""),
        "smoke_resource_amd": (Str("amd.com/gpu", lambda v: word(v.replace("/", "."), "a resource name")),
                               "amd.com/gpu"),  # ... and of an AMD node (the baseline's vendor)
        # After a reboot the sweep waits this long past Ready for the Node's GPUs (smoke_resource) to be
        # allocatable again (a GPU operator's driver container loads minutes after Ready); then held.
        "gpus_allocatable_timeout": (Number(1, 86400), 600.0),
    })
