"""The node agent's token as the rigs hand it out: one naming its node.

deploy/kubernetes/agent-policy.yaml fails closed: a token of the node
agent's ServiceAccount that names no node (the rigs' static ``agent``
token, a Secret's, a TokenRequest bound to nothing) writes no Node.  The
DaemonSet's pod gets a token bound to it, which the API server stamps with
the pod's node (``authentication.kubernetes.io/node-name``).  The rigs run
one gpugate.toml for every simulated node, so each node's run gets its own
copy of it, with a real token from a TokenRequest bound to that Node (the
API server stamps the same claim; no Pod is needed, so none is there for
the sweep to evict), minted again for each run (a Node registered anew
has a new uid, and the old token is then refused)."""

import os
import re

NAMESPACE = "gpugate"
AGENT = "gpugate-node-agent"


def node_token(admin, node: str, namespace: str = NAMESPACE, seconds: int = 3600) -> str:
    """A token of the node agent's ServiceAccount bound to the Node ``node`` as it is now."""
    from gpugate.kube.client import node_path

    uid = admin.get(node_path(node))["metadata"]["uid"]
    answer = admin.create("/api/v1/namespaces/%s/serviceaccounts/%s/token" % (namespace, AGENT), {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": seconds,
                 "boundObjectRef": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}}})
    return answer["status"]["token"]


def node_config(api, config: str, node: str) -> str:
    """``config`` for the run on ``node``: where it names the static agent token,
    a copy naming a token bound to that Node (written beside it, 0600); any
    other config as it is."""
    with open(config) as handle:
        text = handle.read()
    static = api.token_file("agent")
    if not re.search(r'^token_file = "%s"$' % re.escape(static), text, re.M):
        return config
    base = "%s.%s" % (os.path.splitext(config)[0], node)
    token = base + ".token"
    fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(node_token(api.admin(), node) + "\n")
    with open(base + ".toml", "w") as handle:
        handle.write(text.replace('token_file = "%s"' % static, 'token_file = "%s"' % token))
    return base + ".toml"
