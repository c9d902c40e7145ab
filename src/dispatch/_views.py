"""Views of cluster objects, parsed once where they are read.

Everything dispatch reads from the cluster passes through these parsers, which are strict (numbers
are ASCII digits of bounded length, never ``int()`` of whatever a third party wrote) and total (they
never raise: a field that does not parse becomes a stated problem of that one object). The rule, the
status strings and the writes then work on these frozen records, never on raw dictionaries.
Trainer- and Kueue-shaped objects have their views in ``_trainer`` and ``_kueue``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ._names import (
    ANNOTATION_MARK_SEEN,
    COMPLETION_INDEX_LABEL,
    DOMAIN,
    JOB_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    LABEL_ADMISSION,
    LABEL_JOB_ID,
    LABEL_SUBMISSION,
    OUT_OF_SERVICE_TAINT,
    REPLICATED_JOB_LABEL,
)

MAX_DIGITS = 18
"""A stored count has at most 18 digits: far above any real A, and always inside a signed 64-bit int."""
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
PROOF_KUBELET = "kubelet-confirmed"
"""A terminal phase its kubelet wrote with no container running, or every container ended for good
(see ``PodView.kubelet_confirmed``)."""
PROOF_NODE_DELETED = "node-deleted"
PROOF_OUT_OF_SERVICE = "out-of-service"
"""The Node carries ``node.kubernetes.io/out-of-service`` and no longer reports Ready=True: an operator
confirmed it is shut down, and its kubelet agrees by its silence."""
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


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(obj.get("metadata"))


def strings(value: object) -> dict[str, str]:
    """A string map (labels, annotations); entries that are not strings are dropped."""
    return {k: v for k, v in mapping(value).items() if isinstance(k, str) and isinstance(v, str)}


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return strings(meta(obj).get("labels"))


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return strings(meta(obj).get("annotations"))


def name_of(obj: Mapping[str, Any]) -> str:
    return text(meta(obj).get("name"))


def instant(value: object) -> float | None:
    """A time as the API server serves one (RFC 3339, ``2026-12-02T08:10:25Z``) in seconds since the epoch;
    None for anything else (missing, malformed, without a zone, absurdly long)."""
    if not isinstance(value, str) or not 0 < len(value) <= 40:
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        return None
    return t.timestamp() if t.tzinfo is not None else None


def latest(*times: float | None) -> float | None:
    """The latest of the known ``times`` (None if none is known)."""
    known = [t for t in times if t is not None]
    return max(known) if known else None


def conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Status conditions by type (the last of a type wins)."""
    return {text(c.get("type")): c for c in items(mapping(obj.get("status")).get("conditions"))}


def condition_true(obj: Mapping[str, Any], ctype: str) -> bool:
    return text(conditions(obj).get(ctype, {}).get("status")) == "True"


def is_suspended(obj: Mapping[str, Any]) -> bool:
    return mapping(obj.get("spec")).get("suspend") is True


def is_deleting(obj: Mapping[str, Any]) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


@dataclass(frozen=True, slots=True)
class Ref:
    """Name, namespace, uid and resourceVersion: what a conditioned write needs of an object. Slotted: the
    controller keeps one per Workload (10,000 and more)."""

    name: str
    namespace: str
    uid: str
    resource_version: str
    generation: int | None

    @staticmethod
    def of(obj: Mapping[str, Any]) -> Ref:
        m = meta(obj)
        return Ref(text(m.get("name")), sys.intern(text(m.get("namespace"))), text(m.get("uid")),
                   text(m.get("resourceVersion")), parse_count(m.get("generation")))


