"""Everything shaped by Kueue's API: the Workload view, admission-check entries, the bodies written.

``dispatch status`` and the controller both read Workloads through this module, so they agree on
which check is dispatch's (by the AdmissionChecks' ``spec.controllerName``, configurable for a canary)
and on what a Workload's state means. A new Kueue API version should mean editing this file (and the
coordinates in ``_api``).
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import _api as api
from ._api import Obj
from ._names import KUEUE_JOB_UID_LABEL, LABEL_JOB_ID, LABEL_SUBMISSION, TRAINER_GROUP, label_value_problem
from ._views import Ref, condition_true, conditions, is_deleting, items, labels_of, mapping, text

WAITING_PREFIX = "waiting for "
"""Every message dispatch writes while it holds a check Pending starts so (restart-safe episode marker)."""


@dataclass(frozen=True, slots=True)
class CheckEntry:
    """One entry of a Workload's ``status.admissionChecks``. Slotted, its name and state shared (interned):
    the controller keeps each Workload's entries."""

    name: str
    state: str
    message: str
    last_transition: str

    @property
    def waiting_episode(self) -> bool:
        """Whether dispatch itself wrote the current Pending message (a waiting episode is under way)."""
        return self.state == "Pending" and self.message.startswith(WAITING_PREFIX)


@dataclass(frozen=True, slots=True)
class Owner:
    """A Workload's controller owner. Slotted, its apiVersion and kind shared (interned): the controller keeps
    one per Workload."""

    api_version: str
    kind: str
    name: str
    uid: str

    @property
    def is_trainjob(self) -> bool:
        return self.kind == "TrainJob" and self.api_version.split("/")[0] == TRAINER_GROUP


def controller_owner(obj: Mapping[str, Any]) -> Owner | None:
    for ref in items(mapping(obj.get("metadata")).get("ownerReferences")):
        if ref.get("controller") is True:
            return Owner(sys.intern(text(ref.get("apiVersion"))), sys.intern(text(ref.get("kind"))),
                         text(ref.get("name")), text(ref.get("uid")))
    return None


def entry_in(checks: Iterable[CheckEntry], names: Collection[str]) -> CheckEntry | None:
    """The check entry named after one of ``names`` (the AdmissionChecks that are dispatch's), if any: one
    place for every Workload shape (the view, a batch's hint, routing's slim copy)."""
    return next((c for c in checks if c.name in names), None)


