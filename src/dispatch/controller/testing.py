"""A stand-in for Kueue on ``dispatch.testing.FakeCluster``, for the controller's tests and benchmarks,
and ``keeper_pass``: the controller's finalizer keeper, for a test of plain mode that runs no controller.

The fake API server has no Kueue, so this plays the parts of it the admission check meets: the TrainJob
webhook's runtime-patch entry, a Workload owned by the TrainJob with quota reserved and every check
Pending, admission (merge ``podSetUpdates`` labels into Kueue's runtime patch, then unsuspend) once all
checks are Ready, and eviction (suspend, reset checks to Pending, release and re-reserve quota once the
job reports inactive, which is exactly when pods may still be Terminating), eviction of an admitted
Workload that someone deactivated, and Kueue's job reconciler (``reconcile_jobs``): a Workload for each
TrainJob it manages (the queue-name label, or every TrainJob under ``manageJobsWithoutQueueName``), a
TrainJob running without an admitted Workload suspended, and the Workload of a deleted TrainJob released.
"""

from __future__ import annotations

import base64
import copy
import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx2
import yaml

from .. import _decision as d
from .. import _names as n
from .._api import Obj
from .._identity import RecordView, record_name
from .._kube import Kube
from .._kueue import WorkloadView
from .._trainer import TrainJobView, labels_entry, patch_entries, patch_pod_labels, runtime_jobs
from .._views import JobSetView, JobView, NodeView, PodView
from ..testing import ApiFailure, Binding, FakeCluster, Policy
from ..testing._rbac import SHIPPED_RBAC, Attributes, Identity
from ..testing._server import REQUESTER, requester

__all__ = ["keeper_pass"]
"""Public: ``keeper_pass``, the documented way for a plain-mode test to run the controller's keeper (it needs the
``controller`` extra, as importing this module does); ``FakeKueue`` is dispatch's own tests' stand-in."""

KUEUE = n.KUEUE_GROUP
TRAINER = n.TRAINER_GROUP
KUEUE_MANAGER = "kueue.x-k8s.io/manager"
T0 = "2026-01-01T00:00:00Z"


