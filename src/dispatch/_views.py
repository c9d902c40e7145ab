"""Views of cluster objects, parsed once where they are read.

Everything dispatch reads from the cluster passes through these parsers, which are strict (numbers
are ASCII digits of bounded length, never ``int()`` of whatever a third party wrote) and total (they
never raise: a field that does not parse becomes a stated problem of that one object). The rule, the
status strings and the writes then work on these frozen records, never on raw dictionaries.
Trainer- and Kueue-shaped objects have their views in ``_trainer`` and ``_kueue``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._names import (
    DOMAIN,
    JOBSET_NAME_LABEL,
    LABEL_ADMISSION,
    LABEL_JOB_ID,
    LABEL_SUBMISSION,
    OUT_OF_SERVICE_TAINT,
)

Obj = Mapping[str, Any]

MAX_DIGITS = 18
"""A stored count has at most 18 digits: far above any real A, and always inside a signed 64-bit int."""
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
PROOF_KUBELET = "kubelet-confirmed"
"""Terminal phase and every container terminated, as its kubelet reports."""
PROOF_NODE_DELETED = "node-deleted"
PROOF_OUT_OF_SERVICE = "out-of-service"
"""The Node carries ``node.kubernetes.io/out-of-service``: an operator confirmed it is shut down."""
PROOF_NOT_SCHEDULED = "not-scheduled"
"""Deleted before it was ever bound to a Node: no process was started."""
PROOF_UNPROVEN = "unproven"
PROVEN = frozenset({PROOF_KUBELET, PROOF_NODE_DELETED, PROOF_OUT_OF_SERVICE, PROOF_NOT_SCHEDULED})
POD_FINALIZER = f"{DOMAIN}/execution"
"""dispatch's finalizer on every pod of a dispatch object: the pod stays visible (even after a force
delete) until dispatch has proven its process gone."""


def parse_count(value: object) -> int | None:
    """A non-negative count written as ASCII digits (at most ``MAX_DIGITS``); anything else is None."""
    if isinstance(value, str) and 0 < len(value) <= MAX_DIGITS and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**MAX_DIGITS:
        return value
    return None


def mapping(value: object) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one (a malformed field reads as absent)."""
    return value if isinstance(value, Mapping) else {}


def items(value: object) -> list[Mapping[str, Any]]:
    """The mappings of a list field (anything else in it is ignored)."""
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def text(value: object) -> str:
    return value if isinstance(value, str) else ""


def meta(obj: Obj) -> Mapping[str, Any]:
    return mapping(obj.get("metadata"))


def strings(value: object) -> dict[str, str]:
    """A string map (labels, annotations); entries that are not strings are dropped."""
    return {k: v for k, v in mapping(value).items() if isinstance(k, str) and isinstance(v, str)}


def labels_of(obj: Obj) -> dict[str, str]:
    return strings(meta(obj).get("labels"))


def annotations_of(obj: Obj) -> dict[str, str]:
    return strings(meta(obj).get("annotations"))


def name_of(obj: Obj) -> str:
    return text(meta(obj).get("name"))


def conditions(obj: Obj) -> dict[str, Mapping[str, Any]]:
    """Status conditions by type (the last of a type wins)."""
    return {text(c.get("type")): c for c in items(mapping(obj.get("status")).get("conditions"))}


def condition_true(obj: Obj, ctype: str) -> bool:
    return text(conditions(obj).get(ctype, {}).get("status")) == "True"


def is_suspended(obj: Obj) -> bool:
    return mapping(obj.get("spec")).get("suspend") is True


def is_deleting(obj: Obj) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


@dataclass(frozen=True)
class Ref:
    """Name, namespace, uid and resourceVersion: what a conditioned write needs of an object."""

    name: str
    namespace: str
    uid: str
    resource_version: str
    generation: int | None

    @staticmethod
    def of(obj: Obj) -> Ref:
        m = meta(obj)
        return Ref(text(m.get("name")), text(m.get("namespace")), text(m.get("uid")),
                   text(m.get("resourceVersion")), parse_count(m.get("generation")))


# --------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class NodeView:
    """What dispatch knows of one Node: whether it exists, could be read, its Ready state, its taint."""

    name: str
    exists: bool = True
    readable: bool = True
    ready: str | None = None
    out_of_service: bool = False

    @staticmethod
    def from_obj(obj: Obj) -> NodeView:
        ready_cond = conditions(obj).get("Ready")
        ready = text(ready_cond.get("status")) or "Unknown" if ready_cond is not None else None
        oos = any(text(t.get("key")) == OUT_OF_SERVICE_TAINT for t in items(mapping(obj.get("spec")).get("taints")))
        return NodeView(name_of(obj), ready=ready, out_of_service=oos)

    @staticmethod
    def gone(name: str) -> NodeView:
        return NodeView(name, exists=False)

    @staticmethod
    def unreadable(name: str) -> NodeView:
        return NodeView(name, readable=False)

    def state_text(self) -> str:
        """``Ready=True|Ready=False|Ready=Unknown|gone|not readable`` plus ``, out-of-service``."""
        if not self.readable:
            return "not readable"
        if not self.exists:
            return "gone"
        out = f"Ready={self.ready or 'Unknown'}"
        if self.out_of_service:
            out += ", out-of-service"
        return out

    @property
    def proven_down(self) -> bool:
        """The node's processes are proven stopped: the Node is deleted or tainted out-of-service."""
        return self.readable and (not self.exists or self.out_of_service)


# --------------------------------------------------------------------------- pods


