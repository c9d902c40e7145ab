"""How a pod ended, reduced to what dispatch's rule reads, so that endings a real kubelet wrote and
those the fake's kubelet or KWOK imitate can be compared (the imitation is held to what was observed).

The shape keeps the phase, the status reason, the message up to its first colon, whether conditions
that other writers of a terminal phase add are present, and per container (regular and init, by
position) its state kind, reason, exit code and message. Names, times, images and ids are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._views import FOREIGN_TERMINAL_MARKS, PodView


def _containers(statuses: object) -> list[tuple[str, str, int | None, str]]:
    out = []
    for c in statuses if isinstance(statuses, list) else []:
        state = c.get("state") if isinstance(c, Mapping) else None
        state = state if isinstance(state, Mapping) else {}
        kind = next((k for k in ("running", "waiting", "terminated") if k in state), "")
        detail = state.get(kind) if kind else None
        detail = detail if isinstance(detail, Mapping) else {}
        code = detail.get("exitCode")
        out.append((kind, str(detail.get("reason") or ""), code if isinstance(code, int) else None,
                    str(detail.get("message") or "") if kind == "terminated" else ""))
    return out


def ending_shape(status: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a pod ``status`` the rule reads, comparable across clusters and runs."""
    message = status.get("message")
    marks = sorted({(str(c.get("type")), str(c.get("reason") or "")) for c in status.get("conditions") or []
                    if isinstance(c, Mapping) and c.get("status") == "True"
                    and ((str(c.get("type")), str(c.get("reason") or "")) in FOREIGN_TERMINAL_MARKS
                         or (str(c.get("type")), "") in FOREIGN_TERMINAL_MARKS)})
    return {
        "phase": status.get("phase"),
        "reason": status.get("reason"),
        "message": message.split(":", 1)[0] if isinstance(message, str) else None,
        "containerStatuses": _containers(status.get("containerStatuses")) if "containerStatuses" in status
        else None,
        "initContainerStatuses": _containers(status.get("initContainerStatuses"))
        if "initContainerStatuses" in status else None,
        "foreignMarks": marks,
    }


def proof_of(status: Mapping[str, Any], restart_policy: str, containers: Sequence[str],
             init_containers: Sequence[str] = ()) -> bool:
    """Whether the rule takes ``status`` as its kubelet's confirmation of the pod's end."""
    pod = {"metadata": {"name": "p", "uid": "p"},
           "spec": {"nodeName": "n", "restartPolicy": restart_policy,
                    "containers": [{"name": c} for c in containers],
                    "initContainers": [{"name": c} for c in init_containers]},
           "status": dict(status)}
    return PodView.from_obj(pod).kubelet_confirmed
