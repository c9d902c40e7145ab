"""A stand-in for Kueue on ``dispatch.testing.FakeCluster``, for the controller's tests and benchmarks.

The fake API server has no Kueue, so this plays the parts of it the admission check meets: the TrainJob
webhook's runtime-patch entry, a Workload owned by the TrainJob with quota reserved and every check
Pending, admission (merge ``podSetUpdates`` labels into Kueue's runtime patch, then unsuspend) once all
checks are Ready, and eviction (suspend, reset checks to Pending, release and re-reserve quota once the
job reports inactive, which is exactly when pods may still be Terminating).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import httpx2

from .. import _names as n
from ..testing import FakeCluster

Obj = dict[str, Any]
KUEUE = n.KUEUE_GROUP
TRAINER = n.TRAINER_GROUP
KUEUE_MANAGER = "kueue.x-k8s.io/manager"
T0 = "2026-01-01T00:00:00Z"


def _cond(obj: Obj, ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def _set(obj: Obj, ctype: str, status: bool, reason: str) -> None:
    conds = obj.setdefault("status", {}).setdefault("conditions", [])
    for c in conds:
        if c.get("type") == ctype:
            c.update(status="True" if status else "False", reason=reason)
            return
    conds.append({"type": ctype, "status": "True" if status else "False", "reason": reason, "message": "",
                  "lastTransitionTime": T0})


class FakeKueue:
    """Kueue's side of the admission-check protocol, stepped by hand like the rest of the fake cluster."""

    def __init__(self, cluster: FakeCluster, *, check: str = "dispatch", queue: str = "lq-dispatch",
                 cluster_queue: str = "cq-dispatch") -> None:
        self.cluster = cluster
        self.server = cluster.server
        self.check = check
        self.queue = queue
        self.cluster_queue = cluster_queue
        self.admitted: list[tuple[str, dict[str, str]]] = []

    def install(self, controller_name: str = n.CONTROLLER_NAME) -> None:
        self.server.create(KUEUE, "admissionchecks", "", {
            "metadata": {"name": self.check}, "spec": {"controllerName": controller_name}})
        self.server.create(KUEUE, "clusterqueues", "", {
            "metadata": {"name": self.cluster_queue},
            "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": self.check}]},
                     # covering pods gives every Workload a flavor, so Kueue asks the check of each
                     "resourceGroups": [{"coveredResources": ["cpu", "memory", "pods"], "flavors": [
                         {"name": "default", "resources": [{"name": r, "nominalQuota": q} for r, q in (
                             ("cpu", "1000"), ("memory", "1000Gi"), ("pods", "10000"))]}]}]}})
        self.server.create(KUEUE, "localqueues", self.cluster.namespace, {
            "metadata": {"name": self.queue}, "spec": {"clusterQueue": self.cluster_queue}})

    @staticmethod
    def workload_name(trainjob: str) -> str:
        return f"trainjob-{trainjob}-{hashlib.sha256(trainjob.encode()).hexdigest()[:5]}"

    def workload_for(self, trainjob: str, *, namespace: str | None = None, other_checks: Sequence[str] = (),
                     pod_sets: Sequence[str] | None = None, reserve: bool = True) -> str:
        """Create the Workload Kueue would create for ``trainjob`` (and the webhook's patch entry)."""
        ns = namespace or self.cluster.namespace
        tj = self.server.get(TRAINER, "trainjobs", ns, trainjob)
        assert tj is not None, f"no trainjob {trainjob}"
        if not any(p.get("manager") == KUEUE_MANAGER for p in tj["spec"].get("runtimePatches") or []):
            def webhook(obj: Obj) -> None:
                obj["spec"].setdefault("runtimePatches", []).append(
                    {"manager": KUEUE_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {}}}})
            self.server.update(TRAINER, "trainjobs", ns, trainjob, webhook, status=False)
        if pod_sets is None:
            ref = tj["spec"].get("runtimeRef") or {}
            runtime = self.server.get(TRAINER, "clustertrainingruntimes", "", ref.get("name", ""))
            pod_sets = [rj["name"] for rj in (runtime or {}).get("spec", {}).get("template", {}).get("spec", {})
                        .get("replicatedJobs", [])] or ["node"]
        name = self.workload_name(trainjob)
        checks = [{"name": c, "state": "Pending", "message": "", "lastTransitionTime": T0}
                  for c in (*other_checks, self.check)]
        conds = [{"type": "QuotaReserved", "status": "True" if reserve else "False",
                  "reason": "QuotaReserved" if reserve else "Pending", "message": "", "lastTransitionTime": T0}]
        self.server.create(KUEUE, "workloads", ns, {
            "metadata": {
                "name": name,
                "labels": {n.KUEUE_JOB_UID_LABEL: tj["metadata"]["uid"]},
                "ownerReferences": [{"apiVersion": f"{TRAINER}/{n.TRAINER_VERSION}", "kind": "TrainJob",
                                     "name": trainjob, "uid": tj["metadata"]["uid"], "controller": True,
                                     "blockOwnerDeletion": True}],
                "finalizers": ["kueue.x-k8s.io/resource-in-use"],
            },
            "spec": {"queueName": self.queue, "active": True,
                     "podSets": [{"name": ps, "count": 1, "template": {"metadata": {"labels": self._template_labels(
                         tj, ps)}}} for ps in pod_sets]},
            "status": {"conditions": conds, "admissionChecks": checks},
        })
        return name

    @staticmethod
    def _template_labels(trainjob: Obj, pod_set: str) -> dict[str, str]:
        """The pod-template labels Kueue copies into a pod set: here, those of dispatch's runtime patch."""
        for patch in (trainjob.get("spec") or {}).get("runtimePatches") or []:
            if patch.get("manager") != n.PATCH_MANAGER:
                continue
            for rj in (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get(
                    "replicatedJobs") or []:
                if rj.get("name") == pod_set:
                    tmpl = ((rj.get("template") or {}).get("spec") or {}).get("template") or {}
                    return dict((tmpl.get("metadata") or {}).get("labels") or {})
        return {}

    def workload(self, name: str, namespace: str | None = None) -> Obj:
        wl = self.server.get(KUEUE, "workloads", namespace or self.cluster.namespace, name)
        assert wl is not None, f"no workload {name}"
        return wl

    def entry(self, name: str, check: str | None = None, namespace: str | None = None) -> Obj:
        for c in self.workload(name, namespace)["status"].get("admissionChecks") or []:
            if c["name"] == (check or self.check):
                return dict(c)
        raise AssertionError(f"workload {name} has no check {check or self.check}")

    def set_check(self, name: str, check: str, state: str, message: str = "", namespace: str | None = None) -> None:
        """Another controller (or a person) writes its own check's state."""
        def mutate(obj: Obj) -> None:
            for c in obj["status"]["admissionChecks"]:
                if c["name"] == check:
                    c.update(state=state, message=message)
        self.server.update(KUEUE, "workloads", namespace or self.cluster.namespace, name, mutate, status=True)

    def sync(self) -> None:
        """One pass of Kueue's workload and job reconcilers."""
        for wl in self.server.objects(KUEUE, "workloads"):
            ns, name = wl["metadata"]["namespace"], wl["metadata"]["name"]
            owner = (wl["metadata"].get("ownerReferences") or [{}])[0]
            tj_name = owner.get("name", "")
            if _cond(wl, "Evicted"):
                self._finish_eviction(wl, ns, tj_name)
                continue
            if not _cond(wl, "QuotaReserved") or _cond(wl, "Admitted") or wl["spec"].get("active") is False:
                continue
            checks = wl["status"].get("admissionChecks") or []
            if not all(c.get("state") == "Ready" for c in checks):
                continue
            self._start(wl, ns, name, tj_name, checks)

    def _start(self, wl: Obj, ns: str, name: str, tj_name: str, checks: list[Obj]) -> None:
        labels: dict[str, dict[str, str]] = {}
        for c in checks:
            for upd in c.get("podSetUpdates") or []:
                labels.setdefault(upd["name"], {}).update(upd.get("labels") or {})

        def patch(obj: Obj) -> None:
            for p in obj["spec"].get("runtimePatches") or []:
                if p.get("manager") == KUEUE_MANAGER:
                    p["trainingRuntimeSpec"] = {"template": {"spec": {"replicatedJobs": [
                        {"name": ps["name"], "template": {"spec": {"template": {"metadata": {
                            "labels": labels.get(ps["name"], {})}}}}} for ps in wl["spec"]["podSets"]]}}}

        def unsuspend(obj: Obj) -> None:
            obj["spec"]["suspend"] = False

        self.server.update(TRAINER, "trainjobs", ns, tj_name, patch, status=False)
        self.server.update(TRAINER, "trainjobs", ns, tj_name, unsuspend, status=False)

        def admitted(obj: Obj) -> None:
            _set(obj, "Admitted", True, "Admitted")
        self.server.update(KUEUE, "workloads", ns, name, admitted, status=True)
        merged: dict[str, str] = {}
        for v in labels.values():
            merged.update(v)
        self.admitted.append((name, merged))

    def evict(self, name: str, namespace: str | None = None, reason: str = "Preempted") -> None:
        """Preempt: suspend the TrainJob, mark Evicted and reset every non-Pending check to Pending."""
        ns = namespace or self.cluster.namespace
        wl = self.workload(name, ns)
        tj_name = wl["metadata"]["ownerReferences"][0]["name"]

        def suspend(obj: Obj) -> None:
            obj["spec"]["suspend"] = True
        self.server.update(TRAINER, "trainjobs", ns, tj_name, suspend, status=False)

        def evicted(obj: Obj) -> None:
            _set(obj, "Evicted", True, reason)
            _set(obj, "Admitted", False, "NoReservation")
            for c in obj["status"].get("admissionChecks") or []:
                if c.get("state") != "Pending":
                    c["message"] = f"Reset to Pending after eviction. Previously: {c.get('state')}"
                    c["state"] = "Pending"
        self.server.update(KUEUE, "workloads", ns, name, evicted, status=True)

    def _finish_eviction(self, wl: Obj, ns: str, tj_name: str) -> None:
        """Once JobSet reports no active Job (Terminating pods do not count), release and re-reserve."""
        js = self.server.get(n.JOBSET_GROUP, "jobsets", ns, tj_name)
        if js is not None and any(int(rj.get("active") or 0) > 0
                                  for rj in (js.get("status") or {}).get("replicatedJobsStatus") or []):
            return

        def clear(obj: Obj) -> None:
            for p in obj["spec"].get("runtimePatches") or []:
                if p.get("manager") == KUEUE_MANAGER:
                    p["trainingRuntimeSpec"] = {"template": {"spec": {}}}
        self.server.update(TRAINER, "trainjobs", ns, tj_name, clear, status=False)

        def requeue(obj: Obj) -> None:
            _set(obj, "Evicted", False, "QuotaReserved")
            _set(obj, "QuotaReserved", True, "QuotaReserved")
            _set(obj, "Requeued", True, "Preempted")
        self.server.update(KUEUE, "workloads", ns, wl["metadata"]["name"], requeue, status=True)


# ------------------------------------------------------------------ TokenReview / SubjectAccessReview


class AccessReviews:
    """The API server's TokenReview and SubjectAccessReview, in front of the fake cluster's transport.

    The fake API server stores objects and has no authentication, so secure metrics are tested through
    this separate layer: it answers the two review endpoints from a table of tokens and grants (a
    token's user, its groups; which user may ``get`` which non-resource path) and passes every other
    request to the fake cluster. ``reviews`` records each review asked for, in order.
    """

    TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
    ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.users: dict[str, tuple[str, list[str]]] = {}
        self.grants: set[tuple[str, str, str]] = set()
        self.reviews: list[tuple[str, Obj]] = []
        self.fail = False
        """While True, both endpoints answer 500 (the API server unreachable from the reviewer's view)."""

    def add_user(self, token: str, username: str, groups: Sequence[str] = ("system:authenticated",)) -> None:
        self.users[token] = (username, list(groups))

    def allow(self, username: str, path: str = "/metrics", verb: str = "get") -> None:
        self.grants.add((username, verb, path))

    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self.handle)

    async def handle(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if request.method != "POST" or path not in (self.TOKEN_REVIEWS, self.ACCESS_REVIEWS):
            return await self.cluster.server.handle(request)
        body: Obj = json.loads(request.content or b"{}")
        self.reviews.append(("token" if path == self.TOKEN_REVIEWS else "access", body))
        if self.fail:
            return httpx2.Response(500, json={"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                              "reason": "InternalError", "code": 500, "message": "unavailable"})
        spec: Obj = body.get("spec") or {}
        if path == self.TOKEN_REVIEWS:
            found = self.users.get(str(spec.get("token", "")))
            status: Obj = {"authenticated": False, "error": "invalid bearer token"} if found is None else {
                "authenticated": True, "user": {"username": found[0], "uid": f"uid-{found[0]}", "groups": found[1]}}
        else:
            attrs: Obj = spec.get("nonResourceAttributes") or {}
            allowed = (spec.get("user"), attrs.get("verb"), attrs.get("path")) in self.grants
            status = {"allowed": allowed} if allowed else {"allowed": False, "reason": "no grant"}
        return httpx2.Response(201, json={**body, "status": status})
