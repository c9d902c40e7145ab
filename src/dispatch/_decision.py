"""The rule, as pure functions: no I/O, no clock, no client.

Nothing re-admits an object while any pod of it may still run. Given what one consistent read saw
(the TrainJob, its JobSet and child Jobs, the namespace's pods selected two independent ways, and the
Nodes those pods sit on), these functions say whether an admission may proceed and explain why not in
the exact strings the status output uses. Everything that decides lives here so it can be tested
exhaustively; the adapter and the controller only fetch and write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._names import (
    ANNOTATION_ADMISSION,
    JOBSET_NAME_LABEL,
    KUEUE_QUEUE_LABEL,
    LABEL_ADMISSION,
    LABEL_JOB_ID,
    LABEL_SUBMISSION,
    OUT_OF_SERVICE_TAINT,
    PATCH_MANAGER,
)
from ._records import Cause, Cessation, Identity, RemainingPod, State

Obj = Mapping[str, Any]

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


# --------------------------------------------------------------------------- small readers


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata") or {}
    return meta if isinstance(meta, Mapping) else {}


def labels_of(obj: Obj) -> Mapping[str, str]:
    labels = _meta(obj).get("labels") or {}
    return labels if isinstance(labels, Mapping) else {}


def annotations_of(obj: Obj) -> Mapping[str, str]:
    ann = _meta(obj).get("annotations") or {}
    return ann if isinstance(ann, Mapping) else {}


def name_of(obj: Obj) -> str:
    return str(_meta(obj).get("name", ""))


def _int_or_none(value: object) -> int | None:
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _conditions(obj: Obj) -> list[Mapping[str, Any]]:
    status = obj.get("status") or {}
    conds = status.get("conditions") or [] if isinstance(status, Mapping) else []
    return [c for c in conds if isinstance(c, Mapping)]


def condition_true(obj: Obj, ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True" for c in _conditions(obj))


def is_suspended(obj: Obj) -> bool:
    spec = obj.get("spec") or {}
    return bool(isinstance(spec, Mapping) and spec.get("suspend") is True)


def is_deleting(obj: Obj) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


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
        ready = None
        for cond in _conditions(obj):
            if cond.get("type") == "Ready":
                ready = str(cond.get("status", "Unknown"))
        spec = obj.get("spec") or {}
        taints = spec.get("taints") or [] if isinstance(spec, Mapping) else []
        oos = any(isinstance(t, Mapping) and t.get("key") == OUT_OF_SERVICE_TAINT for t in taints)
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
        text = f"Ready={self.ready or 'Unknown'}"
        if self.out_of_service:
            text += ", out-of-service"
        return text

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

    @staticmethod
    def from_obj(obj: Obj) -> PodView:
        meta = _meta(obj)
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        return PodView(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid") or meta.get("name", "")),
            node=(spec.get("nodeName") or None) if isinstance(spec, Mapping) else None,
            phase=str((status.get("phase") if isinstance(status, Mapping) else None) or "Pending"),
            deleting=bool(meta.get("deletionTimestamp")),
            admission=_int_or_none(labels_of(obj).get(LABEL_ADMISSION)),
            deletion_timestamp=str(meta.get("deletionTimestamp")) if meta.get("deletionTimestamp") else None,
        )

    @property
    def may_run(self) -> bool:
        """Any pod not Succeeded or Failed may have a running container, Terminating or not."""
        return self.phase not in TERMINAL_PHASES


def selects(pod: Obj, *, name: str, job_id: str, submission: str) -> bool:
    """The two independent selections of the rule: dispatch's labels, or JobSet's jobset-name."""
    labels = labels_of(pod)
    by_dispatch = bool(job_id) and (
        labels.get(LABEL_JOB_ID) == job_id and labels.get(LABEL_SUBMISSION) == submission
    )
    return by_dispatch or labels.get(JOBSET_NAME_LABEL) == name


def object_pods(
    pods: Iterable[Obj], *, name: str, job_id: str, submission: str
) -> list[PodView]:
    """The object's pods from both selections, each once, in name order."""
    seen: dict[str, PodView] = {}
    for pod in pods:
        if selects(pod, name=name, job_id=job_id, submission=submission):
            view = PodView.from_obj(pod)
            seen.setdefault(view.uid, view)
    return sorted(seen.values(), key=lambda p: p.name)


def remaining(pods: Sequence[PodView], nodes: Mapping[str, NodeView]) -> tuple[RemainingPod, ...]:
    """The pods that may still run, each with its node and node state."""
    out = []
    for pod in pods:
        if not pod.may_run:
            continue
        node = nodes.get(pod.node) if pod.node else None
        state = node.state_text() if node else ("not readable" if pod.node else "")
        out.append(RemainingPod(pod.name, pod.node, state, pod.phase, pod.deleting, pod.admission,
                                pod.deletion_timestamp))
    return tuple(out)


