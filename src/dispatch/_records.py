"""The small typed records the public API returns and accepts."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["Cause", "Cessation", "Identity", "JobSpec", "PodEnd", "RemainingPod", "State", "Status", "Toleration",
           "Volume", "Worker"]


class State(enum.StrEnum):
    """Where an object is in its life, as dispatch sees it."""

    HELD = "Held"
    """Suspended and not admitted; in plain mode only ``release`` lifts the hold."""
    QUEUED = "Queued"
    """Suspended, waiting for Kueue (and dispatch's admission check) to admit it."""
    RUNNING = "Running"
    """Admitted: an execution is in progress."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CLOSING = "Closing"
    """Deleted, waiting for its finalizers."""


@dataclass(frozen=True)
class Identity:
    """Execution identity: (job-id, submission, A). ``admission`` is 0 until the first admission."""

    job_id: str
    submission: str
    admission: int

    def __str__(self) -> str:
        return f"{self.job_id}/{self.submission}#{self.admission}"


@dataclass(frozen=True)
class RemainingPod:
    """A pod that may still run, where it runs, and what we know of that node."""

    name: str
    node: str | None
    node_state: str
    phase: str
    terminating: bool
    admission: int | None = None
    deletion_timestamp: str | None = None
    """When the pod was asked to stop by (its deletionTimestamp: the deletion time plus its grace period)."""
    held: bool = False
    """Deleted for good (a force delete, PodGC) with its end unproven: only dispatch's finalizer keeps it."""
    why: str = ""
    """Why its end is not proven although it is not simply running, and what ends the wait (a kubelet's
    rejection, a Failed someone else wrote, a taint on a Ready node); empty otherwise."""
    cluster: str = ""
    """The MultiKueue worker it is in ("" for this cluster)."""
    proven: bool = False
    """Its end is proven (its node deleted or out-of-service, or it was never scheduled): only dispatch's
    finalizer keeps it in the API, until dispatch's controller removes the finalizer."""

    @property
    def qualified(self) -> str:
        """``<worker>/<pod>`` for a pod in a MultiKueue worker, else the pod's name."""
        return f"{self.cluster}/{self.name}" if self.cluster else self.name

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "node": self.node,
            "nodeState": self.node_state,
            "phase": self.phase,
            "terminating": self.terminating,
            "admission": self.admission,
            "deletionTimestamp": self.deletion_timestamp,
            "held": self.held,
            "why": self.why,
            "cluster": self.cluster,
        }

    def describe(self) -> str:
        """``<pod> on <node> (<node state>)``, the form every status string uses."""
        if not self.node:
            return f"{self.qualified} on no node (not scheduled)"
        return f"{self.qualified} on {self.node} ({self.node_state})"


@dataclass(frozen=True)
class Cause:
    """Why the object is in its state: a CamelCase reason and a sentence for people."""

    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


@dataclass(frozen=True)
class Status:
    """What ``inspect`` and ``find`` return for one object."""

    name: str
    namespace: str
    state: State
    identity: Identity
    cause: Cause
    mode: str
    """``plain`` or ``kueue`` (the TrainJob names a Kueue queue)."""
    queue: str | None = None
    created: datetime | None = None
    remaining: tuple[RemainingPod, ...] = ()
    resource_version: str = ""
    managed: bool = True
    """Whether dispatch manages the object (its identity labels); others are shown, never admitted."""
    created_by: str = ""
    """Who created the TrainJob, as its managedFields tell (``dispatch``, ``kubectl-client-side-apply``, ...)."""
    warnings: tuple[str, ...] = ()
    """What could break the promise and is not dispatch's to fix (a runtime whose Jobs replace a
    deleting pod at once, say)."""
    cluster: str = ""
    """Under MultiKueue, the worker the execution was admitted in ("" elsewhere, or while none is)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON/YAML output; every field, nothing lost."""
        return {
            "name": self.name,
            "namespace": self.namespace,
            "state": self.state.value,
            "identity": {
                "jobId": self.identity.job_id,
                "submission": self.identity.submission,
                "admission": self.identity.admission,
            },
            "cause": {"reason": self.cause.reason, "detail": self.cause.detail},
            "mode": self.mode,
            "queue": self.queue,
            "created": self.created.isoformat() if self.created else None,
            "remaining": [p.to_dict() for p in self.remaining],
            "resourceVersion": self.resource_version,
            "managed": self.managed,
            "createdBy": self.created_by,
            "cluster": self.cluster,
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class Worker:
    """A MultiKueue worker cluster as Kueue sees it, and whether an operator confirmed it down."""

    name: str
    active: str
    """Kueue's Active condition: "True" (connected), "False" (lost) or "Unknown"."""
    reason: str
    message: str
    lost_since: str
    """When Kueue lost it ("" while Active)."""
    confirmed_down: bool
    """An operator confirmed this loss is the worker being down: its pods no longer block admission."""
    removed: bool = False
    """No MultiKueueCluster names it any more (removed from the manager); identity records may remember it."""
    forgotten: tuple[str, ...] = ()
    """``namespace/job-id/submission`` of each identity record the confirmation of a removed worker made forget it."""
    armed: tuple[str, ...] = ()
    """``namespace/trainjob`` of each object left as it was: raised for a start Kueue is about to make."""

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "active": self.active, "reason": self.reason, "message": self.message,
               "lostSince": self.lost_since, "confirmedDown": self.confirmed_down}
        if self.removed:
            out.update(removed=True, forgotten=list(self.forgotten), armed=list(self.armed))
        return out