def keeper_pass(cluster: FakeCluster, namespace: str | None = None, *, settle: bool = True) -> dict[str, str]:
    """One pass of the controller's finalizer keeper (the shipped ``dispatch-controller`` role) over the
    pods of ``namespace`` (default: every namespace), then (``settle``) one settle: what an installed
    controller does by itself. dispatch's pod finalizer is freed by the controller alone (the writer role
    may not patch pods), so a plain-mode test with no controller running calls this where a pod's end is
    proven. Returns, per ``namespace/pod``, what the keeper did (the proof, ``unproven``, ``deleted``, ...)."""
    import asyncio

    from .. import _kube as k
    from ._finalizers import FinalizerKeeper
    from ._metrics import Metrics

    async def go() -> dict[str, str]:
        kube = k.Kube.connect(namespace=namespace or cluster.namespace,
                              transport=cluster.transport("dispatch-controller"))
        keeper = FinalizerKeeper(kube, Metrics.create())
        try:
            keeper.list_pods([p for p in cluster.server.objects("", "pods")
                              if namespace is None or (p.get("metadata") or {}).get("namespace") == namespace])
            for etype, node in cluster.server.events("", "nodes"):  # as its Node informer saw them
                keeper.on_node(etype, node)
            return {key: await keeper.release(key) for key in sorted(keeper.signatures)}
        finally:
            await kube.aclose()

    done = asyncio.run(go())
    if settle:
        cluster.settle()
    return done


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
                 cluster_queue: str = "cq-dispatch", manage_jobs_without_queue_name: bool = False) -> None:
        self.cluster = cluster
        self.manage_jobs_without_queue_name = manage_jobs_without_queue_name
        """Kueue's ``manageJobsWithoutQueueName``: ``reconcile_jobs`` also takes TrainJobs without the label
        (into this fake's one queue, as Kueue's default LocalQueue would)."""
        self.server = cluster.server
        self.check = check
        self.queue = queue
        self.cluster_queue = cluster_queue
        self.admitted: list[tuple[str, dict[str, str]]] = []
        self.refused: list[str] = []
        """Each start of a TrainJob the API server refused (a webhook); Kueue tries again on its next pass."""
        self.active: Callable[[str, str], bool] = self._jobset_active
        """(namespace, TrainJob) -> whether the job still reports an active Job (what an eviction waits for)."""

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
        if not any(p.get("manager") == KUEUE_MANAGER for p in patch_entries(tj)):
            def webhook(obj: Obj) -> None:
                obj["spec"].setdefault("runtimePatches", []).append(labels_entry(KUEUE_MANAGER, {}))
            self.server.update(TRAINER, "trainjobs", ns, trainjob, webhook, status=False)
        if pod_sets is None:
            ref = tj["spec"].get("runtimeRef") or {}
            runtime = self.server.get(TRAINER, "clustertrainingruntimes", "", ref.get("name", ""))
            pod_sets = runtime_jobs(runtime or {}) or ["node"]
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
        for patch in patch_entries(trainjob):
            if patch.get("manager") == n.PATCH_MANAGER:
                return patch_pod_labels(patch).get(pod_set, {})
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
            if wl["metadata"].get("deletionTimestamp") or \
                    self.server.get(TRAINER, "trainjobs", ns, tj_name) is None:
                continue  # its TrainJob is gone: reconcile_jobs releases it
            if _cond(wl, "Finished"):
                continue  # Kueue never admits a finished Workload again
            tj = self.server.get(TRAINER, "trainjobs", ns, tj_name)
            ended = next((c for c in ((tj or {}).get("status") or {}).get("conditions") or []
                          if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"), None)
            if ended is not None:
                # the job reports finished (a TrainJob's Complete or Failed, whatever wrote it): Kueue declares
                # the Workload finished (seen with Kueue v0.19.2, tests/contract/test_trainer_status.py)
                def finished(obj: Obj, ended: Obj = ended) -> None:
                    _set(obj, "Finished", True, "Succeeded" if ended["type"] == "Complete" else "Failed")
                    for c in obj["status"]["conditions"]:
                        if c["type"] == "Finished":
                            c["message"] = str(ended.get("message") or "")
                self.server.update(KUEUE, "workloads", ns, name, finished, status=True)
                continue
            if _cond(wl, "Evicted"):
                self._finish_eviction(wl, ns, tj_name)
                continue
            if wl["spec"].get("active") is False and _cond(wl, "Admitted"):
                self.evict(name, ns, reason="InactiveWorkload")  # deactivated while admitted: Kueue evicts
                continue
            checks = wl["status"].get("admissionChecks") or []
            if _cond(wl, "Admitted"):
                tj = self.server.get(TRAINER, "trainjobs", ns, tj_name)
                if tj is not None and tj["spec"].get("suspend"):
                    self._start_job(wl, ns, tj_name, checks)  # a start refused last time is tried again
                continue
            if not _cond(wl, "QuotaReserved") or wl["spec"].get("active") is False:
                continue
            if not all(c.get("state") == "Ready" for c in checks):
                continue
            self._start(wl, ns, name, tj_name, checks)

    def _start(self, wl: Obj, ns: str, name: str, tj_name: str, checks: list[Obj]) -> None:
        """Admit: the Workload's Admitted condition first (Kueue's workload controller), then the job
        reconciler's start of the TrainJob (``_start_job``)."""
        def admitted(obj: Obj) -> None:
            _set(obj, "Admitted", True, "Admitted")
        self.server.update(KUEUE, "workloads", ns, name, admitted, status=True)
        merged: dict[str, str] = {}
        for v in self._pod_set_labels(checks).values():
            merged.update(v)
        self.admitted.append((name, merged))
        self._start_job(wl, ns, tj_name, checks)

    @staticmethod
    def _pod_set_labels(checks: list[Obj]) -> dict[str, dict[str, str]]:
        labels: dict[str, dict[str, str]] = {}
        for c in checks:
            for upd in c.get("podSetUpdates") or []:
                labels.setdefault(upd["name"], {}).update(upd.get("labels") or {})
        return labels

    def _start_job(self, wl: Obj, ns: str, tj_name: str, checks: list[Obj]) -> None:
        """Merge the checks' ``podSetUpdates`` labels into Kueue's runtime patch entry, then unsuspend; a
        write the API server refuses (a webhook) is tried again on a later pass, as Kueue retries."""
        labels = self._pod_set_labels(checks)

        def patch(obj: Obj) -> None:
            for p in obj["spec"].get("runtimePatches") or []:
                if p.get("manager") == KUEUE_MANAGER:
                    p.update(labels_entry(KUEUE_MANAGER, {ps["name"]: labels.get(ps["name"], {})
                                                          for ps in wl["spec"]["podSets"]}))

        def unsuspend(obj: Obj) -> None:
            obj["spec"]["suspend"] = False

        try:
            self.server.update(TRAINER, "trainjobs", ns, tj_name, patch, status=False)
            self.server.update(TRAINER, "trainjobs", ns, tj_name, unsuspend, status=False)
        except ApiFailure as exc:
            self.refused.append(exc.message)

    def reconcile_jobs(self, namespace: str | None = None) -> list[str]:
        """One pass of Kueue's job reconciler over TrainJobs; returns the Workloads it created.

        The Workload of a TrainJob that is gone loses Kueue's finalizer (and goes); a TrainJob Kueue
        manages and has no Workload for gets one (suspended first if it runs: Kueue stops a job it did not
        admit); a TrainJob that runs while its Workload is not admitted is suspended. Writes the cluster
        refuses (Trainer's webhook while a JobSet is still active) are left for the next pass.
        """
        ns = namespace or self.cluster.namespace
        trainjobs = {t["metadata"]["uid"]: t for t in self.server.objects(TRAINER, "trainjobs", ns)}
        owned: dict[str, Obj] = {}
        for wl in self.server.objects(KUEUE, "workloads", ns):
            uid = (wl["metadata"].get("labels") or {}).get(n.KUEUE_JOB_UID_LABEL, "")
            if uid in trainjobs:
                owned[uid] = wl
                continue

            def release(obj: Obj) -> None:
                obj["metadata"]["finalizers"] = []
            try:
                self.server.update(KUEUE, "workloads", ns, wl["metadata"]["name"], release, status=None)
                if self.server.get(KUEUE, "workloads", ns, wl["metadata"]["name"]) is not None:
                    self.server.delete(KUEUE, "workloads", ns, wl["metadata"]["name"])
            except ApiFailure:
                pass
        created: list[str] = []
        for uid, tj in trainjobs.items():
            if tj["metadata"].get("deletionTimestamp"):
                continue
            name = tj["metadata"]["name"]
            labelled = n.KUEUE_QUEUE_LABEL in (tj["metadata"].get("labels") or {})
            mine = owned.get(uid)
            if mine is None and not (labelled or self.manage_jobs_without_queue_name):
                continue
            if mine is None and (_cond(tj, "Complete") or _cond(tj, "Failed")):
                continue  # a job that reports finished gets no Workload (Kueue v0.19.2's reconciler, step 3)
            admitted = mine is not None and _cond(mine, "Admitted") and not _cond(mine, "Evicted")
            try:
                if not tj["spec"].get("suspend") and not admitted:
                    def stop(obj: Obj) -> None:
                        obj["spec"]["suspend"] = True
                    self.server.update(TRAINER, "trainjobs", ns, name, stop, status=False)
                if mine is None and self.server.get(KUEUE, "workloads", ns, self.workload_name(name)) is None:
                    created.append(self.workload_for(name, namespace=ns))
            except ApiFailure:
                pass
        return created

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

    def _jobset_active(self, ns: str, tj_name: str) -> bool:
        js = self.server.get(n.JOBSET_GROUP, "jobsets", ns, tj_name)
        return js is not None and any(int(rj.get("active") or 0) > 0
                                      for rj in (js.get("status") or {}).get("replicatedJobsStatus") or [])

    def _finish_eviction(self, wl: Obj, ns: str, tj_name: str) -> None:
        """Once JobSet reports no active Job (Terminating pods do not count), release and re-reserve."""
        if self.active(ns, tj_name):
            return

        def clear(obj: Obj) -> None:
            for p in obj["spec"].get("runtimePatches") or []:
                if p.get("manager") == KUEUE_MANAGER:
                    p.update(labels_entry(KUEUE_MANAGER, {}))
        self.server.update(TRAINER, "trainjobs", ns, tj_name, clear, status=False)

        def requeue(obj: Obj) -> None:
            _set(obj, "Evicted", False, "QuotaReserved")
            _set(obj, "QuotaReserved", True, "QuotaReserved")
            _set(obj, "Requeued", True, "Preempted")
        self.server.update(KUEUE, "workloads", ns, wl["metadata"]["name"], requeue, status=True)


# ------------------------------------------------------------------ MultiKueue

MK_CHECK = "multikueue"
ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
PREBUILT_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
WORKER_RBAC = Path(__file__).resolve().parents[3] / "deploy" / "worker" / "rbac.yaml"
MANAGER_RBAC = Path(__file__).resolve().parents[3] / "deploy" / "multikueue" / "rbac.yaml"


@functools.cache
def manager_policy() -> Policy:
    """The shipped roles of a MultiKueue manager: ``deploy/base`` and ``deploy/multikueue`` together (parsed
    once per test run, as ``shipped_policy``: the manifests do not change under a test)."""
    return Policy.load(SHIPPED_RBAC.read_text() + "\n---\n" + MANAGER_RBAC.read_text())


@functools.cache
def worker_policy() -> Policy:
    """The read-only role a worker grants the manager's dispatch (``deploy/worker``), parsed once."""
    return Policy.load(WORKER_RBAC)


_ALL = ["create", "update", "patch", "delete", "get", "list", "watch"]
KUEUE_MULTIKUEUE_ROLE: Obj = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "multikueue-sa"},
    "rules": [
        {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs"], "verbs": _ALL},
        {"apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs/status"], "verbs": ["get"]},
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": _ALL},
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets/status"], "verbs": ["get"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": _ALL},
        {"apiGroups": ["batch"], "resources": ["jobs/status"], "verbs": ["get"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"],
         "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"], "verbs": ["get", "patch", "update"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues", "localqueues"],
         "verbs": ["get", "list", "watch"]},
    ]}