# --------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class NodeView:
    """What dispatch knows of one Node: whether it exists, could be read, its Ready state, its taint."""

    name: str
    exists: bool = True
    readable: bool = True
    ready: str | None = None
    """Its Ready condition's status; for a deleted Node, as last seen before the deletion (None: not known)."""
    out_of_service: bool = False
    ready_since: float | None = field(default=None, compare=False)
    """When its Ready condition last changed (its kubelet's clock): for a Ready node, when it came back."""
    uid: str = ""
    created: float | None = field(default=None, compare=False)
    """Its ``creationTimestamp`` (the API server's clock): a Node created after a pod is not the Node that
    pod was bound to, but one registered again under its name (maybe by another machine)."""

    @staticmethod
    def from_obj(obj: Mapping[str, Any]) -> NodeView:
        ready_cond = conditions(obj).get("Ready")
        ready = text(ready_cond.get("status")) or "Unknown" if ready_cond is not None else None
        oos = any(text(t.get("key")) == OUT_OF_SERVICE_TAINT for t in items(mapping(obj.get("spec")).get("taints")))
        since = instant(ready_cond.get("lastTransitionTime")) if ready_cond is not None else None
        return NodeView(name_of(obj), ready=ready, out_of_service=oos, ready_since=since,
                        uid=text(meta(obj).get("uid")), created=instant(meta(obj).get("creationTimestamp")))

    @staticmethod
    def gone(name: str) -> NodeView:
        """A Node that is not found, and nothing known of its last state (what a plain read can tell)."""
        return NodeView(name, exists=False)

    @staticmethod
    def deleted(obj: Mapping[str, Any]) -> NodeView:
        """A deleted Node as it was last seen (a watch's DELETED event carries its last state): its Ready
        status then, its taint, its uid and creation."""
        last = NodeView.from_obj(obj)
        return NodeView(last.name, exists=False, ready=last.ready, out_of_service=last.out_of_service,
                        ready_since=last.ready_since, uid=last.uid, created=last.created)

    def made_after(self, created: float | None) -> bool:
        """This Node object was created after ``created`` (a pod's creation): it is not the Node that pod
        was bound to."""
        return self.created is not None and created is not None and self.created > created

    @staticmethod
    def unreadable(name: str) -> NodeView:
        return NodeView(name, readable=False)

    def state_text(self) -> str:
        """``Ready=True|Ready=False|Ready=Unknown|gone|not readable`` plus ``, out-of-service``."""
        if not self.readable:
            return "not readable"
        if not self.exists:
            return "gone"  # what it was last seen as is said by ``PodView.unproven_why``
        out = f"Ready={self.ready or 'Unknown'}"
        if self.out_of_service:
            out += ", out-of-service"
        return out

    @property
    def proven_down(self) -> bool:
        """The node's processes are proven stopped: tainted out-of-service while its kubelet no longer
        reports Ready=True (Kubernetes' own PodGC asks the same before it deletes the pods of an
        out-of-service node: a kubelet that still reports Ready is running, whatever the taint says), or
        deleted while it was last seen so (tainted and not Ready), or last seen ``Ready=Unknown``: its
        kubelet silent past the node controller's grace period, and the deletion the operator's word that
        the machine is gone. A deletion alone proves nothing: a live kubelet whose Node is deleted keeps
        running its containers and does not register again (seen on a real kubelet v1.37), and a deleted
        Node whose last state is not known (a plain read finds only that it is gone) proves nothing either."""
        if not self.readable:
            return False
        if self.out_of_service and self.ready is not None and self.ready != "True":
            return True
        if self.exists:
            return self.out_of_service and self.ready != "True"
        return self.ready == "Unknown"


# --------------------------------------------------------------------------- pods


FOREIGN_TERMINAL_MARKS: Mapping[tuple[str, str], str] = {
    ("DisruptionTarget", "DeletionByPodGC"): "PodGC",
    ("KueueFailureRecovery", ""): "Kueue's failure recovery",
    ("TerminatedByKueue", ""): "Kueue",
}
"""Conditions that the known writers of a terminal phase other than the kubelet add with it (condition
type, reason; an empty reason matches any). PodGC's out-of-service and unscheduled paths add none, but
those pods are proven by their Node (or have none)."""
REJECTED_PREFIX = "Pod was rejected: "
"""How the kubelet's admission rejection (``rejectPod``) begins its message: the pod never ran there."""
TERMINATED_BY_KUBELET = "The container could not be located when the pod was terminated"
"""The message of the kubelet's last step for a terminal pod (``TerminatePod``), written only once it
has torn the pod down: that container will never run again."""
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
"""What a kubelet puts on the API's copy (mirror) of a static pod it runs from a file on its node. It runs the
static pod whatever the API says, and never runs a pod that arrives from the API with this annotation (it
deletes such a mirror when it has no static pod of that name)."""
KUBELET_CONDITIONS = frozenset({"PodReadyToStartContainers", "Initialized", "ContainersReady"})
"""Pod conditions only the kubelet sets: a change of one is a report of the kubelet's. Not ``Ready`` (the
node lifecycle controller's ``MarkPodsNotReady`` writes it too) nor ``PodScheduled`` (the scheduler's)."""
FOREIGN_UNMARKED = "PodGC or another writer (its sandbox still reported ready)"
"""Who wrote a terminal phase that carries no writer's condition while the pod's sandbox is still reported
ready (``PodReadyToStartContainers=True``): not its kubelet, which writes a terminal phase only once it has
stopped the pod, sandbox included (every recorded kubelet ending reports it False). PodGC's out-of-service
path (``markFailedAndDeletePod``) writes Failed with no condition over the kubelet's last running report."""


def _unmarked_foreign(status: Mapping[str, Any]) -> bool:
    """A terminal phase beside a sandbox still reported ready: written by someone other than the kubelet."""
    return text(status.get("phase")) in TERMINAL_PHASES and any(
        text(c.get("type")) == "PodReadyToStartContainers" and text(c.get("status")) == "True"
        for c in items(status.get("conditions")))