@dataclass(frozen=True)
class PodView:
    """The fields of a pod the rule depends on."""

    name: str
    uid: str
    node: str | None
    phase: str
    deleting: bool
    admission: int | None
    deletion_timestamp: str | None = None
    job_id: str = ""
    submission: str = ""
    jobset_name: str = ""
    namespace: str = ""
    finalizers: tuple[str, ...] = ()
    resource_version: str = ""
    containers_terminated: bool = False
    """Every container of the pod has a status, and each is in a terminated state (what a kubelet reports
    once it has stopped them). PodGC, Kueue's failure recovery and anyone else who writes a Failed phase
    onto a pod of an unreachable node leave the container states as they were."""
    deletion_grace: int | None = None
    """``deletionGracePeriodSeconds``: 0 once the pod was force-deleted (or PodGC or its kubelet deleted it
    for good); then only a finalizer keeps it in the API."""

    @staticmethod
    def from_obj(obj: Obj) -> PodView:
        m = meta(obj)
        labels = labels_of(obj)
        deletion = text(m.get("deletionTimestamp")) or None
        status = mapping(obj.get("status"))
        spec = mapping(obj.get("spec"))
        names = {text(c.get("name")) for c in items(spec.get("containers"))}
        states = {text(c.get("name")): mapping(c.get("state")) for c in items(status.get("containerStatuses"))}
        terminated = bool(names) and all(
            name in states and "terminated" in states[name] and "running" not in states[name]
            and "waiting" not in states[name] for name in names)
        return PodView(
            name=text(m.get("name")),
            uid=text(m.get("uid")) or text(m.get("name")),
            node=text(mapping(obj.get("spec")).get("nodeName")) or None,
            phase=text(mapping(obj.get("status")).get("phase")) or "Pending",
            deleting=deletion is not None,
            admission=parse_count(labels.get(LABEL_ADMISSION)),
            deletion_timestamp=deletion,
            job_id=labels.get(LABEL_JOB_ID, ""),
            submission=labels.get(LABEL_SUBMISSION, ""),
            jobset_name=labels.get(JOBSET_NAME_LABEL, ""),
            namespace=text(m.get("namespace")),
            finalizers=tuple(f for f in (m.get("finalizers") or []) if isinstance(f, str))
            if isinstance(m.get("finalizers"), list) else (),
            resource_version=text(m.get("resourceVersion")),
            containers_terminated=terminated,
            deletion_grace=parse_count(m.get("deletionGracePeriodSeconds")),
        )

    @property
    def kubelet_confirmed(self) -> bool:
        """The pod's end as its kubelet reports it: a terminal phase (Succeeded or Failed) and every
        container's state ``terminated``. A terminal phase alone proves nothing: PodGC and Kueue write
        Failed onto pods of unreachable nodes whose containers may still run."""
        return self.phase in TERMINAL_PHASES and self.containers_terminated

    @property
    def may_run(self) -> bool:
        """Any pod whose end its kubelet has not confirmed may have a running container."""
        return not self.kubelet_confirmed

    @property
    def ours(self) -> bool:
        """Carries dispatch's finalizer (so it stays in the API until dispatch releases it)."""
        return POD_FINALIZER in self.finalizers

    def end(self, node: NodeView | None) -> str:
        """How this pod's end is proven (a ``PROOF_*`` value), given what is known of its Node."""
        if self.kubelet_confirmed:
            return PROOF_KUBELET
        if self.node is None:
            # Never bound: no kubelet ever started it. Once deleting, the scheduler never binds it.
            return PROOF_NOT_SCHEDULED if self.deleting else PROOF_UNPROVEN
        if node is None or not node.readable:
            return PROOF_UNPROVEN
        if not node.exists:
            return PROOF_NODE_DELETED
        if node.out_of_service:
            return PROOF_OUT_OF_SERVICE
        return PROOF_UNPROVEN

    def selected(self, *, name: str, job_id: str, submission: str) -> bool:
        """The two independent selections of the rule: dispatch's labels, or JobSet's jobset-name."""
        by_dispatch = bool(job_id) and self.job_id == job_id and self.submission == submission
        return by_dispatch or self.jobset_name == name


# --------------------------------------------------------------------------- JobSet and Jobs


@dataclass(frozen=True)
class JobSetView:
    """A JobSet as the rule reads it: has its suspension taken effect?"""

    name: str
    suspended: bool
    deleting: bool
    finished: bool

    @staticmethod
    def from_obj(obj: Obj) -> JobSetView:
        return JobSetView(name_of(obj), is_suspended(obj), is_deleting(obj),
                          condition_true(obj, "Completed") or condition_true(obj, "Failed"))


@dataclass(frozen=True)
class JobView:
    """A child Job as the rule reads it: could it still start pods?"""

    name: str
    jobset_name: str
    suspended: bool
    suspended_confirmed: bool
    finished: bool
    started: bool
    replacement_policy: str = ""
    """``spec.podReplacementPolicy`` (the API defaults it to TerminatingOrFailed without a podFailurePolicy)."""

    @staticmethod
    def from_obj(obj: Obj) -> JobView:
        status = mapping(obj.get("status"))
        started = bool(status.get("startTime")) or (parse_count(status.get("active")) or 0) > 0 or (
            parse_count(status.get("ready")) or 0) > 0
        return JobView(
            name_of(obj), labels_of(obj).get(JOBSET_NAME_LABEL, ""), is_suspended(obj),
            condition_true(obj, "Suspended"),
            condition_true(obj, "Complete") or condition_true(obj, "Failed"), started,
            text(mapping(obj.get("spec")).get("podReplacementPolicy")),
        )