"""What Kueue's MultiKueue needs of a worker (not dispatch's to ship: Kueue's e2e rules for the integrations the
testbed enables), bound to the service account the manager's Secret for that worker holds."""
MULTIKUEUE_SA = ("kueue-system", "multikueue-sa")


@functools.cache
def multikueue_policy() -> Policy:
    """The roles MultiKueue's identity holds in a worker installed as docs/how-to/multikueue.md says: Kueue's own
    (``KUEUE_MULTIKUEUE_ROLE``) and ``deploy/worker`` (the reader, and ``create`` on ``multikueuecopies``), all
    bound to ``kueue-system/multikueue-sa``."""
    ns, sa = MULTIKUEUE_SA
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "multikueue-sa"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "multikueue-sa"},
               "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}
    return Policy.load(WORKER_RBAC.read_text() + "\n---\n" + yaml.safe_dump(KUEUE_MULTIKUEUE_ROLE) + "\n---\n"
                       + yaml.safe_dump(binding))


def multikueue_identity() -> Identity:
    """MultiKueue's identity in a worker (``kueue-system/multikueue-sa`` and every role bound to it)."""
    return multikueue_policy().identity(["multikueue-sa"])


MANAGER_ROLES: tuple[str | Binding, ...] = (
    "dispatch-controller", Binding("dispatch-multikueue-workers", "kueue-system", "Role"))