@dataclass(frozen=True)
class WorkloadView:
    """A Kueue Workload as dispatch reads it, parsed once."""

    ref: Ref
    owner: Owner | None
    checks: tuple[CheckEntry, ...]
    active: bool
    deleting: bool
    quota_reserved: bool
    evicted: bool
    finished: bool
    admitted: bool
    quota_message: str
    """Why quota is not reserved yet (Kueue's QuotaReserved condition), for status."""
    pod_sets: tuple[str, ...]
    pod_set_identity: tuple[str, str] | None
    """(job-id, submission) as Kueue copied them from dispatch's pod template into the pod sets: a hint
    to select the TrainJobs of a batch by label, never trusted beyond that."""
    job_uid: str
    raw: Mapping[str, Any] = field(compare=False, repr=False, default_factory=dict)
    cluster_name: str = ""
    """``status.clusterName``: the MultiKueue worker it was admitted in (cleared by Kueue at an eviction)."""

    @staticmethod
    def from_obj(obj: Mapping[str, Any]) -> WorkloadView:
        status = mapping(obj.get("status"))
        checks = tuple(
            CheckEntry(sys.intern(text(c.get("name"))), sys.intern(text(c.get("state"))), text(c.get("message")),
                       text(c.get("lastTransitionTime")))
            for c in items(status.get("admissionChecks"))
        )
        spec = mapping(obj.get("spec"))
        pod_sets: list[str] = []
        ident: tuple[str, str] | None = None
        for ps in items(spec.get("podSets")):
            if text(ps.get("name")):
                pod_sets.append(text(ps.get("name")))
            labels = mapping(mapping(mapping(ps.get("template")).get("metadata")).get("labels"))
            job_id, sub = labels.get(LABEL_JOB_ID), labels.get(LABEL_SUBMISSION)
            if (ident is None and isinstance(job_id, str) and isinstance(sub, str) and job_id and sub
                    and label_value_problem(job_id) is None and label_value_problem(sub) is None):
                ident = (job_id, sub)
        conds = conditions(obj)
        quota = conds.get("QuotaReserved", {})
        quota_message = ""
        if text(quota.get("status")) != "True":
            quota_message = text(quota.get("message")) or text(quota.get("reason"))
        return WorkloadView(
            ref=Ref.of(obj),
            owner=controller_owner(obj),
            checks=checks,
            active=spec.get("active") is not False,
            deleting=is_deleting(obj),
            quota_reserved=condition_true(obj, "QuotaReserved"),
            evicted=condition_true(obj, "Evicted"),
            finished=condition_true(obj, "Finished"),
            admitted=condition_true(obj, "Admitted"),
            quota_message=quota_message,
            pod_sets=tuple(pod_sets),
            pod_set_identity=ident,
            job_uid=labels_of(obj).get(KUEUE_JOB_UID_LABEL, ""),
            raw=obj,
            cluster_name=text(status.get("clusterName"))[:253],
        )

    @property
    def key(self) -> str:
        return f"{self.ref.namespace}/{self.ref.name}"

    def entry(self, names: Collection[str]) -> CheckEntry | None:
        """Our entry: the one named after an AdmissionCheck whose controllerName is dispatch's."""
        return entry_in(self.checks, names)

    def pending_ours(self, names: Collection[str]) -> bool:
        entry = self.entry(names)
        return entry is not None and entry.state == "Pending"


@dataclass(frozen=True, slots=True)
class WorkloadHint:
    """What a batch's reads may be narrowed by, as a cache last saw it: the owner's uid (Workloads are
    listed by it) and the pod sets' identity (TrainJobs are listed by it). Never trusted beyond that:
    whatever a hint misses is read by a get. ``ref`` and ``checks`` (the cached resourceVersion and check
    entries) let a failed batch explain itself on the Workload, a write conditioned on that version."""

    owner_uid: str
    pod_set_identity: tuple[str, str] | None
    ref: Ref
    checks: tuple[CheckEntry, ...]
    trainjob: str = ""
    """The owning TrainJob's name ("" when the owner is not a TrainJob): read while the Workload is."""

    @staticmethod
    def of(view: WorkloadView) -> WorkloadHint:
        return WorkloadHint(view.owner.uid if view.owner is not None else "", view.pod_set_identity, view.ref,
                            view.checks, view.owner.name if view.owner is not None and view.owner.is_trainjob
                            else "")

    @staticmethod
    def from_obj(obj: Mapping[str, Any]) -> WorkloadHint:
        return WorkloadHint.of(WorkloadView.from_obj(obj))

    def entry(self, names: Collection[str]) -> CheckEntry | None:
        return entry_in(self.checks, names)


Addressed = WorkloadView | WorkloadHint
"""What a check write needs of a Workload: its ``ref`` (name, namespace, resourceVersion)."""


def owned_by(check: Mapping[str, Any], controller_name: str) -> bool:
    """Whether an AdmissionCheck is ``controller_name``'s: its ``spec.controllerName`` says so."""
    return text(mapping(check.get("spec")).get("controllerName")) == controller_name


def checks_owned(checks: Iterable[Mapping[str, Any]], controller_name: str) -> set[str]:
    """Names of the AdmissionChecks whose ``spec.controllerName`` is ``controller_name``."""
    return {text(mapping(c.get("metadata")).get("name")) for c in checks if owned_by(c, controller_name)}


def check_of(workload: WorkloadView | None, ours: set[str] | None) -> CheckEntry | None:
    """dispatch's check on the Workload; without the list of ours, the first check not yet Ready."""
    if workload is None:
        return None
    if ours:
        mine = workload.entry(ours)
        if mine is not None:
            return mine
    # the checks of ours are unknown (not listable), or the controller runs under another name (a canary):
    # name the first check still holding the Workload rather than say nothing
    return next((c for c in workload.checks if c.state != "Ready"), None)