def describe_pods(pods: Sequence[RemainingPod]) -> str:
    return ", ".join(p.describe() for p in pods)


def remaining_detail(pods: Sequence[RemainingPod]) -> str:
    """``remaining pods: <pod> on <node> (<node state>), ...``, the seed's exact form."""
    return f"remaining pods: {describe_pods(pods)}"


def waiting_message(pods: Sequence[RemainingPod], blockers: Sequence[str] = ()) -> str:
    """The Kueue admission check message while pods remain."""
    parts = []
    if pods:
        parts.append(
            "waiting for pods of the previous execution to go: "
            + ", ".join(f"{p.name} on {p.node or 'no node'}" for p in pods)
        )
    parts.extend(blockers)
    return "; ".join(parts)


# --------------------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Verdict:
    """Whether an admission may proceed now, and what stands in its way."""

    remaining: tuple[RemainingPod, ...]
    blockers: tuple[str, ...]
    """Non-pod reasons: a JobSet or child Job whose suspension has not yet taken effect."""

    @property
    def admissible(self) -> bool:
        return not self.remaining and not self.blockers

    def detail(self) -> str:
        parts = []
        if self.remaining:
            parts.append(remaining_detail(self.remaining))
        parts.extend(self.blockers)
        return "; ".join(parts)


def _finished(obj: Obj, complete: str) -> bool:
    return condition_true(obj, complete) or condition_true(obj, "Failed")


def _job_blocker(job: Obj) -> str | None:
    """A child Job that could still start pods: not suspended, or its suspension not yet acted on."""
    if condition_true(job, "Complete") or condition_true(job, "Failed"):
        return None
    name = name_of(job)
    if not is_suspended(job):
        return f"job {name} is not suspended yet"
    if condition_true(job, "Suspended"):
        return None
    status = job.get("status") or {}
    started = isinstance(status, Mapping) and (
        status.get("startTime") or int(status.get("active") or 0) > 0 or int(status.get("ready") or 0) > 0
    )
    if started:
        return f"job {name} has not confirmed its suspension yet"
    return None


def decide(
    *,
    name: str,
    job_id: str,
    submission: str,
    pods: Iterable[Obj],
    nodes: Mapping[str, NodeView],
    jobset: Obj | None = None,
    jobs: Iterable[Obj] = (),
) -> Verdict:
    """The rule. ``pods`` is everything one consistent read returned for both selections.

    A pod blocks unless it is Succeeded or Failed. A JobSet or child Job whose suspension has not
    taken effect blocks too: it could still start a pod after the read (the suspended TrainJob alone
    does not prove the layers below have caught up).
    """
    views = object_pods(pods, name=name, job_id=job_id, submission=submission)
    blockers: list[str] = []
    if jobset is not None and not (is_deleting(jobset) or is_suspended(jobset) or _finished(jobset, "Completed")):
        blockers.append(f"jobset {name_of(jobset)} is not suspended yet")
    for job in sorted(jobs, key=name_of):
        if labels_of(job).get(JOBSET_NAME_LABEL) != name:
            continue
        blocker = _job_blocker(job)
        if blocker:
            blockers.append(blocker)
    return Verdict(remaining(views, nodes), tuple(blockers))


def cessation(
    *,
    trainjob: Obj | None,
    name: str,
    job_id: str,
    submission: str,
    pods: Iterable[Obj],
    nodes: Mapping[str, NodeView],
) -> Cessation:
    """Whether the object's processes are proven gone.

    True once the object is not admitted and every pod that may run sits on a Node that is deleted or
    tainted out-of-service. A Node that could not be read proves nothing.
    """
    views = object_pods(pods, name=name, job_id=job_id, submission=submission)
    rest = remaining(views, nodes)
    admitted = trainjob is not None and not is_suspended(trainjob) and not is_deleting(trainjob)
    if admitted and trainjob is not None and not _finished(trainjob, "Complete"):
        return Cessation(False, f"{name} is admitted and running", rest)
    unproven = []
    for pod in rest:
        node = nodes.get(pod.node) if pod.node else None
        if pod.node is None:
            if pod.terminating:
                continue
            unproven.append(pod)
            continue
        if node is None or not node.proven_down:
            unproven.append(pod)
    if not unproven:
        if rest:
            return Cessation(True, "every remaining pod is on a node that is gone or out-of-service", rest)
        return Cessation(True, "no pod of the object may still run", rest)
    unreadable = [p for p in unproven if p.node_state == "not readable"]
    if unreadable:
        return Cessation(
            False,
            "cannot prove cessation: nodes not readable (needs get on nodes): "
            + describe_pods(unreadable),
            rest,
        )
    return Cessation(False, "pods may still run: " + describe_pods(unproven), rest)