class FakeMultiKueue:
    """Kueue's MultiKueue on fake clusters: a manager and its workers, stepped by hand (``sync``).

    What it plays is what Kueue v0.17.1+ does (read in its source; the fleet testbed checks it):
    * a manager Workload is dispatched only once every check but MultiKueue's is Ready (v0.17.0 lacks that
      gate: dispatch needs v0.17.1 or later); MultiKueue creates in the worker, as its own identity there
      (``multikueue_identity``: Kueue's rules and ``deploy/worker``'s), the remote Workload (the manager's
      name, MultiKueue's origin label) and the remote TrainJob, suspended: a copy of the manager's labels,
      annotations and spec at that moment, without ``managedBy`` and without Kueue's runtime patch entry, so
      dispatch's entry (A) goes with it, plus the origin and prebuilt-workload labels; the worker's own Kueue
      adopts the Workload (owner: the copy), admits it at once (its own queueing is not modelled), writes its
      pod set entry and unsuspends the copy, retrying on its next pass a start a webhook refused
      (``worker_kueue``); MultiKueue's check turns Ready with ``status.clusterName``;
    * an eviction on the manager deactivates the remote Workload (the worker's Kueue evicts it and suspends
      the copy), releases quota once the copy reports no active Job (Terminating pods do not count), then
      deletes the remote Workload and the copy with background propagation and forgets the cluster
      (``clusterName`` is cleared); the next dispatch may go anywhere at once;
    * remote objects that could not be deleted because their worker was lost are deleted once it answers
      again (Kueue retries the removal on each pass, and its garbage collector deletes the copies whose
      manager Workload is gone, when their worker is connected);
    * a lost worker (``lose``) answers nothing and its MultiKueueCluster turns Active=False (its own
      controllers and kubelets go on: only the manager cannot reach it);
      ``worker_lost_timeout`` re-queues a Workload whose worker is lost and dispatches it elsewhere while
      the lost worker's pods may still run (the hazard; the fleet testbed saw Kueue v0.19.2 re-queue a
      TrainJob's Workload about 30 s after its worker's API server stopped, with workerLostTimeout 20 s).
    The order of workers tried is ``order`` (Kueue's AllAtOnce takes whichever admits first).
    """

    def __init__(self, manager: FakeCluster, workers: dict[str, FakeCluster], *, check: str = "dispatch",
                 kueue_namespace: str = "kueue-system", release_lost: bool = True) -> None:
        self.manager = manager
        self.workers = workers
        self.kueue = FakeKueue(manager, check=check)
        self.kueue.active = self._copy_active
        self.kueue_namespace = kueue_namespace
        self.release_lost = release_lost
        """Whether the manager releases a Workload evicted while its worker is lost: re-dispatch while the lost
        worker may run on. Kueue v0.19.2 did on the fleet testbed; False plays what its code suggested for a
        TrainJob (the status copied from the lost worker still shows an active Job, and Stop waits for it) and
        what Kueue v0.17.0 did there after an eviction (it kept the manager's quota for good)."""
        self.order = sorted(workers)
        self.lost: set[str] = set()
        self.placed: dict[tuple[str, str], str] = {}
        """(namespace, Workload) -> the worker holding its copy (until MultiKueue deleted that copy)."""
        self.dispatched: list[tuple[str, str, str]] = []
        """(Workload, worker, the A its copy carries), in order."""
        self.copies: dict[tuple[str, str], str] = {}
        """(worker, uid of a copy MultiKueue created there) -> the A that copy carries."""
        self.removing: set[tuple[str, str, str, str]] = set()
        """(namespace, Workload, TrainJob, worker): remote objects MultiKueue could not delete yet (the worker did
        not answer); retried on every pass until the worker answers."""
        self.identity = multikueue_identity()
        """Who MultiKueue writes each worker as: ``kueue-system/multikueue-sa``, holding what a worker installed
        as the docs say binds to it (so the ``dispatch-identity`` policy lets it, and only it, create copies)."""
        self.refused: list[tuple[str, str]] = []
        """(worker, message): each write of MultiKueue or of a worker's Kueue a worker's API server refused."""
        self._clock = 0

    def _now(self) -> str:
        self._clock += 1
        return f"2026-01-01T00:{self._clock // 60:02d}:{self._clock % 60:02d}Z"

    def install(self) -> None:
        self.kueue.install()
        self.manager.server.create(KUEUE, "admissionchecks", "", {
            "metadata": {"name": MK_CHECK}, "spec": {"controllerName": "kueue.x-k8s.io/multikueue"}})
        for name in self.workers:
            kubeconfig = yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": name,
                "clusters": [{"name": name, "cluster": {"server": f"https://{name}.fake.invalid"}}],
                "users": [{"name": name, "user": {"token": f"token-{name}"}}],
                "contexts": [{"name": name, "context": {"cluster": name, "user": name}}]})
            self.manager.server.create("", "secrets", self.kueue_namespace, {
                "metadata": {"name": f"{name}-kubeconfig"},
                "data": {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()}})
            self.manager.server.create(KUEUE, "multikueueclusters", "", {
                "metadata": {"name": name},
                "spec": {"clusterSource": {"kubeConfig": {"location": f"{name}-kubeconfig",
                                                          "locationType": "Secret"}}},
                "status": {"conditions": [{"type": "Active", "status": "True", "reason": "Active",
                                           "message": "Connected", "lastTransitionTime": self._now()}]}})

    def connect(self, text: str, source: str, timeout: float) -> Kube:
        """The Fleet's way to a worker: the worker's fake API server, as the shipped worker reader role."""
        server = yaml.safe_load(text)["clusters"][0]["cluster"]["server"]
        name = server.removeprefix("https://").removesuffix(".fake.invalid")
        worker = self.workers[name]
        inner = worker.transport("dispatch-worker-reader", rbac=worker_policy())

        async def handle(request: httpx2.Request) -> httpx2.Response:
            if name in self.lost:
                raise httpx2.ConnectError(f"connection to {server} refused", request=request)
            return await inner.handle_async_request(request)

        return Kube.connect(namespace="default", transport=httpx2.MockTransport(handle))

    def workload_for(self, trainjob: str, namespace: str | None = None) -> str:
        """Kueue's webhook (``managedBy`` for a queue whose ClusterQueue has MultiKueue's check) and the
        manager's Workload, with MultiKueue's check and dispatch's, both Pending."""
        ns = namespace or self.manager.namespace

        def managed(obj: Obj) -> None:
            obj["spec"]["managedBy"] = "kueue.x-k8s.io/multikueue"
        self.manager.server.update(TRAINER, "trainjobs", ns, trainjob, managed, status=False)
        return self.kueue.workload_for(trainjob, namespace=ns, other_checks=(MK_CHECK,))

    def _active(self, name: str, up: bool) -> None:
        def mutate(obj: Obj) -> None:
            obj["status"]["conditions"] = [{
                "type": "Active", "status": "True" if up else "False",
                "reason": "Active" if up else "ClientConnectionFailed",
                "message": "Connected" if up else "the worker's API server does not answer",
                "lastTransitionTime": self._now()}]
        self.manager.server.update(KUEUE, "multikueueclusters", "", name, mutate, status=True)

    def lose(self, name: str) -> None:
        """A partition: the worker answers nothing (its processes run on), Kueue marks it Active=False."""
        self.lost.add(name)
        self._active(name, False)

    def heal(self, name: str) -> None:
        self.lost.discard(name)
        self._active(name, True)

    def worker_lost_timeout(self) -> list[str]:
        """``workerLostTimeout`` passed: each Workload running in a lost worker gets MultiKueue's check Retry,
        which evicts it on the manager; its copy cannot be deleted until the worker answers again."""
        out = []
        for (ns, wl), worker in sorted(self.placed.items()):
            if worker in self.lost:
                self.kueue.evict(wl, ns, reason="AdmissionCheck")
                out.append(wl)
        return out

    def _copy_active(self, ns: str, trainjob: str) -> bool:
        """The manager's TrainJob status is the copy's: active while the copy runs or its JobSet reports an
        active Job (Terminating pods do not count); stale (still active) while its worker is lost."""
        worker = next((w for (wns, wl), w in self.placed.items() if wns == ns
                       and self.kueue.workload_name(trainjob) == wl), None)
        if worker is None:
            return False
        if worker in self.lost:
            return not self.release_lost
        remote = self.workers[worker]
        copy_ = remote.server.get(TRAINER, "trainjobs", ns, trainjob)
        if copy_ is not None and not (copy_.get("spec") or {}).get("suspend") and \
                not copy_["metadata"].get("deletionTimestamp"):
            return True
        js = remote.server.get(n.JOBSET_GROUP, "jobsets", ns, trainjob)
        return js is not None and any(int(rj.get("active") or 0) > 0 for rj in
                                      (js.get("status") or {}).get("replicatedJobsStatus") or [])

    def sync(self) -> None:
        """One pass of MultiKueue's workload reconciler over the manager's Workloads, then the manager's
        Kueue (which releases an evicted Workload once its copy reports no active Job, and admits a Workload
        whose checks are all Ready)."""
        self._retry_removals()
        self._collect_garbage()
        for reachable in sorted(self.workers):
            if reachable not in self.lost:
                self.worker_kueue(reachable)
        for wl in self.manager.server.objects(KUEUE, "workloads"):
            ns, name = wl["metadata"]["namespace"], wl["metadata"]["name"]
            owner = (wl["metadata"].get("ownerReferences") or [{}])[0].get("name", "")
            tj = self.manager.server.get(TRAINER, "trainjobs", ns, owner)
            if tj is None or (tj.get("spec") or {}).get("managedBy") != "kueue.x-k8s.io/multikueue":
                continue
            checks = {c["name"]: c for c in (wl.get("status") or {}).get("admissionChecks") or []}
            if MK_CHECK not in checks:
                continue
            worker = self.placed.get((ns, name))
            if _cond(wl, "Evicted"):
                self._evicted(wl, ns, name, owner, worker)
            elif worker is not None and checks[MK_CHECK].get("state") != "Ready":
                self._remove_copy(ns, name, owner, worker)  # released: MultiKueue deletes the remote objects
            elif (worker is None and _cond(wl, "QuotaReserved") and checks[MK_CHECK].get("state") == "Pending"
                  # a deactivated Workload has no quota in Kueue (nothing is dispatched without it: MultiKueue
                  # reconciler, gate 1, workload.go:341-351 @v0.17.0); this fake's Kueue re-reserves it
                  and (wl.get("spec") or {}).get("active") is not False
                  and all(c.get("state") == "Ready" for k, c in checks.items() if k != MK_CHECK)):
                self._dispatch(tj, ns, name)
        self.kueue.sync()

    def _evicted(self, wl: Obj, ns: str, name: str, trainjob: str, worker: str | None) -> None:
        """Kueue's eviction forgets where the Workload ran; MultiKueue deactivates the remote Workload, so the
        worker's Kueue evicts it and suspends the copy."""
        if (wl.get("status") or {}).get("clusterName"):
            def forget(obj: Obj) -> None:
                obj["status"].pop("clusterName", None)
                obj["status"].pop("nominatedClusterNames", None)
            self.manager.server.update(KUEUE, "workloads", ns, name, forget, status=True)
        if worker is None or worker in self.lost:
            return
        remote = self.workers[worker]
        remote_wl = remote.server.get(KUEUE, "workloads", ns, name)
        if remote_wl is not None and remote_wl["spec"].get("active") is not False:
            def deactivate(obj: Obj) -> None:
                obj["spec"]["active"] = False
            self._write(worker, "update", KUEUE, "workloads", ns, name, mutate=deactivate)
        self.worker_kueue(worker)

    def _remove_copy(self, ns: str, name: str, trainjob: str, worker: str) -> None:
        if worker not in self.lost:
            self._delete_copy(ns, trainjob, worker)
        else:
            # A lost worker's copy stays there, running on; Kueue retries the removal on later passes and it
            # happens once the worker answers (RemoveRemoteObjects in step 2 of reconcileGroup, retried every
            # workerLostTimeout: workload.go:389-392 @v0.19.2). Kueue's own GC would not do it: it deletes
            # only copies whose manager Workload is missing or being deleted (runGC,
            # multikueuecluster.go:280-331 @v0.17.0).
            self.removing.add((ns, name, trainjob, worker))
        del self.placed[(ns, name)]

    def _delete_copy(self, ns: str, trainjob: str, worker: str) -> None:
        remote = self.workers[worker]
        copy_ = remote.server.get(TRAINER, "trainjobs", ns, trainjob)
        if copy_ is None or not (copy_["metadata"].get("labels") or {}).get(ORIGIN_LABEL):
            return
        prebuilt = (copy_["metadata"].get("labels") or {}).get(PREBUILT_LABEL, "")
        if prebuilt and remote.server.get(KUEUE, "workloads", ns, prebuilt) is not None:
            self._write(worker, "delete", KUEUE, "workloads", ns, prebuilt)
        if not copy_["metadata"].get("deletionTimestamp"):
            # no propagation option: the API server's default, background, for a custom resource
            # (trainjob_multikueue_adapter.go:88-93 @v0.17.0): the worker's GC deletes its JobSet later
            self._write(worker, "delete", TRAINER, "trainjobs", ns, trainjob)

    def _retry_removals(self) -> None:
        for ns, name, trainjob, worker in sorted(self.removing):
            if worker in self.lost:
                continue
            if self.placed.get((ns, name)) != worker:
                self._delete_copy(ns, trainjob, worker)
            self.removing.discard((ns, name, trainjob, worker))

    def _collect_garbage(self) -> None:
        """Kueue's per-worker GC (``gcInterval``): a copy in a connected worker whose manager Workload is
        missing or being deleted goes (multikueuecluster.go:280-331 @v0.17.0)."""
        for worker, remote in sorted(self.workers.items()):
            if worker in self.lost:
                continue
            for copy_ in remote.server.objects(TRAINER, "trainjobs"):
                labels = copy_["metadata"].get("labels") or {}
                if not labels.get(ORIGIN_LABEL) or copy_["metadata"].get("deletionTimestamp"):
                    continue
                ns = copy_["metadata"]["namespace"]
                wl = self.manager.server.get(KUEUE, "workloads", ns, labels.get(PREBUILT_LABEL, ""))
                if wl is None or wl["metadata"].get("deletionTimestamp"):
                    self._delete_copy(ns, copy_["metadata"]["name"], worker)

    def _write(self, worker: str, verb: str, group: str, plural: str, ns: str, name: str, *, body: Obj | None = None,
               mutate: Callable[[Obj], None] | None = None) -> Obj | None:
        """One write of MultiKueue in ``worker`` (``create`` ``body``, ``update`` by ``mutate``, or ``delete``), as
        its identity there: the worker's RBAC decides it (a denial is recorded in that worker's ``denied``, as a
        request's 403 is) and its admission checks see the requester. Returns the object written, or None (a
        refusal is recorded in ``refused``)."""
        version = n.TRAINER_VERSION if group == TRAINER else "v1beta2"
        server = self.workers[worker].server
        if not self.identity.allows(Attributes(verb, "", True, group, version, plural, "", ns, name)):
            server.denied.append((self.identity.user, verb, f"{group}/{plural}/{ns}/{name}"))
            return None
        token = REQUESTER.set(self.identity)
        try:
            if verb == "create":
                assert body is not None
                return server.create(group, plural, ns, body)
            if verb == "delete":
                return server.delete(group, plural, ns, name)
            assert mutate is not None
            return server.update(group, plural, ns, name, mutate, status=False)
        except ApiFailure as exc:
            self.refused.append((worker, exc.message))
            return None
        finally:
            REQUESTER.reset(token)

    def worker_kueue(self, worker: str) -> None:
        """One pass of the worker's own Kueue over MultiKueue's copies there: a Workload MultiKueue deactivated is
        evicted and its copy suspended; a suspended copy whose Workload (by its prebuilt name) is active and not
        finished is adopted (the Workload's owner becomes the copy), admitted, given Kueue's pod set entry and
        unsuspended. A write the worker refuses (dispatch's guard there) is tried again on the next pass."""
        remote = self.workers[worker]
        for copy_ in remote.server.objects(TRAINER, "trainjobs"):
            meta = copy_["metadata"]
            prebuilt = (meta.get("labels") or {}).get(PREBUILT_LABEL, "")
            if not (meta.get("labels") or {}).get(ORIGIN_LABEL) or not prebuilt or meta.get("deletionTimestamp"):
                continue
            ns, trainjob = meta["namespace"], meta["name"]
            wl = remote.server.get(KUEUE, "workloads", ns, prebuilt)
            if wl is None or wl["metadata"].get("deletionTimestamp"):
                continue
            try:
                if wl["spec"].get("active") is False:
                    self._worker_evict(remote, ns, prebuilt, trainjob, copy_)
                elif copy_["spec"].get("suspend") and not _cond(wl, "Evicted") and not _cond(wl, "Finished"):
                    self._worker_start(remote, ns, prebuilt, copy_)
            except ApiFailure as exc:
                self.refused.append((worker, exc.message))

    @staticmethod
    def _worker_evict(remote: FakeCluster, ns: str, wl: str, trainjob: str, copy_: Obj) -> None:
        if not copy_["spec"].get("suspend"):
            def suspend(obj: Obj) -> None:
                obj["spec"]["suspend"] = True
            remote.server.update(TRAINER, "trainjobs", ns, trainjob, suspend, status=False)
        current = remote.server.get(KUEUE, "workloads", ns, wl)
        if current is not None and _cond(current, "Admitted"):
            def evicted(obj: Obj) -> None:
                _set(obj, "Evicted", True, "InactiveWorkload")
                _set(obj, "Admitted", False, "NoReservation")
            remote.server.update(KUEUE, "workloads", ns, wl, evicted, status=True)

    @staticmethod
    def _worker_start(remote: FakeCluster, ns: str, wl: str, copy_: Obj) -> None:
        meta = copy_["metadata"]
        uid, trainjob = meta["uid"], meta["name"]
        current = remote.server.get(KUEUE, "workloads", ns, wl)
        assert current is not None
        owner = (current["metadata"].get("ownerReferences") or [{}])[0]
        if owner.get("uid") != uid:
            if owner.get("uid"):
                return  # the Workload of another TrainJob of that name: Kueue does not take it over

            def adopt(obj: Obj) -> None:
                obj["metadata"]["ownerReferences"] = [{
                    "apiVersion": f"{TRAINER}/{n.TRAINER_VERSION}", "kind": "TrainJob", "name": trainjob,
                    "uid": uid, "controller": True, "blockOwnerDeletion": True}]
                obj["metadata"].setdefault("labels", {})[n.KUEUE_JOB_UID_LABEL] = uid
            remote.server.update(KUEUE, "workloads", ns, wl, adopt, status=None)
        if not _cond(current, "Admitted"):
            def admitted(obj: Obj) -> None:
                _set(obj, "QuotaReserved", True, "QuotaReserved")
                _set(obj, "Admitted", True, "Admitted")
            remote.server.update(KUEUE, "workloads", ns, wl, admitted, status=True)
        if not any(p.get("manager") == KUEUE_MANAGER for p in patch_entries(copy_)):
            pod_sets = [ps["name"] for ps in current["spec"].get("podSets") or []]

            def pod_set_entry(obj: Obj) -> None:
                obj["spec"].setdefault("runtimePatches", []).append(
                    labels_entry(KUEUE_MANAGER, {ps: {} for ps in pod_sets}))
            remote.server.update(TRAINER, "trainjobs", ns, trainjob, pod_set_entry, status=False)

        def unsuspend(obj: Obj) -> None:
            obj["spec"]["suspend"] = False
        remote.server.update(TRAINER, "trainjobs", ns, trainjob, unsuspend, status=False)

    def _dispatch(self, tj: Obj, ns: str, name: str) -> None:
        for worker in self.order:
            if worker in self.lost:
                continue
            remote = self.workers[worker]
            if remote.server.get(TRAINER, "trainjobs", ns, tj["metadata"]["name"]) is not None:
                continue  # an old copy is still there (being deleted): its create would fail
            if remote.server.get(KUEUE, "workloads", ns, name) is not None:
                continue  # the old remote Workload is still there
            spec = copy.deepcopy(tj["spec"])
            spec.pop("managedBy", None)
            spec["runtimePatches"] = [p for p in spec.get("runtimePatches") or []
                                      if p.get("manager") != KUEUE_MANAGER]
            spec["suspend"] = True  # created suspended; the worker's own Kueue starts it (``worker_kueue``)
            meta = tj["metadata"]
            manager_wl = self.manager.server.get(KUEUE, "workloads", ns, name) or {"spec": {}}
            if self._write(worker, "create", KUEUE, "workloads", ns, name, body={
                    "metadata": {"name": name, "labels": {ORIGIN_LABEL: "multikueue"}},
                    "spec": {"queueName": manager_wl["spec"].get("queueName", ""), "active": True,
                             "podSets": copy.deepcopy(manager_wl["spec"].get("podSets") or [])}}) is None:
                continue
            made = self._write(worker, "create", TRAINER, "trainjobs", ns, meta["name"], body={
                "apiVersion": tj.get("apiVersion"), "kind": "TrainJob",
                "metadata": {"name": meta["name"],
                             "labels": {**(meta.get("labels") or {}), ORIGIN_LABEL: "multikueue",
                                        PREBUILT_LABEL: name},
                             "annotations": dict(meta.get("annotations") or {})},
                "spec": spec})
            if made is None:
                self._write(worker, "delete", KUEUE, "workloads", ns, name)
                continue
            self.placed[(ns, name)] = worker
            a = (meta.get("annotations") or {}).get(n.ANNOTATION_ADMISSION, "")
            self.dispatched.append((name, worker, a))
            self.copies[(worker, made["metadata"]["uid"])] = a
            self.worker_kueue(worker)

            def ready(obj: Obj, worker: str = worker) -> None:
                obj["status"]["clusterName"] = worker
                for c in obj["status"].get("admissionChecks") or []:
                    if c["name"] == MK_CHECK:
                        c.update(state="Ready", message=f"The workload got reservation on \"{worker}\"")
            self.manager.server.update(KUEUE, "workloads", ns, name, ready, status=True)
            return