def uid_selector(uids: Iterable[str]) -> str:
    """The Workloads of TrainJobs by uid (Kueue labels each Workload with its job's uid)."""
    return f"{KUEUE_JOB_UID_LABEL} in ({','.join(sorted(uids))})"


def entry_body(name: str, state: str, message: str, since: str, pod_set_updates: list[Obj] | None = None) -> Obj:
    entry: Obj = {"name": name, "state": state, "message": message, "lastTransitionTime": since}
    if pod_set_updates:
        entry["podSetUpdates"] = pod_set_updates
    return entry


def check_status_body(workload: Addressed, entry: Obj) -> Obj:
    """Server-side apply body of our one ``status.admissionChecks`` entry, conditioned on the Workload's
    resourceVersion: only our entry is sent, so Kueue's and other controllers' entries (same list-map,
    other keys) are merged, not replaced, which a merge patch could not do."""
    ref = workload.ref
    return {
        "apiVersion": api.WORKLOADS.api_version,
        "kind": "Workload",
        "metadata": {"name": ref.name, "namespace": ref.namespace, "resourceVersion": ref.resource_version},
        "status": {"admissionChecks": [entry]},
    }


def pod_set_updates(workload: WorkloadView, labels: Mapping[str, str]) -> list[Obj]:
    return [{"name": ps, "labels": dict(labels)} for ps in workload.pod_sets]


def active_patch(active: bool) -> Obj:
    """A Workload's ``spec.active``: dispatch's hold in Kueue mode."""
    return {"spec": {"active": active}}


def parse_time(value: str) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# ------------------------------------------------------------------ ClusterQueues that let Workloads skip a check


def check_gaps(cluster_queue: Mapping[str, Any], ours: Collection[str]) -> tuple[str, ...]:
    """Why some Workloads of this ClusterQueue would be admitted without asking one of our checks.

    Kueue applies a ClusterQueue's checks per assigned flavor: a check restricted by ``onFlavors`` is not
    asked for Workloads given another flavor, and from v0.19 a Workload given no flavor at all (it requests
    none of the queue's covered resources) is admitted without any check. The guard then refuses its start
    (no A was raised for it), so the TrainJob stalls instead of running twice; this names the cause where an
    operator looks (an Event on the ClusterQueue), before a Workload hits it.
    """
    spec = mapping(cluster_queue.get("spec"))
    named: dict[str, tuple[str, ...] | None] = {}
    for name in spec.get("admissionChecks") or []:      # v1beta1, deprecated: every flavor
        if isinstance(name, str) and name in ours:
            named[name] = None
    for entry in items(mapping(spec.get("admissionChecksStrategy")).get("admissionChecks")):
        name = text(entry.get("name"))
        if name in ours:
            flavors = tuple(f for f in entry.get("onFlavors") or [] if isinstance(f, str))
            named[name] = flavors or None
    if not named:
        return ()
    groups = items(spec.get("resourceGroups"))
    all_flavors = sorted({text(f.get("name")) for g in groups for f in items(g.get("flavors")) if f.get("name")})
    covered = sorted({r for g in groups for r in g.get("coveredResources") or [] if isinstance(r, str)})
    gaps: list[str] = []
    for name in sorted(named):
        only = named[name]
        if only is not None:
            skipped = [f for f in all_flavors if f not in only]
            if skipped:
                gaps.append(f"Workloads given flavor {', '.join(skipped)} skip check {name} (its onFlavors names "
                            f"only {', '.join(only)})")
    if "pods" not in covered:
        checks = ", ".join(sorted(named))
        gaps.append(f"a Workload that requests none of {', '.join(covered) or 'its covered resources'} is given "
                    f"no flavor, and Kueue v0.19 and later admit it without asking check {checks}: add `pods` to "
                    "the coveredResources of a resource group")
    return tuple(gaps)
