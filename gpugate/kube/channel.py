"""The sweep's channel to the node agent on Kubernetes (``[sweep] transport
= "kubernetes"``): no ssh into the nodes.  The sweep writes a request on
the Node (annotation ``REQUEST``: an id, gpugate's argv, a timeout); the
node agent (gpugate.node.kube_agent, the DaemonSet) runs it on its node and
writes the answer beside it (``ANSWER``: the same id and the JSON line the
command printed).  Pure: formats, and what a request may ask.

A token that may patch Nodes must never become root on them: the agent
runs only these argv shapes (``refusal``), each a gpugate command of the
sweep's with fixed flags, always against its own node and its own
gpugate.toml.  It serves requests only while gpugate holds its Node, and
a GPU reset only while the sweep does (its reason: the node's pods were
evicted first).  It claims a request on the Node before it runs it (the
answer's state "running", written with the resourceVersion read), so a
request is run at most once, by one agent, and one not started within a
minute of being asked (``expired``: the sweep may have moved on) is not
run at all."""

from __future__ import annotations

import json
import math
import re

from gpugate.core.jsontext import loads_bounded

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Sequence

REQUEST = "gpugate.io/request"
ANSWER = "gpugate.io/answer"
ANSWER_CAP = 64 << 10  # of the 256 KiB a Node's annotations may hold in all
RUNNING = "running"  # the answer's state once the agent has claimed a request, before it ends
# A request is started only this soon after it was asked (by the agent's clock): it then ends
# before the sweep stops waiting (its timeout + gpugate.kube.transport.AGENT_GRACE, 120 s), with
# room for the two clocks to differ.  Later, the sweep may have moved on (to a reboot): refused.
START_WITHIN_SECONDS = 60.0


def _number(word: str) -> bool:
    try:
        return 0 < float(word) <= 86400  # (NaN compares false)
    except (ValueError, OverflowError):
        return False


def _seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 86400  # (not NaN)


def _finite(value) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


# verb -> {flag: the values it may take (a callable judges one)}; "--gpu" may repeat.
_FLAGS = {
    "check": {"--mode": ("verify", "healthcheck"), "--pin": ("previous", "current"),
              "--gpu": lambda w: re.fullmatch(r"[0-9]{1,2}", w) is not None},
    "facts": {"--max-age": _number},
    "reset-gpus": {"--timeout": _number, "--gpu": lambda w: re.fullmatch(r"[0-9]{1,2}", w) is not None},
}


def refusal(argv: Sequence[str]) -> str:
    """Why the agent must not run ``argv`` ("": it may)."""
    if not argv or argv[0] not in _FLAGS:
        return "not a command the node agent runs for the sweep: %r (check, facts, reset-gpus)" % (
            argv[0] if argv else "")
    flags, seen = _FLAGS[argv[0]], set()
    words = list(argv[1:])
    if len(words) % 2:
        return "a flag without its value in %r" % list(argv)
    for flag, value in zip(words[::2], words[1::2]):
        allowed = flags.get(flag)
        if allowed is None:
            return "%s takes no %s here" % (argv[0], flag)
        if flag in seen and flag != "--gpu":
            return "%s given twice" % flag
        seen.add(flag)
        if not (allowed(value) if callable(allowed) else value in allowed):
            return "%s %r is not allowed" % (flag, value)
    return ""


def request_text(ident: str, argv: Sequence[str], timeout: float, at: float) -> str:
    return json.dumps({"id": ident, "argv": list(argv), "timeout": round(float(timeout), 3), "at": round(at, 3)},
                      sort_keys=True, separators=(",", ":"))


def read_request(node: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The request on the Node, when it has gpugate's shape; else None."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(REQUEST)
    try:
        data = loads_bounded(text) if isinstance(text, str) and len(text) < 4096 else None
    except ValueError:  # deep nesting too (a Node's annotation is anyone's with patch rights)
        return None
    if not (isinstance(data, dict) and isinstance(data.get("id"), str) and data["id"]
            and isinstance(data.get("argv"), list) and all(isinstance(w, str) for w in data["argv"])
            and _seconds(data.get("timeout")) and _finite(data.get("at"))):
        return None
    return data


def expired(request: Dict[str, Any], now: float) -> bool:
    return not -START_WITHIN_SECONDS <= now - float(request["at"]) <= START_WITHIN_SECONDS


def claimed(node: Dict[str, Any], ident: str) -> bool:
    """Has the agent taken up (or answered) request ``ident``?  Never run twice."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(ANSWER)
    try:
        data = loads_bounded(text) if isinstance(text, str) and len(text) <= ANSWER_CAP else None
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("id") == ident


def answer_text(ident: str, at: float, answer: Optional[Dict[str, Any]] = None, error: str = "",
                state: str = "") -> str:
    """The answer annotation: the command's JSON object, or why there is none;
    state=RUNNING: claimed, the command under way."""
    body: Dict[str, Any] = {"id": ident, "at": round(at, 3)}
    if state:
        body["state"] = state
    elif answer is not None:
        body["answer"] = answer
    else:
        body["error"] = error[:2000] or "no answer"
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if len(text) > ANSWER_CAP:
        return answer_text(ident, at, error="the answer (%d bytes) is larger than the Node channel carries (%d): "
                                            "use [sweep] transport = \"ssh\" for it" % (len(text), ANSWER_CAP))
    return text


def read_answer(node: Dict[str, Any], ident: str):
    """The answer to request ``ident``: the command's JSON object, an error
    string, or None while there is none (or it answers another request)."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(ANSWER)
    try:
        data = loads_bounded(text) if isinstance(text, str) and len(text) <= ANSWER_CAP else None
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("id") != ident or data.get("state") == RUNNING:
        return None
    if isinstance(data.get("answer"), dict):
        return data["answer"]
    return "the node agent: %s" % str(data.get("error") or "no answer")[:500]


def run_argv(gpugate: List[str], argv: Sequence[str], node: str, config: str) -> List[str]:
    """What the agent runs for a request it may serve: its own gpugate, its node, its configuration."""
    out = list(gpugate) + list(argv) + ["--json", "--node", node]
    return out + (["--config", config] if config else [])