# ------------------------------------------------------------------ dispatch's guard webhook


class FakeGuard:
    """dispatch's guard (the validating webhook on TrainJob writes) on the fake API server.

    Each TrainJob create or update is judged by the guard's own decision (``_decision.guard``) over the
    fake's objects at the moment of the write: the same inputs the guard's server reads (the object's JobSet,
    child Jobs and pods by both selections, their Nodes, the identity record, the Workload that owns the
    TrainJob). The real guard's read is consistent but precedes the write by a little; here it is exact,
    so a test of the guard's decision cannot pass by luck of timing. ``enforce`` says, per write, whether a
    denial refuses it (the webhook's ``failurePolicy: Fail``) or is only recorded in ``unenforced`` (to
    test what dispatch's own writers do without the webhook behind them); the ``dispatch-identity`` CEL
    policy (``_decision.identity_policy``) refuses in either case, as the API server enforces it itself.
    """

    def __init__(self, cluster: FakeCluster, *, enforce: Callable[[], bool] = lambda: True,
                 worker: bool = False, enforce_pods: Callable[[], bool] | None = None) -> None:
        self.cluster = cluster
        self.server = cluster.server
        self.enforce = enforce
        self.enforce_pods = enforce_pods or enforce
        """Per pod create, whether a denial refuses it (``enforce`` unless given): a test of what dispatch's own
        TrainJob writers do without the webhook may keep the pod webhook as deployed, since pods are created by the
        Job controller, not by those writers."""
        self.worker = worker
        """The controller's ``--multikueue-worker``: MultiKueue's copies are judged as copies."""
        self.denied: list[str] = []
        """Each denial that refused a write."""
        self.unenforced: list[str] = []
        """Each denial of a write ``enforce`` let through."""
        self.pod_denied: list[str] = []
        """Each denial that refused a pod create."""
        self.pod_unenforced: list[str] = []
        """Each denial of a pod create ``enforce`` let through."""
        self.allowed_starts = 0

    def install(self) -> None:
        """The guard as ``deploy/base/guard.yaml`` installs it: the webhook and CEL policy on TrainJobs, the
        webhook on pod creates, and the ``dispatch-pods`` policy."""
        self.server.add_admission("trainjobs", self._admit)
        self.server.add_admission("pods", self._admit_pod)
        self.cluster.install_pod_policy()

    def install_pod_webhook(self) -> None:
        """Only the webhook on pod creates: for a cluster whose TrainJob writes a test does not judge here (a
        MultiKueue worker of the fleet machine, whose own Kueue is not modelled), where the Job controller still
        starts a re-created Job's pod beside the old one's and only this webhook refuses it."""
        self.server.add_admission("pods", self._admit_pod)

    def _admit_pod(self, operation: str, old: Obj | None, new: Obj) -> str | None:
        """The webhook on pod creates (only a create starts a process; the CEL policy judges updates)."""
        if operation != "CREATE":
            return None
        denial = self.pod_decision(new)
        if denial is None:
            return None
        if self.enforce_pods():
            self.pod_denied.append(denial)
            return denial
        self.pod_unenforced.append(denial)
        return None

    def pod_decision(self, new: Obj) -> str | None:
        """The guard's answer to one pod create: the submission's pods and their Nodes at this moment."""
        view = PodView.from_obj(new)
        problem = d.pod_create_problem(view)  # as the real guard: on the pod alone, before any read
        if problem is not None or view.mirror or not view.job_id or not view.submission:
            return problem
        ns = str(new["metadata"].get("namespace") or self.cluster.namespace)
        pods = [p for p in map(PodView.from_obj, self.server.objects("", "pods", ns))
                if (p.job_id, p.submission) == (view.job_id, view.submission)]
        return d.pod_start_problem(view, pods, self._nodes(pods))

    def _nodes(self, pods: list[PodView]) -> dict[str, NodeView]:
        """The Nodes the pods that may run sit on, as ``Reader.nodes`` gets them."""
        nodes: dict[str, NodeView] = {}
        for pod in pods:
            if pod.node and pod.may_run and pod.node not in nodes:
                node = self.server.get("", "nodes", "", pod.node)
                nodes[pod.node] = NodeView.from_obj(node) if node is not None else NodeView.gone(pod.node)
        return nodes

    def _admit(self, operation: str, old: Obj | None, new: Obj) -> str | None:
        copier = copy_policy(operation, new)  # the dispatch-identity policy's authorizer rule: always in force
        if copier is not None:
            self.denied.append(copier)
            return copier
        denial = self.decision(operation, old, new)
        if denial is None:
            return None
        if self.enforce():
            self.denied.append(denial)
            return denial
        self.unenforced.append(denial)
        # The webhook's denial is only recorded, but the CEL policy beside it is the API server's own and
        # ships in every configuration (the chart keeps it with ``guard.enabled=false``): it still refuses.
        policy = d.identity_policy(operation, TrainJobView.from_obj(old) if old else None,
                                   TrainJobView.from_obj(new))
        if policy is not None:
            self.denied.append(policy)
        return policy

    def decision(self, operation: str, old: Obj | None, new: Obj) -> str | None:
        """The guard's answer to one write: the denial message, or None to allow."""
        new_view = TrainJobView.from_obj(new)
        old_view = TrainJobView.from_obj(old) if old else None
        if not (new_view.labelled or (old_view is not None and old_view.labelled)):
            return None
        if not d.starts_execution(operation, old_view, new_view) or not new_view.labelled:
            return d.guard(operation, old_view, new_view, None, None)
        ns = str(new["metadata"].get("namespace") or self.cluster.namespace)
        name = new_view.name
        pods = [PodView.from_obj(p) for p in self.server.objects("", "pods", ns)
                if (p["metadata"].get("labels") or {}).get(n.JOBSET_NAME_LABEL) == name
                or ((p["metadata"].get("labels") or {}).get(n.LABEL_JOB_ID) == new_view.job_id
                    and (p["metadata"].get("labels") or {}).get(n.LABEL_SUBMISSION) == new_view.submission)]
        nodes = self._nodes(pods)
        jobset = self.server.get(n.JOBSET_GROUP, "jobsets", ns, name)
        jobs = [JobView.from_obj(j) for j in self.server.objects("batch", "jobs", ns)
                if (j["metadata"].get("labels") or {}).get(n.JOBSET_NAME_LABEL) == name]
        ident = (new_view.job_id, new_view.submission)
        kin_sets = [v for v in map(JobSetView.from_obj, self.server.objects(n.JOBSET_GROUP, "jobsets", ns))
                    if (v.job_id, v.submission) == ident and v.name != name]
        kin_jobs = [v for v in map(JobView.from_obj, self.server.objects("batch", "jobs", ns))
                    if (v.job_id, v.submission) == ident and v.jobset_name != name]
        verdict = d.decide(name=name, job_id=new_view.job_id, submission=new_view.submission, pods=pods,
                           nodes=nodes, jobset=JobSetView.from_obj(jobset) if jobset is not None else None,
                           jobs=jobs, kin_jobsets=kin_sets, kin_jobs=kin_jobs)
        runtime = self.server.get(n.TRAINER_GROUP, "clustertrainingruntimes", "", new_view.runtime_name) \
            if new_view.runtime_kind == "ClusterTrainingRuntime" else \
            self.server.get(n.TRAINER_GROUP, "trainingruntimes", ns, new_view.runtime_name)
        runtime_jobs_now = (runtime_jobs(runtime) or None) if runtime is not None else None
        rec = self.server.get(n.DOMAIN, "submissionrecords", ns, record_name(new_view.job_id, new_view.submission))
        workload = None
        if operation == "UPDATE":
            uid = new_view.ref.uid
            if d.multikueue_copy(new_view, worker=self.worker):  # ``Reader.copy_workload``: by the prebuilt name
                prebuilt = new_view.labels.get(n.PREBUILT_WORKLOAD_LABEL) or new_view.prebuilt_workload
                got = self.server.get(KUEUE, "workloads", ns, prebuilt) if prebuilt else None
                view = WorkloadView.from_obj(got) if got is not None else None
                workload = view if view is not None and view.owner is not None and view.owner.uid == uid else None
            else:
                workload = next((WorkloadView.from_obj(w) for w in self.server.objects(KUEUE, "workloads", ns)
                                 if (w["metadata"].get("labels") or {}).get(n.KUEUE_JOB_UID_LABEL) == uid), None)
        denial = d.nonindexed_text(f"trainjob {name} cannot start", d.jobs_nonindexed(jobs, name)) or d.guard(
            operation, old_view, new_view, verdict, RecordView.from_obj(rec) if rec else None, workload,
            runtime_jobs_now, worker=self.worker)
        if denial is None:
            self.allowed_starts += 1
        return denial


def copy_policy(operation: str, new: Obj) -> str | None:
    """The ``dispatch-identity`` policy's authorizer rule on a TrainJob create (``deploy/base/guard.yaml``), worded
    as the API server words a policy's denial (None: allowed): a dispatch TrainJob carrying MultiKueue's origin
    label is created only by a requester the authorizer lets ``create`` ``multikueuecopies`` in its namespace.
    The test acting as admin and the cluster's own controllers (MultiKueue's fake) are unrestricted."""
    if operation != "CREATE":
        return None
    view = TrainJobView.from_obj(new)
    who = requester()
    verb, group, resource = d.COPY_PERMISSION
    namespace = str(new.get("metadata", {}).get("namespace") or "")
    allowed = who is None or who.allows(Attributes(verb, "", True, group, "v1alpha1", resource, "", namespace, ""))
    problem = d.copy_create_problem(view, allowed=allowed)
    if problem is None:
        return None
    return f"ValidatingAdmissionPolicy 'dispatch-identity' with binding 'dispatch-identity' denied request: {problem}"


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