@dataclass(frozen=True)
class PodEnd:
    """How one pod's end is proven: ``kubelet-confirmed`` (a terminal phase and every container
    terminated, as its kubelet reports), ``node-deleted``, ``out-of-service`` (the operator's taint),
    ``not-scheduled`` (deleted before any node ran it), or ``unproven`` (it may still run)."""

    name: str
    node: str | None
    proof: str
    phase: str
    finalizer: bool = False
    """The pod still carries dispatch's finalizer (it stays in the API until dispatch releases it)."""

    @property
    def proven(self) -> bool:
        return self.proof != "unproven"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "node": self.node, "proof": self.proof, "phase": self.phase,
                "finalizer": self.finalizer}


@dataclass(frozen=True)
class Cessation:
    """Whether the object's processes are proven gone, and why (or why that cannot be proven)."""

    ceased: bool
    reason: str
    remaining: tuple[RemainingPod, ...] = ()
    ends: tuple[PodEnd, ...] = ()
    """Every pod of the object still in the API, with how its end is proven (or ``unproven``)."""

    def __bool__(self) -> bool:
        return self.ceased

    def to_dict(self) -> dict[str, Any]:
        return {
            "ceased": self.ceased,
            "reason": self.reason,
            "remaining": [p.describe() for p in self.remaining],
            "ends": [e.to_dict() for e in self.ends],
        }


@dataclass(frozen=True)
class Volume:
    """A volume mounted at ``mount_path`` in the trainer container (Trainer's ``node``) of every pod that has
    one: above all the checkpoint volume the promise protects, a PersistentVolumeClaim (``claim``).

    Exactly one source: ``claim`` (a PVC's name), ``config_map``, ``secret`` (their names) or
    ``empty_dir``. ``sub_path`` mounts one path inside the volume (relative, no ``..``)."""

    name: str
    mount_path: str
    claim: str | None = None
    config_map: str | None = None
    secret: str | None = None
    empty_dir: bool = False
    read_only: bool = False
    sub_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """As the spec file writes it (camelCase keys, unset ones left out)."""
        out: dict[str, Any] = {"name": self.name, "mountPath": self.mount_path}
        for key, value in (("claim", self.claim), ("configMap", self.config_map), ("secret", self.secret),
                           ("subPath", self.sub_path)):
            if value is not None:
                out[key] = value
        if self.empty_dir:
            out["emptyDir"] = True
        if self.read_only:
            out["readOnly"] = True
        return out


@dataclass(frozen=True)
class Toleration:
    """A pod toleration, as Kubernetes spells it (``operator`` ``Equal`` or ``Exists``; ``effect`` empty,
    ``NoSchedule``, ``PreferNoSchedule`` or ``NoExecute``; ``seconds`` is ``tolerationSeconds``, NoExecute
    only)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    seconds: int | None = None


@dataclass(frozen=True)
class JobSpec:
    """What ``open`` needs to create a TrainJob.

    ``name`` defaults to ``<job_id>-<submission>``. ``queue`` puts the object under Kueue (Kueue mode).
    """

    job_id: str
    submission: str
    runtime: str = "torch-distributed"
    runtime_kind: str = "ClusterTrainingRuntime"
    image: str | None = None
    command: Sequence[str] = ()
    args: Sequence[str] = ()
    num_nodes: int | None = None
    resources_per_node: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    queue: str | None = None
    priority_class: str | None = None
    name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    """Extra labels on the TrainJob."""
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    """Annotations on every pod (through dispatch's runtime patch)."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """A node selector for every pod (through dispatch's runtime patch)."""
    termination_grace_period_seconds: int | None = None
    volumes: Sequence[Volume] = ()
    """Volumes mounted in every trainer container (the checkpoint volume: ``Volume(..., claim=...)``)."""
    tolerations: Sequence[Toleration] = ()
    """Tolerations of every pod."""
    service_account: str | None = None
    """The ServiceAccount every pod runs as (None: the runtime's, else the namespace's default)."""
    image_pull_secrets: Sequence[str] = ()
    """Names of Secrets every pod pulls its images with."""