# --------------------------------------------------------------------------- identity and state


def admission_of(trainjob: Obj) -> int:
    """A as recorded on the TrainJob (0 if never admitted or unreadable)."""
    return _int_or_none(annotations_of(trainjob).get(ANNOTATION_ADMISSION)) or 0


def patch_admission_of(trainjob: Obj) -> int:
    """A as carried by dispatch's own runtime patch entry (0 if absent)."""
    best = 0
    for entry in _runtime_patches(trainjob):
        if entry.get("manager") != PATCH_MANAGER:
            continue
        for rj in _patch_replicated_jobs(entry):
            labels = ((rj.get("template") or {}).get("spec") or {}).get("template") or {}
            value = ((labels.get("metadata") or {}).get("labels") or {}).get(LABEL_ADMISSION)
            best = max(best, _int_or_none(value) or 0)
    return best


def next_admission(trainjob: Obj, pods: Iterable[Obj]) -> int:
    """The next A: above every A seen on the object, its patch and any pod. Never reused."""
    seen = [admission_of(trainjob), patch_admission_of(trainjob)]
    seen.extend(PodView.from_obj(p).admission or 0 for p in pods)
    return max(seen) + 1


def _runtime_patches(trainjob: Obj) -> list[Mapping[str, Any]]:
    spec = trainjob.get("spec") or {}
    patches = spec.get("runtimePatches") or [] if isinstance(spec, Mapping) else []
    return [p for p in patches if isinstance(p, Mapping)]


def _patch_replicated_jobs(entry: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    template = ((entry.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
    rjs = template.get("replicatedJobs") or []
    return [rj for rj in rjs if isinstance(rj, Mapping)]


def patched_replicated_jobs(trainjob: Obj) -> list[str]:
    """Names of the replicatedJobs dispatch's own runtime patch entry targets."""
    for entry in _runtime_patches(trainjob):
        if entry.get("manager") == PATCH_MANAGER:
            return [str(rj.get("name")) for rj in _patch_replicated_jobs(entry) if rj.get("name")]
    return []


def identity_of(trainjob: Obj) -> Identity:
    labels = labels_of(trainjob)
    return Identity(
        labels.get(LABEL_JOB_ID, ""), labels.get(LABEL_SUBMISSION, ""), admission_of(trainjob)
    )


def queue_of(trainjob: Obj) -> str | None:
    return labels_of(trainjob).get(KUEUE_QUEUE_LABEL) or None


def state_of(trainjob: Obj) -> State:
    if is_deleting(trainjob):
        return State.CLOSING
    if condition_true(trainjob, "Complete"):
        return State.SUCCEEDED
    if condition_true(trainjob, "Failed"):
        return State.FAILED
    if not is_suspended(trainjob):
        return State.RUNNING
    return State.QUEUED if queue_of(trainjob) else State.HELD


@dataclass(frozen=True)
class CheckView:
    """Dispatch's admission check entry on the object's Kueue Workload."""

    name: str
    state: str
    message: str


def explain(
    trainjob: Obj, verdict: Verdict | None, check: CheckView | None = None, workload_note: str = ""
) -> Cause:
    """The cause shown by inspect and find. Not-running objects name whatever keeps them waiting."""
    state = state_of(trainjob)
    ident = identity_of(trainjob)
    parts: list[str] = []
    if check is not None:
        text = f"admission check {check.name} {check.state}"
        if check.message:
            text += f": {check.message}"
        parts.append(text)
    elif workload_note:
        parts.append(workload_note)
    pods_text = verdict.detail() if verdict is not None and not verdict.admissible else ""
    if state is State.RUNNING:
        return Cause("Admitted", f"execution {ident.admission} admitted")
    if pods_text:
        parts.append(pods_text)
    if state is State.HELD:
        if pods_text:
            return Cause("PodsRemain", "; ".join(parts))
        return Cause("Held", "; ".join([*parts, "hold in force; release admits it"]))
    if state is State.QUEUED:
        reason = "AdmissionCheckPending" if check is not None and check.state == "Pending" else "Queued"
        if not parts:
            parts.append(f"waiting for Kueue to admit it from queue {queue_of(trainjob)}")
        return Cause(reason, "; ".join(parts))
    if state is State.SUCCEEDED:
        return Cause("Succeeded", "; ".join(parts))
    if state is State.FAILED:
        return Cause("Failed", "; ".join(parts))
    return Cause("Closing", "; ".join(parts))