def kubelet_fingerprint(status: Mapping[str, Any]) -> str:
    """A digest of what only the pod's kubelet writes into ``status``: every container status (regular,
    init, ephemeral), the conditions of ``KUBELET_CONDITIONS`` and ``observedGeneration``. Another writer
    of a terminal phase (PodGC, Kueue) leaves these as they were, so a change of the digest between two
    resourceVersions of one pod is a write of its kubelet's between them (``MarkSeen``)."""
    owned = {
        "containers": status.get("containerStatuses"),
        "init": status.get("initContainerStatuses"),
        "ephemeral": status.get("ephemeralContainerStatuses"),
        "conditions": sorted((c for c in items(status.get("conditions")) if text(c.get("type")) in KUBELET_CONDITIONS),
                             key=lambda c: text(c.get("type"))),
        "observedGeneration": status.get("observedGeneration"),
    }
    blob = json.dumps(owned, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class MarkSeen:
    """dispatch's record on a pod someone other than its kubelet marked terminal (``ANNOTATION_MARK_SEEN``):
    the pod's resourceVersion when dispatch first read it with the mark (the record's write is conditioned
    on it) and the ``kubelet_fingerprint`` at that version. Resource versions of one resource type are
    ordered integers (Kubernetes 1.35+, KEP-5504), so "written after the mark" is a question the API
    server answers, not a comparison of the node's clock with the control plane's."""

    resource_version: int
    fingerprint: str

    @staticmethod
    def parse(value: str | None) -> MarkSeen | None:
        """The record, or None when absent or malformed (a malformed record is no record)."""
        rv, _, fp = (value or "").partition("/")
        number = parse_count(rv)
        if number is None or len(fp) != 32 or not all(ch in "0123456789abcdef" for ch in fp):
            return None
        return MarkSeen(number, fp)

    def text(self) -> str:
        return f"{self.resource_version}/{self.fingerprint}"


RESTART = "Restart"
RESTART_ALL = "RestartAllContainers"
"""The actions of a container's ``restartPolicyRules`` (ContainerRestartRules, beta and on since 1.35;
RestartAllContainersOnContainerExits, 1.36): restart this container, or every container of the pod (its
init containers again too), inside the same pod object, whatever the pod's ``restartPolicy``."""


@dataclass(frozen=True)
class RestartRule:
    """One entry of a container's ``restartPolicyRules``: ``action`` on an exit code ``operator`` (In,
    NotIn) ``values``. An operator or action this version does not know, or a rule without exit codes,
    is read as one that may match and restart (a newer kubelet may know it)."""

    action: str
    operator: str
    values: frozenset[int]

    @staticmethod
    def parse(obj: Mapping[str, Any]) -> RestartRule:
        codes = obj.get("exitCodes")
        if not isinstance(codes, Mapping):
            return RestartRule(text(obj.get("action")), "", frozenset())
        values = frozenset(v for v in (codes.get("values") or []) if isinstance(v, int) and not isinstance(v, bool))
        return RestartRule(text(obj.get("action")), text(codes.get("operator")), values)

    def may_match(self, exit_code: int | None) -> bool:
        """Whether this rule may apply to an exit with ``exit_code`` (None: not known)."""
        if exit_code is None or self.operator not in ("In", "NotIn"):
            return True
        return (exit_code in self.values) == (self.operator == "In")


def restart_after(pod_policy: str, own_policy: str, rules: tuple[RestartRule, ...], exit_code: int | None) -> str:
    """What a kubelet may do after a container exits with ``exit_code``: ``""`` (nothing, it stays ended),
    ``RESTART`` or ``RESTART_ALL``. The kubelet's order (``ContainerShouldRestart``, 1.35 to 1.38): the
    container's rules first (the first that matches acts), then its own ``restartPolicy``, then the pod's.
    Where the kubelet's reading is not certain (an unknown operator, action or policy, an exit code not
    reported, rules without the container's policy, which the API refuses) the answer is that it may
    restart: a proof of an end may wait, never be false."""
    for rule in rules:
        if rule.may_match(exit_code):
            return RESTART_ALL if rule.action == RESTART_ALL else RESTART
    policy = own_policy or pod_policy
    if policy == "Never":
        return ""
    if policy == "OnFailure":
        return "" if exit_code == 0 else RESTART
    return RESTART


@dataclass(frozen=True)
class ContainerView:
    """One container's last reported state: ``running``, ``waiting``, ``terminated`` or ``""`` (no status),
    and the container's own restart policy and rules from the pod's spec."""

    name: str
    state: str
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    reported_at: float | None = field(default=None, compare=False)
    """The latest time its kubelet wrote in this state (``startedAt``, ``finishedAt``)."""
    own_policy: str = ""
    """The container's own ``restartPolicy`` (``""``: not set, the pod's applies)."""
    rules: tuple[RestartRule, ...] = ()
    """The container's ``restartPolicyRules``, in order."""

    @staticmethod
    def parse(name: str, status: Mapping[str, Any] | None, spec: Mapping[str, Any] | None = None) -> ContainerView:
        view = ContainerView._parse_status(name, status)
        if spec is None:
            return view
        rules = tuple(RestartRule.parse(r) for r in items(spec.get("restartPolicyRules")))
        own = text(spec.get("restartPolicy"))[:32]
        return dataclasses.replace(view, own_policy=own, rules=rules) if own or rules else view

    @staticmethod
    def _parse_status(name: str, status: Mapping[str, Any] | None) -> ContainerView:
        if status is None:
            return ContainerView(name, "")
        state = mapping(status.get("state"))
        if "running" in state:
            return ContainerView(name, "running", reported_at=instant(mapping(state.get("running")).get("startedAt")))
        if "waiting" in state:
            return ContainerView(name, "waiting", reason=text(mapping(state.get("waiting")).get("reason"))[:128])
        if "terminated" in state:
            t = mapping(state.get("terminated"))
            code = t.get("exitCode")
            exit_code = code if isinstance(code, int) and not isinstance(code, bool) and -2**31 <= code < 2**31 \
                else None
            return ContainerView(name, "terminated", exit_code, text(t.get("reason"))[:128],
                                 text(t.get("message"))[:256],
                                 reported_at=latest(instant(t.get("startedAt")), instant(t.get("finishedAt"))))
        return ContainerView(name, "")

    def final(self, restart_policy: str) -> bool:
        """This container can never run again, whoever wrote the pod's phase: terminated, and neither its
        rules, its own restart policy nor the pod's (``restart_policy``) would start it again
        (``restart_after``), or terminated by the kubelet's last step for a terminal pod."""
        if self.state != "terminated":
            return False
        if self.message == TERMINATED_BY_KUBELET:
            return True
        return not restart_after(restart_policy, self.own_policy, self.rules, self.exit_code)

    def restarts_all(self, restart_policy: str) -> bool:
        """It ended with an exit on which a ``RestartAllContainers`` rule may act: every container of the
        pod, ended or not, may run again."""
        return (self.state == "terminated" and self.message != TERMINATED_BY_KUBELET
                and restart_after(restart_policy, self.own_policy, self.rules, self.exit_code) == RESTART_ALL)

    @property
    def restart_text(self) -> str:
        """Its own restart policy and rules as a reader would write them (``""``: none)."""
        parts = [f"restartPolicy {self.own_policy}"] if self.own_policy else []
        parts += [f"{r.action or '?'} on exit codes {r.operator or '?'} "
                  f"{sorted(r.values) if r.values else '[]'}" for r in self.rules]
        return ", ".join(parts)


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
    containers: tuple[ContainerView, ...] = ()
    """``spec.containers`` in order, each with its last reported state (``""`` when it has no status)."""
    init_containers: tuple[ContainerView, ...] = ()
    """``spec.initContainers`` that are not sidecars, with their states."""
    sidecars: tuple[ContainerView, ...] = ()
    """Restartable init containers (``restartPolicy: Always``): they run beside the containers and a
    kubelet restarts them whatever the pod's policy."""
    restart_policy: str = "Always"
    """``spec.restartPolicy`` (the API server defaults it to Always; Job pods have Never or OnFailure, and
    JobSet defaults its templates to OnFailure)."""
    reason: str = ""
    message: str = ""
    foreign_mark: str = ""
    """Who other than the kubelet marked this pod terminal, from the condition it added (``""``: none)."""
    deletion_grace: int | None = None
    """``deletionGracePeriodSeconds``: 0 once the pod was force-deleted (or PodGC or its kubelet deleted it
    for good); then only a finalizer keeps it in the API."""
    ephemeral: tuple[ContainerView, ...] = ()
    """``spec.ephemeralContainers`` (``kubectl debug``) with their states: a process of the pod too, which
    no restart policy governs and the kubelet's last step never rewrites."""
    kubelet_fingerprint: str = field(default="", compare=False)
    """``kubelet_fingerprint`` of its status as read, for a pod with a ``foreign_mark`` (else ``""``: the
    digest costs a third of a parse, and only a foreign mark's record reads it)."""
    mark_seen: MarkSeen | None = None
    """dispatch's record of when it first saw ``foreign_mark`` (``ANNOTATION_MARK_SEEN``), if any."""
    rank: tuple[str, str, str] | None = None
    """(replicatedJob, job index, completion index) from JobSet's and the Job controller's labels: the one
    process of an execution this pod runs, which a replacement pod runs again; None when any is missing."""
    unindexed: str = ""
    """``replicatedJob R, job J`` for a pod JobSet made whose Job gave it no completion index (a NonIndexed
    Job): the guard cannot tell a second pod of such a Job from a replacement of one that may still run."""
    created: float | None = field(default=None, compare=False)
    """Its ``creationTimestamp`` (the API server's clock), to tell its Node from one registered again later."""
    mirror: bool = False
    """A static pod's mirror (``MIRROR_ANNOTATION``): its kubelet runs the static pod from a file on the node,
    and this object only shows it; refusing the mirror's create would hide that process, not stop it."""

    @staticmethod
    def from_obj(obj: Mapping[str, Any]) -> PodView:
        m = meta(obj)
        labels = labels_of(obj)
        deletion = text(m.get("deletionTimestamp")) or None
        status = mapping(obj.get("status"))
        spec = mapping(obj.get("spec"))

        def statuses(key: str) -> dict[str, Mapping[str, Any]]:
            return {text(c.get("name")): c for c in items(status.get(key))}

        regular = statuses("containerStatuses")
        init = statuses("initContainerStatuses")
        containers = tuple(ContainerView.parse(text(c.get("name")), regular.get(text(c.get("name"))), c)
                           for c in items(spec.get("containers")))
        inits: list[ContainerView] = []
        sidecars: list[ContainerView] = []
        for c in items(spec.get("initContainers")):
            view = ContainerView.parse(text(c.get("name")), init.get(text(c.get("name"))), c)
            (sidecars if text(c.get("restartPolicy")) == "Always" else inits).append(view)
        ephemeral = statuses("ephemeralContainerStatuses")
        debug = tuple(ContainerView.parse(text(c.get("name")), ephemeral.get(text(c.get("name"))))
                      for c in items(spec.get("ephemeralContainers")))
        policy = text(spec.get("restartPolicy"))
        mark = ""
        rank = (labels.get(REPLICATED_JOB_LABEL, ""), labels.get(JOB_INDEX_LABEL, ""),
                labels.get(COMPLETION_INDEX_LABEL) or annotations_of(obj).get(COMPLETION_INDEX_LABEL, ""))
        for cond in items(status.get("conditions")):
            if text(cond.get("status")) != "True":
                continue
            ctype, creason = text(cond.get("type")), text(cond.get("reason"))
            found = FOREIGN_TERMINAL_MARKS.get((ctype, creason)) or FOREIGN_TERMINAL_MARKS.get((ctype, ""))
            if found:
                mark = found
        if not mark and _unmarked_foreign(status):
            mark = FOREIGN_UNMARKED
        return PodView(
            name=text(m.get("name")),
            uid=text(m.get("uid")) or text(m.get("name")),
            node=text(spec.get("nodeName")) or None,
            phase=text(status.get("phase")) or "Pending",
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
            containers=containers,
            init_containers=tuple(inits),
            sidecars=tuple(sidecars),
            restart_policy=policy if policy in ("Always", "OnFailure", "Never") else "Always",
            reason=text(status.get("reason"))[:128],
            message=text(status.get("message"))[:512],
            foreign_mark=mark,
            deletion_grace=parse_count(m.get("deletionGracePeriodSeconds")),
            ephemeral=debug,
            kubelet_fingerprint=kubelet_fingerprint(status) if mark else "",  # read only for a foreign mark
            mark_seen=MarkSeen.parse(annotations_of(obj).get(ANNOTATION_MARK_SEEN)),
            rank=rank if all(rank) else None,
            unindexed=f"replicatedJob {rank[0]}, job {rank[1]}" if rank[0] and rank[1] and not rank[2] else "",
            created=instant(m.get("creationTimestamp")),
            mirror=MIRROR_ANNOTATION in annotations_of(obj),
        )

    @property
    def processes(self) -> tuple[ContainerView, ...]:
        """Every container of the pod that runs a process: regular, init, sidecar and ephemeral."""
        return (*self.containers, *self.init_containers, *self.sidecars, *self.ephemeral)

    @property
    def running(self) -> tuple[str, ...]:
        """The names of its containers of any kind reported running: a pod with one is not ended."""
        return tuple(c.name for c in self.processes if c.state == "running")

    @property
    def kubelet_wrote_since_mark(self) -> bool:
        """Its kubelet wrote the pod's status after dispatch first saw ``foreign_mark``: a later resourceVersion
        (an integer, KEP-5504) whose kubelet-owned fields differ from the record's (``MarkSeen``)."""
        now = parse_count(self.resource_version)
        seen = self.mark_seen
        return (bool(self.foreign_mark) and seen is not None and now is not None and now > seen.resource_version
                and self.kubelet_fingerprint != seen.fingerprint)

    @property
    def deleted_at(self) -> float | None:
        """Its ``deletionTimestamp`` (the API server's clock): never earlier than the first delete request (a
        later, shorter delete moves it back at most to that request's time, or to its own), so a Node created
        after it was registered after the pod was deleted (``kubelet_started_after_deletion``). Read on demand:
        few pods are asked, and a field would cost every pod held."""
        return instant(self.deletion_timestamp)

    def kubelet_started_after_deletion(self, node: NodeView | None) -> bool:
        """Its Node (``node``, as read now) was registered after the pod was deleted: both times are the API
        server's. A kubelet registers its Node only when it starts (a live one whose Node is deleted does not
        register again: seen on a real kubelet v1.37), and a kubelet that starts with the pod already deleting
        tears it down and never starts a container of it (its pod worker's first view has the deletion): it
        has no earlier view of the pod to act on, unlike a kubelet back from a cut (``kubelet_wrote_since_mark``
        guards that one). Whether that Node is the machine that ran the pod is the operator's word
        (``release-pod --process-gone``), never this."""
        return (node is not None and node.readable and node.exists and node.created is not None
                and self.deleted_at is not None and node.created > self.deleted_at)

    @property
    def needs_mark_record(self) -> bool:
        """A pod of ours marked terminal by someone other than its kubelet, not proven ended, without a record
        of when dispatch first saw the mark (or with one naming a resourceVersion above the pod's own, which
        was not written on this pod as it is): ``MarkSeen`` is due, so a later kubelet write can be told."""
        if not self.ours or not self.foreign_mark or self.phase not in TERMINAL_PHASES or self.kubelet_confirmed:
            return False
        now = parse_count(self.resource_version)
        return self.mark_seen is None or (now is not None and self.mark_seen.resource_version > now)

    @property
    def containers_terminated(self) -> bool:
        """Every container has a status, and each is terminated (what a kubelet reports once it stopped them)."""
        return bool(self.containers) and all(c.state == "terminated" for c in self.containers)

    @property
    def rejected(self) -> bool:
        """Its kubelet refused it at admission (OutOfcpu, NodeAffinity, UnexpectedAdmissionError, ...):
        Failed, "Pod was rejected: ...", and no container status at all. It never reached the kubelet's
        pod workers, so nothing finishes it until it is deleted (then its kubelet writes every container
        terminated) or its kubelet restarts."""
        return (self.phase == "Failed" and self.message.startswith(REJECTED_PREFIX)
                and all(c.state == "" for c in self.processes))

    @property
    def needs_delete(self) -> bool:
        """Ended by its kubelet (Failed) without a status for every container, as a rejection leaves it, and
        not yet deleted: only a delete makes its kubelet finish it and write every container's end."""
        return (self.phase == "Failed" and not self.deleting
                and any(c.state == "" for c in self.containers)
                and not self.running)

    @property
    def kubelet_confirmed(self) -> bool:
        """The pod's end as its kubelet reports it.

        A terminal phase the kubelet wrote itself is final: it writes one only once no container of the
        pod runs, and it never starts a container of a terminal pod. So any state but ``running`` is then
        an end (a container that never started, one left ``waiting: PodInitializing`` because the pod
        ended during its init containers, or a short window before its last step rewrites the states),
        provided every container has a status (a rejected pod has none, and a rejection may race a
        container it adopted after a restart). A terminal phase written by someone else (PodGC, Kueue's
        failure recovery: their conditions say so) proves only what the containers prove by themselves:
        each terminated and never to run again under the pod's restart policy (under OnFailure, JobSet's
        default, a container that exited non-zero may be restarted by a partitioned kubelet)."""
        if self.phase not in TERMINAL_PHASES or not self.containers:
            return False
        if self.running:  # a sidecar, an init container or an ephemeral (``kubectl debug``) one too
            return False
        if self.foreign_mark:
            return (not self.sidecars and all(c.final(self.restart_policy) for c in self.containers)
                    and not any(c.restarts_all(self.restart_policy) for c in self.init_containers))
        return all(c.state != "" for c in self.containers)

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
        if node is None or not node.readable or node.made_after(self.created):
            return PROOF_UNPROVEN  # a Node registered under its name after it: not what it ran on
        if node.proven_down:
            return PROOF_OUT_OF_SERVICE if node.exists or node.out_of_service else PROOF_NODE_DELETED
        return PROOF_UNPROVEN

    def unproven_why(self, node: NodeView | None) -> str:
        """Why this pod's end is not proven yet, and what ends the wait (``""`` when it is proven or
        simply still running)."""
        if self.end(node) != PROOF_UNPROVEN:
            return ""
        where = self.node or "its node"
        if self.rejected or self.needs_delete:
            what = (f"its kubelet rejected it ({self.reason or 'no reason'}) and it never ran" if self.rejected
                    else f"{self.phase} with no status for every container")
            if self.ours:
                return (f"{what}; dispatch's controller deletes it so that its kubelet confirms the end (or "
                        f"`kubectl delete pod {self.name}`)")
            return f"{what}; `kubectl delete pod {self.name}` ends the wait (nothing else deletes it)"
        replaced = node is not None and node.readable and node.made_after(self.created)
        deleted = node is not None and node.readable and not node.exists and not replaced
        if (not replaced and node is not None and node.readable and node.exists and node.out_of_service
                and node.ready == "True"):
            return (f"{where} is tainted out-of-service but its kubelet still reports Ready=True, so the taint "
                    "proves nothing; shut the node down (it then stops reporting) or remove the taint")
        if self.phase in TERMINAL_PHASES and self.running and not self.foreign_mark:
            return (f"{self.phase} but container {', '.join(self.running)} is reported running (a sidecar or a "
                    f"`kubectl debug` container runs beside the pod's own); its kubelet reports its end, or "
                    f"once {where} is confirmed down, taint it node.kubernetes.io/out-of-service")
        if self.phase in TERMINAL_PHASES and self.foreign_mark:
            restartable = [c.name + (f" ({c.restart_text})" if c.restart_text else "") for c in
                           [*(c for c in self.containers if not c.final(self.restart_policy)),
                            *(c for c in self.init_containers if c.restarts_all(self.restart_policy))]]
            still = (f"container {', '.join(self.running)} is reported running" if self.running else
                     f"under restartPolicy {self.restart_policy} its kubelet may still start "
                     f"{('container ' + ', '.join(restartable)) if restartable else 'a sidecar'}")
            head = f"marked {self.phase} by {self.foreign_mark}, not its kubelet, and {still}"
            seen = self.mark_seen
            back = node is not None and node.readable and node.exists and node.ready == "True"
            if back and not self.running:
                # its kubelet answers: name the one word `release-pod` takes now (``release_pod_proof``)
                if self.kubelet_wrote_since_mark or self.kubelet_started_after_deletion(node):
                    how = ("its kubelet has written the pod's status since dispatch first saw the mark"
                           if self.kubelet_wrote_since_mark else
                           f"node {where} was registered again after the pod was deleted: if it is the machine "
                           "that ran the pod, its kubelet started since and never starts a container of it")
                    return (f"{head}; {how}: once the process is gone there, "
                            f"`dispatch admin release-pod {self.name} --process-gone` ends the wait")
                if seen is not None:
                    return (f"{head}; its kubelet is back but has not written the pod's status since dispatch "
                            f"first saw the mark (resourceVersion {seen.resource_version}), so --process-gone "
                            "is refused until it does (and --node-confirmed-down while the node reports "
                            f"Ready=True); a kubelet that wrote it before writes nothing more: then shut {where} "
                            f"down and run `dispatch admin release-pod {self.name} --node-confirmed-down`")
            down = ("" if replaced or deleted else "taint it node.kubernetes.io/out-of-service or ")
            out = (f"{head}; "
                   f"once {where} is confirmed down, {down}run "
                   f"`dispatch admin release-pod {self.name} --node-confirmed-down`; once its kubelet is back "
                   f"and the process is gone, run `dispatch admin release-pod {self.name} --process-gone`")
            return out + (f" ({where} was deleted: restart its kubelet and it registers again)" if deleted else "")
        if replaced:
            return (f"node {where} was registered again after the pod was created (a new Node object, maybe "
                    "another machine), so its state says nothing of the machine that ran the pod; if that "
                    "machine is this one (its kubelet restarted), its kubelet ends the pod itself; once that "
                    f"machine is confirmed shut down, run `dispatch admin release-pod {self.name} "
                    "--node-confirmed-down`")
        if deleted:
            last = f" (last seen Ready={node.ready})" if node is not None and node.ready else ""
            return (f"node {where} was deleted{last}, which proves nothing by itself: a kubelet whose Node is "
                    "deleted keeps running its containers and does not register again; dispatch's controller "
                    "takes the deletion as proof only of a Node it saw Ready=Unknown when deleted. Once the "
                    f"machine is confirmed shut down, run `dispatch admin release-pod {self.name} "
                    "--node-confirmed-down`; if the Node was deleted by mistake, restart its kubelet: it "
                    "registers again and ends the pod itself")
        return ""

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
    job_id: str = ""
    submission: str = ""
    """dispatch's identity labels, which dispatch's runtime patch entry puts on the JobSet (so the layers of a
    closed object of the submission are found by the submission, whatever their name)."""
    replicated_jobs: tuple[str, ...] = ()
    """Its replicatedJobs' names, which never change (JobSet's webhook refuses it): what Trainer built it from,
    to compare with the runtime as it is now and with the jobs dispatch's entry targets."""
    owner_uid: str = ""
    """The uid of the TrainJob that controls it (its controller ownerReference; "" if none): a JobSet named
    as a TrainJob but owned by another uid is an earlier TrainJob's, left by a garbage collector that missed
    that owner's deletion (seen on the real control plane after a kube-apiserver restart)."""
    uid: str = ""
    created: float | None = None
    """Its own uid and ``creationTimestamp``: a child Job of its name controlled by another JobSet uid, made
    before it, is an earlier JobSet's that the garbage collector left (``JobView.owner_uid``)."""

    @staticmethod
    def from_obj(obj: Mapping[str, Any]) -> JobSetView:
        labels = labels_of(obj)
        jobs = tuple(text(rj.get("name")) for rj in items(mapping(obj.get("spec")).get("replicatedJobs"))
                     if text(rj.get("name")))
        return JobSetView(name_of(obj), is_suspended(obj), is_deleting(obj),
                          condition_true(obj, "Completed") or condition_true(obj, "Failed"),
                          labels.get(LABEL_JOB_ID, ""), labels.get(LABEL_SUBMISSION, ""), jobs,
                          controller_uid(obj, "TrainJob"), text(meta(obj).get("uid")),
                          instant(meta(obj).get("creationTimestamp")))


@dataclass(frozen=True)
class EventView:
    """A controller's Event about one object, as status reads it: the only place Trainer says why it built no
    JobSet for a TrainJob (v2.3 reports a failed build as a Warning Event ``TrainJobResourcesCreationFailed``
    and nothing in the TrainJob's status)."""

    reason: str
    message: str
    last: float | None
    """When it was last seen (``lastTimestamp``, ``series.lastObservedTime`` or ``eventTime``)."""

    MESSAGE_LIMIT = 1024
    """An Event's message is at most 1 KiB where the API server validates it; anything longer is cut."""

    @staticmethod
    def from_obj(obj: Mapping[str, Any]) -> EventView:
        series = mapping(obj.get("series"))
        last = latest(instant(obj.get("lastTimestamp")), instant(series.get("lastObservedTime")),
                      instant(obj.get("eventTime")))
        message = text(obj.get("message")) or text(obj.get("note"))
        return EventView(text(obj.get("reason"))[:128], message[:EventView.MESSAGE_LIMIT], last)


def controller_uid(obj: Mapping[str, Any], kind: str) -> str:
    """The uid of ``obj``'s controller ownerReference when that controller is a ``kind``; "" otherwise."""
    return next((text(o.get("uid")) for o in items(meta(obj).get("ownerReferences"))
                 if o.get("controller") is True and text(o.get("kind")) == kind), "")


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
    job_id: str = ""
    submission: str = ""
    """dispatch's identity labels (JobSet copies them from the Job template dispatch's entry labels)."""
    completion_mode: str = ""
    """``spec.completionMode`` (JobSet sets Indexed unless its replicatedJob says NonIndexed)."""
    parallelism: int = 1
    replicated_job: str = ""
    """JobSet's replicatedJob label: which replicatedJob of the runtime the Job was made from."""
    owner_uid: str = ""
    created: float | None = None
    """The uid of the JobSet that controls it and its ``creationTimestamp``: JobSet names a child Job after
    itself, so an earlier JobSet's Job that the garbage collector left keeps the current one's Job of that name
    from being created (JobSet: ``JobCreationFailed``, AlreadyExists; seen on the real control plane)."""

    @staticmethod
    def from_obj(obj: Mapping[str, Any]) -> JobView:
        status = mapping(obj.get("status"))
        started = bool(status.get("startTime")) or (parse_count(status.get("active")) or 0) > 0 or (
            parse_count(status.get("ready")) or 0) > 0
        labels = labels_of(obj)
        return JobView(
            name_of(obj), labels.get(JOBSET_NAME_LABEL, ""), is_suspended(obj),
            condition_true(obj, "Suspended"),
            condition_true(obj, "Complete") or condition_true(obj, "Failed"), started,
            text(mapping(obj.get("spec")).get("podReplacementPolicy")),
            labels.get(LABEL_JOB_ID, ""), labels.get(LABEL_SUBMISSION, ""),
            text(mapping(obj.get("spec")).get("completionMode")),
            parse_count(mapping(obj.get("spec")).get("parallelism")) or 1,
            labels.get(REPLICATED_JOB_LABEL, ""),
            controller_uid(obj, "JobSet"), instant(meta(obj).get("creationTimestamp")),
        )
