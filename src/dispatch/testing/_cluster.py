"""A test acting as the cluster: Trainer, JobSet, the Job controller, a scheduler, kubelets and PodGC.

``FakeCluster`` drives a ``FakeApiServer`` the way the real controllers drive a real one, one explicit
step at a time, so a test (or a hypothesis state machine) chooses the interleaving: a lagging JobSet,
a kubelet that has not yet confirmed a pod's termination, a frozen node, an operator's taint. It also
tracks the *processes* the pods stand for, which outlive their API objects when a node is lost, and
keeps the history the checker reads: no two executions of one submission may ever run at once.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx2

from .. import _decision as d
from .._api import Obj
from .._names import (
    ANNOTATION_ADMISSION,
    ANNOTATION_MARK_SEEN,
    JOB_INDEX_LABEL,
    JOBSET_NAME_LABEL,
    LABEL_ADMISSION,
    LABEL_JOB_ID,
    LABEL_SUBMISSION,
    OUT_OF_SERVICE_TAINT,
    REPLICATED_JOB_LABEL,
)
from .._trainer import patch_entries
from .._views import TERMINATED_BY_KUBELET, annotations_of, labels_of
from ._rbac import Attributes, Binding, Policy
from ._server import ApiFailure, FakeApiServer, _now_text, requester
from ._smp import PatchError, strategic_merge, trainer_patch

TRAINER = "trainer.kubeflow.org"
JOBSET = "jobset.x-k8s.io"


def _labels(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _cond(obj: Obj, ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def _set_cond(obj: Obj, ctype: str, status: bool, reason: str = "") -> None:
    conds = obj.setdefault("status", {}).setdefault("conditions", [])
    for c in conds:
        if c.get("type") == ctype:
            c["status"] = "True" if status else "False"
            c["reason"] = reason
            return
    conds.append({"type": ctype, "status": "True" if status else "False", "reason": reason,
                  "lastTransitionTime": "2026-01-01T00:00:00Z", "message": ""})


def _number(text: str | None) -> int | None:
    return int(text) if text and text.isascii() and text.isdigit() and len(text) <= 18 else None


COMPLETION = "batch.kubernetes.io/job-completion-index"
JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
"""The Job controller's finalizer on every pod it makes, until it has counted the pod (``FakeCluster.job_tracking``)."""


@dataclass
class Process:
    """What a running pod stands for: a process that ends only when something proves it ended."""

    pod: str
    uid: str
    namespace: str
    node: str
    obj_name: str
    job_id: str
    submission: str
    admission: int | None
    started: int
    ended: int | None = None
    rank: str = ""
    """The pod's place in its execution: child Job and completion index (one process per rank may run)."""
    trainjob_uid: str = ""
    run: int | None = None
    """Which resume of its TrainJob, as the fake's controllers passed it down, created the pod: pods created
    from one resume are one execution (A alone cannot tell two apart when A was not raised between them)."""
    reported: int | None = None
    """The A its TrainJob's annotation reported when Trainer built that resume's JobSet (the admission's A)."""

    @property
    def subject(self) -> tuple[str, ...]:
        """What must never have two executions at once: the submission, or the TrainJob if not dispatch's."""
        if self.job_id and self.submission:
            return (self.namespace, "submission", self.job_id, self.submission)
        return (self.namespace, "trainjob", self.obj_name)

    @property
    def execution(self) -> tuple[object, ...]:
        if self.run is not None:
            return (self.trainjob_uid, self.run)
        return (self.obj_name, self.admission)

    def describe(self) -> str:
        end = "running" if self.ended is None else str(self.ended)
        return (f"{self.pod} of {self.obj_name} (A={self.admission}, run {self.run}, rank {self.rank or '?'}) "
                f"on {self.node}, {self.started}-{end}")


def _subject_words(subject: tuple[str, ...]) -> str:
    if subject[1] == "submission":
        return f"submission {subject[2]}/{subject[3]} in {subject[0]}"
    return f"TrainJob {subject[2]} in {subject[0]}"


@dataclass
class History:
    """Every process start and end, in order, for the overlap checker."""

    clock: int = 0
    processes: list[Process] = field(default_factory=list)

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def check(self) -> None:
        """Assert the promise on everything that ran: one execution at a time, each with one A, A rising.

        - An overlap is two processes of one submission (job-id and submission, in one namespace) of two
          executions alive at once, whatever their A and whatever TrainJob name they run under; two
          processes of one rank of one execution alive at once are an overlap too.
        - Each execution has exactly one A: every pod of it carries the A its TrainJob reported when the
          execution was admitted.
        - A strictly increases per submission from each execution to the next, across incarnations.
        Processes of TrainJobs without dispatch's labels are held to the first rule per TrainJob name.
        """
        groups: dict[tuple[str, ...], list[Process]] = {}
        for p in self.processes:
            groups.setdefault(p.subject, []).append(p)
        for subject, procs in groups.items():
            what = _subject_words(subject)
            ordered = sorted(procs, key=lambda p: p.started)
            for i, a in enumerate(ordered):
                a_end = a.ended if a.ended is not None else 1 << 60
                for b in ordered[i + 1:]:
                    if b.started >= a_end:
                        break
                    if a.execution != b.execution:
                        raise AssertionError(
                            f"two executions of {what} overlap: {a.describe()} and {b.describe()}")
                    if a.rank and a.rank == b.rank:
                        raise AssertionError(
                            f"two processes of one rank of one execution of {what} overlap: "
                            f"{a.describe()} and {b.describe()}")
            executions: dict[tuple[object, ...], list[Process]] = {}
            for p in ordered:
                executions.setdefault(p.execution, []).append(p)
            for ps in executions.values():
                first = ps[0]
                other = next((p for p in ps if p.admission != first.admission), None)
                if other is not None:
                    raise AssertionError(
                        f"one execution of {what} runs with two admission numbers: {first.describe()} and "
                        f"{other.describe()}")
                if first.run is not None and first.reported != first.admission:
                    raise AssertionError(
                        f"an execution of {what} carries A={first.admission} but its TrainJob reported "
                        f"A={first.reported} at admission: {first.describe()}")
            if subject[1] != "submission":
                continue
            starts = [ps[0] for ps in executions.values()]  # in order of first start (dicts keep insertion order)
            for prev, cur in itertools.pairwise(starts):
                if prev.admission is None or cur.admission is None or cur.admission <= prev.admission:
                    raise AssertionError(
                        f"admission numbers of {what} did not strictly rise from one execution to the next: "
                        f"{prev.describe()} then {cur.describe()}")


def jobset_update_problem(old: Obj, new: Obj) -> str | None:
    """JobSet's validating webhook on an update (``ValidateUpdate``, v0.11 and v0.12): ``spec.replicatedJobs``
    and ``spec.managedBy`` never change, except that while the JobSet is suspended (or being suspended) each
    replicatedJob it already has may change its pod template's labels, annotations, nodeSelector, tolerations and
    schedulingGates (what Kueue and Trainer's runtime patches set). A replicatedJob added or taken away is refused
    (v0.11 indexes the old list by position and fails on a longer one; v0.12 refuses it as immutable)."""
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    before = {rj.get("name"): rj for rj in old_spec.get("replicatedJobs") or []}
    munged = copy.deepcopy(new_spec.get("replicatedJobs") or [])
    if old_spec.get("suspend") or new_spec.get("suspend"):
        for rj in munged:
            prev = before.get(rj.get("name"))
            if prev is None:
                continue
            pod = rj.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
            old_pod = ((prev.get("template") or {}).get("spec") or {}).get("template") or {}
            for part, keys in (("metadata", ("labels", "annotations")),
                               ("spec", ("nodeSelector", "tolerations", "schedulingGates"))):
                here, there = pod.setdefault(part, {}), old_pod.get(part) or {}
                for key in keys:
                    if key in there:
                        here[key] = copy.deepcopy(there[key])
                    else:
                        here.pop(key, None)
                if not here and part not in old_pod:
                    del pod[part]
    if munged != (old_spec.get("replicatedJobs") or []):
        return 'spec.replicatedJobs: Invalid value: "array": field is immutable'
    if new_spec.get("managedBy") != old_spec.get("managedBy"):
        return 'spec.managedBy: Invalid value: "string": field is immutable'
    return None


POD_POLICY = "dispatch-pods"


def pod_policy(operation: str, old: Obj | None, new: Obj) -> str | None:
    """The ``dispatch-pods`` ValidatingAdmissionPolicy on one pod write, worded as the API server words a
    policy's denial (None: allowed)."""
    if operation != "UPDATE" or old is None:
        return None
    old_labels, new_labels = labels_of(old), labels_of(new)
    if LABEL_JOB_ID not in old_labels and LABEL_JOB_ID not in new_labels:
        return None  # the policy's objectSelector
    who = requester()
    ns = str((new.get("metadata") or {}).get("namespace") or "")
    verb, group, resource = d.POD_RELEASE_PERMISSION
    may = who is None or who.allows(Attributes(verb, "", True, group, "v1", resource, "", ns, ""))
    old_fin = [str(f) for f in (old.get("metadata") or {}).get("finalizers") or []]
    new_fin = [str(f) for f in (new.get("metadata") or {}).get("finalizers") or []]
    problem = d.pod_write_problem(old_labels, new_labels, old_fin, new_fin, may_release=may,
                                  old_mark=annotations_of(old).get(ANNOTATION_MARK_SEEN),
                                  new_mark=annotations_of(new).get(ANNOTATION_MARK_SEEN))
    if problem is None:
        return None
    return f"ValidatingAdmissionPolicy '{POD_POLICY}' with binding '{POD_POLICY}' denied request: {problem}"


class FakeCluster:
    """A fake API server plus the controllers and nodes a test steps by hand."""

    def __init__(self, namespace: str = "default", *, job_tracking: bool = False) -> None:
        """``job_tracking``: the Job controller keeps its ``batch.kubernetes.io/job-tracking`` finalizer on the pods
        it makes, as the real one does (``job_sync``; it takes it off pods still stopping, which the API server keeps
        through their grace period: ``FakeApiServer.grace_outlasts_finalizers``). Off by default, so every schedule
        written before it runs as it did."""
        self.now = datetime(2026, 1, 1, tzinfo=UTC)
        self.server = FakeApiServer(clock=lambda: self.now)
        self.namespace = namespace
        self.history = History()
        self.frozen: set[str] = set()
        self._kill_deadline: dict[str, datetime] = {}
        """Per pod uid, the end of the grace period its kubelet first saw when the pod was deleted."""
        self.deleted_nodes: set[str] = set()
        """Nodes whose Node object is deleted (their machine may run on: ``machines_gone`` says)."""
        self.machines_gone: set[str] = set()
        """Nodes whose machine is shut down for good (``remove_machine``): no kubelet, no process."""
        self._orphaned_at: dict[str, datetime] = {}  # node -> when PodGC first found it missing
        self._pod_seq = 0
        self.refused_pods: list[tuple[str, int | None, str]] = []
        """(Job, completion index, message) of each pod create an admission webhook refused, in order."""
        self._processes: dict[str, Process] = {}
        self._finish_requested: dict[str, str] = {}
        self.partitioned: set[str] = set()
        self.back: set[str] = set()  # healed nodes whose kubelet has not synced its pods since
        self.cut_off_pods: dict[str, dict[str, Obj]] = {}  # partitioned node -> its pods as its kubelet knew them
        """Nodes cut off from the API server whose kubelets go on (see ``partition``)."""
        self._rejecting: dict[str, tuple[str, str]] = {}  # node -> (reason, message) its kubelet rejects with
        self._init_hangs: set[str] = set()  # nodes where pods' init containers never finish
        self.node_clock_offset: dict[str, float] = {}
        """Seconds each node's clock is ahead of the control plane's (negative: behind). A kubelet writes its
        times (containers' ``startedAt``/``finishedAt``, its conditions' ``lastTransitionTime``, its Node's
        Ready) with its node's clock; the control plane's writers (PodGC, Kueue) with the cluster's."""
        self._crashed: dict[str, int] = {}  # pod uid -> exit code of its container's last crash
        self._runs: dict[str, tuple[int, bool]] = {}  # TrainJob uid -> (resumes seen, suspended when last seen)
        self.job_tracking = job_tracking
        """The Job controller's job-tracking finalizer (see ``__init__``)."""
        self.job_controller_misses_orphans = False
        """With ``job_tracking``: the Job controller leaves its finalizer on pods whose Job is gone (orphans), as the
        real one did after kube-apiserver restarts (issue 34: two deleted pods held 40 minutes); its own pods'
        finalizers still go. Set it back to False and the next pass frees them."""
        self.trainer_before_2_2_1 = False
        """Trainer v2.2.0's webhook rule: runtime patches change only in a write that leaves the TrainJob suspended
        (v2.2.1 and later: suspended before or after it, so a raise of A may also unsuspend)."""
        self._reported: dict[tuple[str, int], int | None] = {}  # (TrainJob uid, run) -> the A it was built from
        self._identities: dict[str, tuple[str, str]] = {}  # TrainJob uid -> its (job-id, submission) labels
        # Which run each layer was last given, by uid, kept beside the objects so nothing a test reads changes.
        self._jobset_runs: dict[str, tuple[str, int]] = {}
        self._job_runs: dict[str, tuple[str, int]] = {}
        self._pod_runs: dict[str, tuple[str, int]] = {}
        self.server.add_admission("trainjobs", self._trainer_webhook)
        self._jobset_webhook = False
        self.install_jobset_webhook()  # the real JobSet always serves it
        self.server.create("", "namespaces", "", {"metadata": {"name": namespace}})

    # ------------------------------------------------------------------ wiring

    def transport(self, role: str | None = None, *, roles: Iterable[str | Binding] = (), user: str | None = None,
                  rbac: str | Path | Policy | None = None) -> httpx2.MockTransport:
        """A transport to the cluster's API; with ``role``/``roles``, limited to those shipped roles
        (see ``FakeApiServer.transport``)."""
        return self.server.transport(role, roles=roles, user=user, rbac=rbac)

    def install_jobset_webhook(self) -> None:
        """JobSet's validating webhook on updates (``jobset_update_problem``): Trainer's re-apply of a JobSet
        whose runtime gained or lost a replicatedJob since the JobSet was made is refused, as on the real
        cluster, and the JobSet stays as it was (suspended or running). Installed from the start, as the real
        JobSet's webhook always is; a second call changes nothing."""
        if self._jobset_webhook:
            return
        self._jobset_webhook = True
        self.server.add_admission("jobsets", lambda op, old, new: jobset_update_problem(old, new)
                                  if op == "UPDATE" and old is not None else None)

    def install_pod_policy(self) -> None:
        """dispatch's ``dispatch-pods`` CEL policy (``deploy/base/guard.yaml``): on every update of a pod
        carrying dispatch's job-id label (before or after), through ``/status`` too, the labels that say whose
        it is stay, and dispatch's finalizer goes only for a caller the authorizer lets ``release``
        ``podfinalizers`` (the controller's and the admin role; the test acting as admin and the cluster's own
        controllers are unrestricted here, as the real cluster's are not bound by dispatch's roles)."""
        self.server.add_admission("pods", pod_policy)

    def kubelet_time(self, node: str | None) -> str:
        """Now, as the kubelet of ``node`` writes it (``node_clock_offset``)."""
        return _now_text(self.now + timedelta(seconds=self.node_clock_offset.get(node or "", 0.0)))

    def advance(self, seconds: float) -> None:
        """Move the cluster's clock (grace periods are measured on it)."""
        self.now += timedelta(seconds=seconds)

    # ------------------------------------------------------------------ fixtures

    def add_runtime(self, name: str = "torch-distributed", replicated: tuple[str, ...] = ("node",), *,
                    replacement_policy: str | None = None, completion_mode: str | None = None) -> None:
        """A ClusterTrainingRuntime; ``replacement_policy`` sets its Jobs' ``podReplacementPolicy``
        (unset, as in the runtimes Trainer ships: the Job API then defaults it to TerminatingOrFailed);
        ``completion_mode`` their ``completionMode`` (unset: JobSet's webhook makes it Indexed)."""
        job_spec: Obj = {} if replacement_policy is None else {"podReplacementPolicy": replacement_policy}
        if completion_mode is not None:
            job_spec["completionMode"] = completion_mode
        self.server.create(TRAINER, "clustertrainingruntimes", "", {
            "metadata": {"name": name},
            "spec": {"template": {"spec": {"replicatedJobs": [
                {"name": rj, "replicas": 1, "template": {"spec": {**job_spec, "template": {"spec": {
                    "containers": [{"name": rj, "image": "example.invalid/train"}]}}}}}
                for rj in replicated
            ]}}},
        })

    def add_node(self, name: str) -> None:
        """A machine registers a Node ``name`` (Ready=True). Under the name of a deleted Node it is a new
        object (a new uid, a later creationTimestamp); where the old machine still runs, use
        ``restart_kubelet`` (its kubelet registering again) instead."""
        assert name not in self.deleted_nodes or name in self.machines_gone, (
            f"fake cluster: node {name}'s old machine still runs; restart_kubelet registers it again")
        self._register(name)

    def _register(self, name: str) -> None:
        self.server.create("", "nodes", "", {
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"conditions": [{"type": "Ready", "status": "True",
                                       "lastTransitionTime": _now_text(self.now)}]},
        })
        self.deleted_nodes.discard(name)
        self.machines_gone.discard(name)
        self._orphaned_at.pop(name, None)

    def _node_ready(self, name: str, status: str) -> None:
        def mutate(obj: Obj) -> None:
            for c in obj.setdefault("status", {}).setdefault("conditions", []):
                if c.get("type") == "Ready" and c.get("status") != status:
                    c["status"] = status
                    # True: its kubelet writes it back (its clock); Unknown: the node controller (the control plane's)
                    c["lastTransitionTime"] = self.kubelet_time(name) if status == "True" else _now_text(self.now)
        self.server.update("", "nodes", "", name, mutate, status=True)

    def freeze_node(self, name: str) -> None:
        """The node's kubelet stops answering: Ready=Unknown, its pods' processes go on."""
        self.frozen.add(name)
        self.cut_off_pods.setdefault(name, {}).update(
            {p["metadata"]["uid"]: copy.deepcopy(p) for p in self.server.objects("", "pods")
             if p["spec"].get("nodeName") == name})
        self._node_ready(name, "Unknown")

    def thaw_node(self, name: str) -> None:
        """The kubelet answers again; its first sync is as after a partition (``heal``)."""
        self.frozen.discard(name)
        self._node_ready(name, "True")
        self.back.add(name)
        for proc in list(self._processes.values()):
            if proc.node == name and self.server.get("", "pods", proc.namespace, proc.pod) is None:
                self._end(proc)

    def partition(self, name: str) -> None:
        """The node loses the API server but its kubelet goes on (unlike ``freeze_node``): Ready=Unknown
        once the node controller notices, its containers keep running, and it restarts a crashed
        container as the pod's restart policy says, without seeing anything written to the API since."""
        self.partitioned.add(name)
        self.cut_off_pods.setdefault(name, {}).update(
            {p["metadata"]["uid"]: copy.deepcopy(p) for p in self.server.objects("", "pods")
             if p["spec"].get("nodeName") == name})
        self._node_ready(name, "Unknown")

    def heal(self, name: str) -> None:
        """The partition ends: the node is Ready again (unless it froze meanwhile: a frozen kubelet reports
        nothing, and its node stays Ready=Unknown until it thaws), and on its next sync (``settle``) the
        kubelet acts on what the API now says. As a real kubelet v1.37 did, a container that crashed under
        OnFailure is started once more on that first sync even when someone else marked the pod Failed
        meanwhile (the kubelet had not learned it yet), and stopped at once: a brief process, then its end
        reported."""
        self.partitioned.discard(name)
        if name not in self.deleted_nodes and name not in self.frozen and name not in self.machines_gone:
            self._node_ready(name, "True")
            self.back.add(name)

    def kubelet_rejects(self, node: str, reason: str = "OutOfcpu",
                        message: str = "Node didn't have enough resource: cpu, requested: 4000, used: 0, "
                                       "capacity: 2000") -> None:
        """The node's kubelet rejects the pods bound to it from now on at admission, as a real one does
        (``rejectPod``): the pod never runs. ``kubelet_admits`` ends it."""
        self._rejecting[node] = (reason, message)

    def kubelet_admits(self, node: str) -> None:
        self._rejecting.pop(node, None)

    def init_containers_hang(self, node: str, hang: bool = True) -> None:
        """Pods with init containers that start on ``node`` from now on never finish initialising."""
        if hang:
            self._init_hangs.add(node)
        else:
            self._init_hangs.discard(node)

    def crash(self, pod: str, exit_code: int = 1, namespace: str | None = None) -> None:
        """The pod's container exits with ``exit_code`` on its own. Its kubelet reports it terminated;
        under restartPolicy OnFailure (JobSet's default) a non-zero exit keeps the phase Running and the
        kubelet restarts it on a later sync, as a real one does; under Never the pod ends."""
        ns = namespace or self.namespace
        obj = self.server.get("", "pods", ns, pod)
        if obj is None:
            return
        uid = obj["metadata"]["uid"]
        proc = self._processes.get(uid)
        if proc is None:
            return  # only a running container can crash
        self._end(proc)
        self._crashed[uid] = exit_code
        node = obj["spec"].get("nodeName")
        if node in self.frozen or node in self.partitioned or node in self.machines_gone:
            return
        restarts = bool(self._restart_action(obj, exit_code))

        def crashed(o: Obj) -> None:
            st = o.setdefault("status", {})
            st["containerStatuses"] = [
                {"name": c.get("name", ""), "restartCount": self._restarts(o, c.get("name", "")),
                 "state": {"terminated": {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed",
                                          "finishedAt": self.kubelet_time(node)}}}
                for c in (o.get("spec") or {}).get("containers") or []]
            if not restarts:  # the pod ends: its kubelet stops it, sandbox included, and writes the phase
                st["phase"] = "Succeeded" if exit_code == 0 else "Failed"
                self._set_kubelet_conditions(o, node, PodReadyToStartContainers=False, ContainersReady=False)
        self.server.update("", "pods", ns, pod, crashed, status=True)
        if not restarts:
            self._crashed.pop(uid, None)

    @staticmethod
    def _restarts(obj: Obj, container: str) -> int:
        for c in (obj.get("status") or {}).get("containerStatuses") or []:
            if c.get("name") == container and isinstance(c.get("restartCount"), int):
                return int(c["restartCount"])
        return 0

    def taint_out_of_service(self, name: str) -> None:
        """The operator confirms the node is down: the out-of-service taint (its processes are gone)."""
        def mutate(obj: Obj) -> None:
            taints = obj.setdefault("spec", {}).setdefault("taints", [])
            taints.append({"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"})
        self.server.update("", "nodes", "", name, mutate, status=False)
        for proc in list(self._processes.values()):
            if proc.node == name:
                self._end(proc)

    def power_off(self) -> None:
        """Every machine of this cluster loses power: every process ends, and each pod that had not ended
        is written Failed, as its kubelet reports it once it runs again (nothing of it restarts by itself)."""
        for proc in list(self._processes.values()):
            self._end(proc)
        for pod in self.server.objects("", "pods"):
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                self._kubelet_stopped(pod, "Failed", 137)

    def shut_down(self, name: str) -> None:
        """The operator shuts the machine down: its processes end and its kubelet stops reporting
        (Ready=Unknown once the node controller notices); ``thaw_node`` boots it again."""
        self.freeze_node(name)
        for proc in list(self._processes.values()):
            if proc.node == name:
                self._end(proc)

    def delete_node(self, name: str) -> None:
        """``kubectl delete node``: only the Node object goes. As on a real kubelet v1.37 whose Node was
        deleted, the machine runs on: its kubelet keeps running (and ending, and restarting by policy) its
        pods and writing their status, and it does not register its Node again until it restarts
        (``restart_kubelet``). A frozen or partitioned node stays so. PodGC deletes its pods 40 s on
        (``pod_gc``). ``remove_machine`` is a machine that is really gone."""
        self.server.delete("", "nodes", "", name)
        self.deleted_nodes.add(name)
        self._orphaned_at.setdefault(name, self.now)  # PodGC's informer sees the deletion at once

    def remove_machine(self, name: str) -> None:
        """The machine is shut down for good (its processes end, its kubelet never runs again), then its
        Node is deleted: what an operator does about a dead machine."""
        self.machines_gone.add(name)
        self.frozen.discard(name)
        self.partitioned.discard(name)
        for proc in list(self._processes.values()):
            if proc.node == name:
                self._end(proc)
        if name not in self.deleted_nodes:
            self.delete_node(name)

    def restart_kubelet(self, name: str) -> None:
        """The node's kubelet restarts (thawed if it was frozen): with its Node deleted it registers it again,
        a new object (a new uid), Ready=True, and acts on its pods as the API now says on its next sync."""
        assert name not in self.machines_gone, f"fake cluster: node {name}'s machine is gone"
        self.frozen.discard(name)
        self.partitioned.discard(name)
        if name in self.deleted_nodes:
            self._register(name)
        else:
            self._node_ready(name, "True")
        self.back.add(name)

    # ------------------------------------------------------------------ processes

    def _start(self, pod: Obj) -> None:
        meta = pod["metadata"]
        assert meta["uid"] not in self._processes, f"fake kubelet: pod {meta['name']} started twice: {pod}"
        labels = meta.get("labels") or {}
        adm = labels.get(LABEL_ADMISSION)
        tj_uid, run = self._pod_runs.get(meta["uid"], ("", None))
        # The submission is the TrainJob's, whatever the pod's labels say: a pod a runtime patch stripped of
        # dispatch's labels is still a process of that submission (the oracle's overlap is per submission).
        job_id, submission = self._identities.get(tj_uid, ("", ""))
        proc = Process(
            pod=meta["name"], uid=meta["uid"], namespace=meta.get("namespace", ""),
            node=pod["spec"]["nodeName"], obj_name=labels.get(JOBSET_NAME_LABEL, ""),
            job_id=labels.get(LABEL_JOB_ID, "") or job_id, submission=labels.get(LABEL_SUBMISSION, "") or submission,
            admission=_number(adm) if adm is not None else None, started=self.history.tick(),
            # a NonIndexed Job's pods have no rank: its siblings run side by side by design
            rank=(f"{labels['batch.kubernetes.io/job-name']}#{labels[COMPLETION]}"
                  if labels.get("batch.kubernetes.io/job-name") and labels.get(COMPLETION) else ""),
            trainjob_uid=tj_uid, run=run,
            reported=self._reported.get((tj_uid, run)) if run is not None else None,
        )
        self._processes[meta["uid"]] = proc
        self.history.processes.append(proc)

    def _end(self, proc: Process) -> None:
        if proc.ended is None:
            proc.ended = self.history.tick()
        self._processes.pop(proc.uid, None)

    def built_from(self, pod_uid: str) -> str | None:
        """The uid of the TrainJob whose resume the fake's controllers built this pod from (None if unknown):
        a TrainJob re-created under the same name may take over the old one's JobSet, so owners alone
        cannot tell."""
        run = self._pod_runs.get(pod_uid)
        return run[0] if run is not None else None

    def running_processes(self, obj_name: str | None = None) -> list[Process]:
        return [p for p in self._processes.values() if obj_name is None or p.obj_name == obj_name]

    # ------------------------------------------------------------------ Trainer (with its webhook)

    def _trainer_webhook(self, op: str, old: Obj | None, new: Obj) -> str | None:
        """Trainer's rule: runtimePatches change only when suspended before or after, and no active Job; and
        no update at all while the runtime the TrainJob names is gone (its webhook validates every update
        against the runtime: ``runtime '<name>' not found``, as Trainer v2.3 answered a hold on the testbed)."""
        if op != "UPDATE" or old is None:
            return None
        ref = (new.get("spec") or {}).get("runtimeRef") or {}
        if ref.get("name") and self.server.get(
                TRAINER, "trainingruntimes" if ref.get("kind") == "TrainingRuntime" else "clustertrainingruntimes",
                new["metadata"]["namespace"] if ref.get("kind") == "TrainingRuntime" else "", ref["name"]) is None:
            return f"runtime '{ref['name']}' not found"
        if (old.get("spec") or {}).get("runtimePatches") == (new.get("spec") or {}).get("runtimePatches"):
            return None
        if not (new.get("spec") or {}).get("suspend") and (
                self.trainer_before_2_2_1 or not (old.get("spec") or {}).get("suspend")):
            return "RuntimePatches can only be changed when the TrainJob is suspended"
        js = self.server.get(JOBSET, "jobsets", new["metadata"]["namespace"], new["metadata"]["name"])
        if js is not None:
            for rj in (js.get("status") or {}).get("replicatedJobsStatus") or []:
                if int(rj.get("active") or 0) > 0:
                    return f"RuntimePatches cannot be modified when the JobSet's ReplicatedJob {rj['name']} " \
                           "is still active"
        return None

    def _not_deleted(self, group: str, plural: str) -> Iterator[tuple[Obj, Obj]]:
        """Each object of a kind not being deleted (what a controller still syncs), with its metadata."""
        for obj in self.server.objects(group, plural):
            if not obj["metadata"].get("deletionTimestamp"):
                yield obj, obj["metadata"]

    def trainer_sync(self) -> None:
        """TrainJob → JobSet. Re-applied only when the JobSet is missing or either side is suspended."""
        for tj, meta in self._not_deleted(TRAINER, "trainjobs"):
            ns, name = meta["namespace"], meta["name"]
            if (tj.get("spec") or {}).get("managedBy") not in (None, TRAINER_CONTROLLER):
                continue  # Trainer v2.3 leaves an object another controller manages (MultiKueue) alone
            suspend = bool((tj.get("spec") or {}).get("suspend"))
            runs, was_suspended = self._runs.get(meta["uid"], (0, True))
            if was_suspended and not suspend:
                runs += 1
                adm = ((meta.get("annotations") or {}).get(ANNOTATION_ADMISSION))
                self._reported[(meta["uid"], runs)] = _number(adm) if adm is not None else None
                tj_labels = meta.get("labels") or {}
                self._identities[meta["uid"]] = (tj_labels.get(LABEL_JOB_ID, ""), tj_labels.get(LABEL_SUBMISSION, ""))
            self._runs[meta["uid"]] = (runs, suspend)
            js = self.server.get(JOBSET, "jobsets", ns, name)

            def trainer_status(obj: Obj, suspend: bool = suspend, js: Obj | None = js) -> None:
                """Trainer v2.3's status step, after any build: Failed dropped, Suspended as the spec says, then
                the Complete and Failed of the JobSet *of the TrainJob's name*, whoever owns it, copied with that
                JobSet's own reason, message and time (tests/contract/test_trainer_status.py)."""
                conds = obj.setdefault("status", {}).setdefault("conditions", [])
                conds[:] = [c for c in conds if c.get("type") != "Failed"]
                _set_cond(obj, "Suspended", suspend, "Suspended" if suspend else "Resumed")
                for theirs, ours in (("Completed", "Complete"), ("Failed", "Failed")):
                    got = next((c for c in ((js or {}).get("status") or {}).get("conditions") or []
                                if c.get("type") == theirs and c.get("status") == "True"), None)
                    if got is not None and not _cond(obj, ours):
                        conds.append({**got, "type": ours})
            if _cond(tj, "Complete"):
                # finished: Trainer v2.3 builds nothing more for it (``IsTrainJobFinished``), only its status
                self.server.update(TRAINER, "trainjobs", ns, name, trainer_status, status=True)
                continue
            earlier = js is not None and any(o.get("controller") and o.get("kind") == "TrainJob"
                                             and o.get("uid") != meta["uid"]
                                             for o in js["metadata"].get("ownerReferences") or [])
            if not self._snapshot(tj) or earlier:
                # an earlier TrainJob's snapshot ConfigMap or JobSet (its collector missed that owner's deletion):
                # the real Trainer v2.3 builds nothing while either exists (TrainJobResourcesCreationFailed, "a
                # snapshot configmap exists but is owned by another object"), and leaves the JobSet alone; its
                # status still says Suspended as the spec does (seen: Suspended=True while it refused), and
                # carries that JobSet's Complete or Failed
                self.server.update(TRAINER, "trainjobs", ns, name, trainer_status, status=True)
                continue
            desired = self._jobset_spec(tj)
            if desired is None:
                continue
            if js is None:
                made = self._create_content(JOBSET, "jobsets", ns, {
                    "metadata": {"name": name, "labels": self._jobset_labels(tj), "ownerReferences": [
                        {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": name,
                         "uid": meta["uid"], "controller": True}]},
                    "spec": desired,
                }, admit=False)
                if made is not None:
                    self._jobset_runs[made["metadata"]["uid"]] = (meta["uid"], runs)
                    if not suspend:
                        self._built_from(meta, runs)
            elif suspend or (js.get("spec") or {}).get("suspend"):
                def mutate(obj: Obj, desired: Obj = desired, tj: Obj = tj) -> None:
                    obj["spec"] = desired
                    obj["metadata"].setdefault("labels", {}).update(self._jobset_labels(tj))
                try:
                    self.server.update(JOBSET, "jobsets", ns, name, mutate, status=False)
                    self._jobset_runs[js["metadata"]["uid"]] = (meta["uid"], runs)
                    if not suspend:
                        self._built_from(meta, runs)
                except ApiFailure:
                    pass  # refused (JobSet's webhook): the real Trainer records an Event, sets Suspended all the same

            self.server.update(TRAINER, "trainjobs", ns, name, trainer_status, status=True)

    SNAPSHOT_REFUSED = ("TrainJob resources reconciliation failed: unable to get runtime snapshot: invalid runtime "
                        "snapshot: a snapshot configmap exists but is owned by another object")
    """What Trainer v2.3 reports (a Warning Event on the TrainJob, nothing in its status) when the snapshot
    ConfigMap of the TrainJob's name is controlled by another uid (pkg/runtime/core/snapshot.go)."""

    def _snapshot(self, tj: Obj) -> bool:
        """Trainer v2.3's runtime snapshot: a ConfigMap ``<name>-runtime-snapshot`` the TrainJob controls, made
        on its first build. One controlled by another uid (an earlier TrainJob of the name that the garbage
        collector has not reached) stops every build of this one: a Warning Event each pass, and no JobSet.
        Returns whether Trainer may build."""
        meta = tj["metadata"]
        ns, cm_name = meta["namespace"], f"{meta['name']}-runtime-snapshot"
        cm = self.server.get("", "configmaps", ns, cm_name)
        if cm is None:
            made = self._create_content("", "configmaps", ns, {
                "metadata": {"name": cm_name, "ownerReferences": [
                    {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": meta["name"],
                     "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
                "data": {"runtime": str(((tj.get("spec") or {}).get("runtimeRef") or {}).get("name", ""))}},
                admit=False)
            return made is not None
        owner = next((o for o in cm["metadata"].get("ownerReferences") or [] if o.get("controller")), None)
        if owner is not None and owner.get("uid") == meta["uid"]:
            return True
        self.event(tj, "Warning", "TrainJobResourcesCreationFailed", self.SNAPSHOT_REFUSED, "trainer")
        return False

    def event(self, about: Obj, etype: str, reason: str, message: str, component: str) -> None:
        """A controller's Event about ``about``, as the real ones record them: one per (object, reason, message),
        its count and lastTimestamp raised when repeated (the recorders' aggregation)."""
        meta = about["metadata"]
        ns = meta.get("namespace") or "default"
        key = hashlib.sha256(f"{meta['uid']}/{reason}/{message}".encode()).hexdigest()[:10]
        name = f"{meta['name']}.{key}"
        now = self.server.clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        if self.server.get("", "events", ns, name) is not None:
            def again(obj: Obj) -> None:
                obj["count"] = int(obj.get("count") or 1) + 1
                obj["lastTimestamp"] = now
            self.server.update("", "events", ns, name, again, status=False)
            return
        self._create_content("", "events", ns, {
            "metadata": {"name": name},
            "involvedObject": {"apiVersion": about.get("apiVersion", ""), "kind": about.get("kind", ""),
                               "name": meta["name"], "namespace": ns, "uid": meta["uid"]},
            "type": etype, "reason": reason, "message": message, "source": {"component": component},
            "reportingComponent": component, "count": 1, "firstTimestamp": now, "lastTimestamp": now}, admit=False)

    def _built_from(self, meta: Obj, run: int) -> None:
        """The run's reported A is the one Trainer built its JobSet from. Trainer reconciles a TrainJob's latest
        state, not each write: a resume it saw but could not build (an earlier TrainJob's JobSet still there),
        then a hold and a release landing between two of its passes, is one resume to it, built from the A the
        last release wrote; the A of the resume it first saw ran nowhere."""
        adm = (meta.get("annotations") or {}).get(ANNOTATION_ADMISSION)
        self._reported[(meta["uid"], run)] = _number(adm) if adm is not None else None

    @staticmethod
    def _jobset_labels(tj: Obj) -> dict[str, str]:
        """Trainer's propagation labels: every runtime patch entry's JobSet template labels, in order."""
        out: dict[str, str] = {}
        for patch in patch_entries(tj):
            out.update((((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("metadata") or {})
                       .get("labels") or {})
        return out

    def _jobset_spec(self, tj: Obj) -> Obj | None:
        """The JobSet spec Trainer builds: the runtime's, with each runtime patch entry's Job template patches
        merged in list order as Trainer merges them (``mergeRuntimePatches``: a strategic merge patch over each
        replicatedJob's Job template, ``_smp``). None while the runtime is missing, or when a merge fails (the
        real Trainer's reconcile errors and it builds no JobSet)."""
        ref = (tj.get("spec") or {}).get("runtimeRef") or {}
        runtime = self.server.get(TRAINER, "clustertrainingruntimes", "", ref.get("name", ""))
        if runtime is None:
            return None
        spec: Obj = copy.deepcopy(runtime["spec"]["template"]["spec"])
        name = tj["metadata"]["name"]
        for rj in spec["replicatedJobs"]:
            for patch in patch_entries(tj):
                for prj in ((((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {})
                            .get("replicatedJobs") or []):
                    if prj.get("name") != rj["name"] or not isinstance(prj.get("template"), dict):
                        continue
                    try:
                        rj["template"] = strategic_merge(rj["template"], trainer_patch(prj["template"]))
                    except PatchError:
                        return None
            pod_template = rj["template"].setdefault("spec", {}).setdefault("template", {})
            pod_template.setdefault("metadata", {}).setdefault("labels", {})[JOBSET_NAME_LABEL] = name
            # JobSet's webhook defaults every pod template's restartPolicy to OnFailure.
            pod_template.setdefault("spec", {}).setdefault("restartPolicy", "OnFailure")
            num = (tj.get("spec") or {}).get("trainer", {}).get("numNodes")
            if num and rj["name"] == "node":
                rj["template"]["spec"]["parallelism"] = num
        spec["suspend"] = bool((tj.get("spec") or {}).get("suspend"))
        return spec

    # ------------------------------------------------------------------ JobSet

    def jobset_sync(self) -> None:
        """JobSet → child Jobs: suspend follows the JobSet; on resume, pod-template labels are merged in."""
        for js, meta in self._not_deleted(JOBSET, "jobsets"):
            ns, name = meta["namespace"], meta["name"]
            if _cond(js, "Completed") or _cond(js, "Failed"):
                continue  # JobSet v0.12 leaves a finished JobSet as it is (its TTL aside)
            suspend = bool(js["spec"].get("suspend"))
            statuses = []
            completed: list[bool] = []
            for rj in js["spec"]["replicatedJobs"]:
                job_name = f"{name}-{rj['name']}-0"
                template = rj["template"]["spec"]["template"]
                job = self.server.get("batch", "jobs", ns, job_name)
                if job is not None and not any(o.get("controller") and o.get("uid") == meta["uid"]
                                               for o in job["metadata"].get("ownerReferences") or []):
                    # an earlier JobSet's Job of this name, which its collector missed: the real JobSet's create
                    # is refused (AlreadyExists), it records JobCreationFailed and retries; this one never runs
                    self.event(js, "Warning", "JobCreationFailed",
                               f'job "{job_name}" creation failed with error: jobs.batch "{job_name}" already exists',
                               "jobset-controller")
                    statuses.append({"name": rj["name"], "active": 0, "ready": 0, "succeeded": 0, "failed": 0,
                                     "suspended": 0})
                    completed.append(False)
                    continue
                if job is None:
                    # As the real JobSet labels a child Job and its pods (seen on the testbed, v0.12): which
                    # replicatedJob and which of its replicas (the fake makes one Job of each).
                    rank = {REPLICATED_JOB_LABEL: rj["name"], JOB_INDEX_LABEL: "0"}
                    pod_template = copy.deepcopy(template)
                    pod_template.setdefault("metadata", {}).setdefault("labels", {}).update(rank)
                    made_job = self._create_content("batch", "jobs", ns, {
                        "metadata": {"name": job_name, "labels": {
                            **(((rj["template"].get("metadata") or {}).get("labels")) or {}), JOBSET_NAME_LABEL: name,
                            **rank},
                                     "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2",
                                                          "kind": "JobSet", "name": name, "uid": meta["uid"],
                                                          "controller": True}]},
                        "spec": {"suspend": suspend, "parallelism": rj["template"]["spec"].get("parallelism", 1),
                                 # JobSet's webhook defaults every replicatedJob to Indexed
                                 "completionMode": rj["template"]["spec"].get("completionMode") or "Indexed",
                                 # The API's default without a podFailurePolicy.
                                 "podReplacementPolicy": rj["template"]["spec"].get("podReplacementPolicy")
                                 or "TerminatingOrFailed",
                                 "template": pod_template},
                    })
                    if made_job is None:
                        continue
                    job = self.server.get("batch", "jobs", ns, job_name)
                    assert job is not None
                    self._pass_run(self._jobset_runs, meta["uid"], self._job_runs, job["metadata"]["uid"])
                elif bool(job["spec"].get("suspend")) != suspend:
                    def mutate(obj: Obj, template: Obj = template, suspend: bool = suspend) -> None:
                        obj["spec"]["suspend"] = suspend
                        if not suspend:
                            tl = obj["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {})
                            tl.update((template.get("metadata") or {}).get("labels") or {})
                    self.server.update("batch", "jobs", ns, job_name, mutate, status=False)
                    job = self.server.get("batch", "jobs", ns, job_name)
                    assert job is not None
                    if not suspend:
                        self._pass_run(self._jobset_runs, meta["uid"], self._job_runs, job["metadata"]["uid"])
                active = 1 if int((job.get("status") or {}).get("active") or 0) > 0 else 0
                done = _cond(job, "Complete")
                completed.append(done)
                statuses.append({"name": rj["name"], "active": active, "ready": 0, "succeeded": 1 if done else 0,
                                 "failed": 0, "suspended": 1 if job["spec"].get("suspend") else 0})

            def status(obj: Obj, statuses: list[Obj] = statuses, suspend: bool = suspend,
                       done: bool = bool(completed) and all(completed)) -> None:
                obj.setdefault("status", {})["replicatedJobsStatus"] = statuses
                _set_cond(obj, "Suspended", suspend, "SuspendedJobs" if suspend else "ResumeJobs")
                if done:  # the default success policy (every replicatedJob's Jobs), JobSet v0.12's words
                    obj["status"]["conditions"].append({
                        "type": "Completed", "status": "True", "reason": "AllJobsCompleted",
                        "message": "jobset completed successfully",
                        "lastTransitionTime": self.server.clock().strftime("%Y-%m-%dT%H:%M:%SZ")})
            self.server.update(JOBSET, "jobsets", ns, name, status, status=True)

    # ------------------------------------------------------------------ Job controller

    def job_sync(self) -> None:
        """Suspended Jobs: gracefully delete active pods, then active=0 at once. Running Jobs: create pods.

        A Job's pods are those carrying its uid (``controller-uid``), as the real controller selects them: a Job
        deleted and re-created under its name does not count the old one's pods (tests/contract/test_job_controller.py).

        A replacement follows the Job's ``podReplacementPolicy``, as the real controller does: with
        ``TerminatingOrFailed`` (the default) it starts as soon as the old pod has a deletionTimestamp;
        with ``Failed`` only once the old pod is in a terminal phase (whoever wrote it) or gone.

        With ``job_tracking``, each pass ends by taking the controller's finalizer off the pods it has counted and
        the orphans (``_untrack_pods``)."""
        for job in self.server.objects("batch", "jobs"):
            meta = job["metadata"]
            ns, name = meta["namespace"], meta["name"]
            # the real Job controller selects its pods by its own uid (``controller-uid``), not by name: a Job
            # deleted and re-created under one name does not count the old one's Terminating pods as its own
            pods = [p for p in self.server.objects("", "pods", ns)
                    if _labels(p).get(JOB_UID_LABEL) == meta["uid"]]
            active = [p for p in pods if not p["metadata"].get("deletionTimestamp")
                      and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
            terminating = [p for p in pods if p["metadata"].get("deletionTimestamp")
                           and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
            succeeded = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"]
            suspend = bool(job["spec"].get("suspend"))
            if meta.get("deletionTimestamp"):
                suspend = True
            if suspend:
                for p in active:
                    try:
                        self.server.delete("", "pods", ns, p["metadata"]["name"])
                    except ApiFailure:
                        pass
                active = []
            else:
                want = int(job["spec"].get("parallelism") or 1)
                occupied = active + succeeded
                if job["spec"].get("podReplacementPolicy") == "Failed":
                    occupied = occupied + terminating
                if not _cond(job, "Complete") and job["spec"].get("completionMode") == "NonIndexed":
                    # NonIndexed: pods with no completion index, made while fewer than parallelism occupy it
                    for _ in range(max(0, want - len(occupied))):
                        if self._create_pod(job, None):
                            active.append({})
                elif not _cond(job, "Complete"):
                    for index in range(want):
                        if any(_labels(p).get("batch.kubernetes.io/job-completion-index") == str(index)
                               for p in occupied):
                            continue
                        if self._create_pod(job, index):
                            active.append({})

            def status(obj: Obj, n_active: int = len(active), n_term: int = len(terminating),
                       suspend: bool = suspend, done: bool = bool(succeeded) and
                       len(succeeded) >= int(job["spec"].get("parallelism") or 1)) -> None:
                st = obj.setdefault("status", {})
                st["active"] = n_active
                st["terminating"] = n_term
                _set_cond(obj, "Suspended", suspend, "JobSuspended" if suspend else "JobResumed")
                if done:
                    _set_cond(obj, "Complete", True, "Completed")
            try:
                self.server.update("batch", "jobs", ns, name, status, status=True)
            except ApiFailure:
                pass
        if self.job_tracking:
            self._untrack_pods()

    def _untrack_pods(self) -> None:
        """The Job controller takes its ``batch.kubernetes.io/job-tracking`` finalizer off each pod it is done with
        (v1.37's ``trackJobStatusAndRemoveFinalizers`` and ``syncOrphanPod``):

        * a pod of a Job that exists and has not finished, once the pod is terminal (Succeeded or Failed) or being
          deleted (it counts a deleted pod as failed);
        * an orphan: a pod whose controlling owner reference is gone (``kubectl delete job --cascade=orphan``
          removes it) or names a Job that no longer exists, or has finished; whatever the pod's state. Not while
          ``job_controller_misses_orphans``.

        A pod controlled by anything but a Job keeps it. The real controller, under ``podReplacementPolicy:
        Failed``, waits for a deleted pod's Failed phase (its kubelet's, or PodGC's for a pod never scheduled)
        before it counts it; the fake counts it at its deletion. The API server lets a deleted pod go once its
        last finalizer is gone and its grace period is over."""
        jobs = {(j["metadata"]["namespace"], j["metadata"]["uid"]): j for j in self.server.objects("batch", "jobs")}
        for pod in self.server.objects("", "pods"):
            meta = pod["metadata"]
            if JOB_TRACKING_FINALIZER not in (meta.get("finalizers") or []):
                continue
            ref = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
            if ref is not None and (ref.get("kind") != "Job" or ref.get("apiVersion") != "batch/v1"):
                continue
            job = jobs.get((meta["namespace"], str(ref.get("uid")))) if ref is not None else None
            if job is not None and not (_cond(job, "Complete") or _cond(job, "Failed")):
                done = (meta.get("deletionTimestamp") is not None
                        or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"))
            else:
                done = not self.job_controller_misses_orphans
            if not done:
                continue

            def untrack(obj: Obj) -> None:
                obj["metadata"]["finalizers"] = [f for f in obj["metadata"].get("finalizers") or []
                                                 if f != JOB_TRACKING_FINALIZER]
                if not obj["metadata"]["finalizers"]:
                    del obj["metadata"]["finalizers"]
            with contextlib.suppress(ApiFailure):
                self.server.update("", "pods", meta["namespace"], meta["name"], untrack, status=None, admit=False)

    def _create_pod(self, job: Obj, index: int | None) -> bool:
        """A pod of ``job``: its completion ``index`` labelled (None: a NonIndexed Job's pod, which has none)."""
        self._pod_seq += 1
        template = job["spec"]["template"]
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        labels["batch.kubernetes.io/job-name"] = job["metadata"]["name"]
        labels[JOB_UID_LABEL] = labels["controller-uid"] = job["metadata"]["uid"]
        if index is not None:
            labels["batch.kubernetes.io/job-completion-index"] = str(index)
        spec = copy.deepcopy(template.get("spec") or {})
        finalizers = list((template.get("metadata") or {}).get("finalizers") or [])
        if self.job_tracking and JOB_TRACKING_FINALIZER not in finalizers:
            finalizers.append(JOB_TRACKING_FINALIZER)  # the real controller appends it to every pod it makes
        body = {
            "metadata": {"name": f"{job['metadata']['name']}-{'x' if index is None else index}-{self._pod_seq:05d}",
                         "labels": labels,
                         "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
                         "finalizers": finalizers,
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                              "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
                                              "controller": True}]},
            "spec": spec,
            "status": {"phase": "Pending"},
        }
        try:
            made = self._create_content("", "pods", job["metadata"]["namespace"], body)
        except ApiFailure as exc:
            if exc.code != 403:
                raise
            # Refused by an admission webhook (dispatch's guard): the real Job controller records a
            # FailedCreate Event and syncs the Job again later; here, the next pass tries again.
            self.refused_pods.append((job["metadata"]["name"], index, exc.message))
            return False
        if made is None:
            return False
        self._pass_run(self._job_runs, job["metadata"]["uid"], self._pod_runs, made["metadata"]["uid"])
        return True

    def _create_content(self, group: str, plural: str, namespace: str, obj: Obj, *, admit: bool = True
                        ) -> Obj | None:
        """A controller's create of a namespace's content; None if the API server refused it because the
        namespace is being deleted or is gone (``FakeApiServer.terminate_namespace``): the real controller's
        create fails the same way and is tried again on a later pass."""
        try:
            return self.server.create(group, plural, namespace, obj, admit=admit)
        except ApiFailure as exc:
            if exc.details.get("kind") == "namespaces" or any(
                    c.get("reason") == "NamespaceTerminating" for c in exc.causes):
                return None
            raise

    @staticmethod
    def _pass_run(source: dict[str, tuple[str, int]], owner: str, target: dict[str, tuple[str, int]],
                  uid: str) -> None:
        """A layer built from its owner's current template belongs to the owner's current run."""
        if owner in source:
            target[uid] = source[owner]

    # ------------------------------------------------------------------ scheduler, kubelets, PodGC

    def schedule(self) -> None:
        """Bind pending pods to Ready nodes, round robin."""
        nodes = [n["metadata"]["name"] for n in self.server.objects("", "nodes")
                 if n["metadata"]["name"] not in self.frozen
                 and not any(t.get("key") == OUT_OF_SERVICE_TAINT for t in (n.get("spec") or {}).get("taints")
                             or [])]
        if not nodes:
            return
        i = 0
        for pod in self.server.objects("", "pods"):
            if pod["spec"].get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            wanted = (pod["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname")
            if wanted is not None and wanted not in nodes:
                continue
            node = wanted or nodes[i % len(nodes)]
            i += 1

            def bind(obj: Obj, node: str = node) -> None:
                obj["spec"]["nodeName"] = node
            self.server.update("", "pods", pod["metadata"]["namespace"], pod["metadata"]["name"], bind,
                               status=None)

    def kubelet_sync(self, *, honour_grace: bool = True) -> None:
        """Every reachable node's kubelet: start bound pods, finish requested ones, and confirm the
        termination of deleted pods once their grace period has passed (all at once if not honoured)."""
        for pod in self.server.objects("", "pods"):
            meta, spec = pod["metadata"], pod["spec"]
            node = spec.get("nodeName")
            if not node or node in self.frozen or node in self.machines_gone:
                continue
            ns, name = meta["namespace"], meta["name"]
            phase = (pod.get("status") or {}).get("phase")
            uid = meta["uid"]
            if node in self.partitioned:
                # Cut off: it sees nothing written since, and restarts a crashed container by policy.
                if uid in self._crashed and uid not in self._processes and self._may_restart(pod):
                    self._crashed.pop(uid)
                    self._start(pod)
                continue
            if phase in ("Succeeded", "Failed") and uid in self._crashed:
                code = self._crashed.pop(uid)  # a terminal pod's containers never start again, once it knows
                if node in self.back and self._restart_action(pod, code):
                    self._start(pod)  # ... but its first sync back still restarts it (observed), then stops it
                    self._kubelet_stopped(pod, phase, 137)
                    continue
                self._sandbox_gone(pod)
            if phase in ("Succeeded", "Failed") and any(
                    "running" in (c.get("state") or {})
                    for c in (pod.get("status") or {}).get("ephemeralContainerStatuses") or []):
                self._kubelet_stopped(pod, phase, 137)  # a terminal pod's ``kubectl debug`` container is killed too
                continue
            if meta.get("deletionTimestamp"):
                # The first deadline it saw holds: a later delete with a shorter grace (PodGC's grace 0 of an
                # orphaned pod) does not hurry a kill already under way (seen on kubelet v1.37.2, issue 40).
                deadline = self._kill_deadline.setdefault(
                    uid, datetime.fromisoformat(meta["deletionTimestamp"].replace("Z", "+00:00")))
                if honour_grace and self.now < deadline:
                    continue
                self.confirm_termination(name, ns)
                continue
            if meta["uid"] in self._finish_requested and phase == "Running":
                final = self._finish_requested.pop(meta["uid"])
                self._kubelet_stopped(pod, final, 0 if final == "Succeeded" else 1)
                continue
            if phase in ("Succeeded", "Failed") and meta["uid"] in self._processes:
                # Someone else wrote a terminal phase (PodGC, Kueue): the kubelet stops the containers.
                self._kubelet_stopped(pod, phase, 137)
                continue
            if phase == "Running" and uid in self._crashed and uid not in self._processes:
                if self._may_restart(pod):
                    self._crashed.pop(uid)

                    def restart(obj: Obj, node: str = node) -> None:
                        st = obj.setdefault("status", {})
                        st["containerStatuses"] = [
                            {"name": c.get("name", ""), "restartCount": self._restarts(obj, c.get("name", "")) + 1,
                             "state": {"running": {"startedAt": self.kubelet_time(node)}}}
                            for c in (obj.get("spec") or {}).get("containers") or []]
                        self._set_kubelet_conditions(obj, node, PodReadyToStartContainers=True)
                    self.server.update("", "pods", ns, name, restart, status=True)
                    self._start(pod)
                continue
            if phase == "Pending" and (pod.get("status") or {}).get("startTime") is None:
                if node in self._rejecting:
                    self._reject(pod, *self._rejecting[node])
                    continue
                inits = [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") != "Always"]
                if inits and node in self._init_hangs:
                    def initialising(obj: Obj, inits: list[Obj] = inits, node: str = node) -> None:
                        st = obj.setdefault("status", {})
                        st["startTime"] = self.kubelet_time(node)
                        st["initContainerStatuses"] = [
                            {"name": c.get("name", ""), "state": {"running": {"startedAt": self.kubelet_time(node)}}
                             if i == 0 else {"waiting": {"reason": "PodInitializing"}}} for i, c in enumerate(inits)]
                        self._set_kubelet_conditions(obj, node, PodReadyToStartContainers=True, Initialized=False,
                                                     ContainersReady=False)
                        st["containerStatuses"] = [
                            {"name": c.get("name", ""), "state": {"waiting": {"reason": "PodInitializing"}}}
                            for c in (obj.get("spec") or {}).get("containers") or []]
                    self.server.update("", "pods", ns, name, initialising, status=True)
                    continue

                def run(obj: Obj, inits: list[Obj] = inits, node: str = node) -> None:
                    st = obj.setdefault("status", {})
                    st["phase"] = "Running"
                    st["startTime"] = self.kubelet_time(node)
                    if inits:
                        st["initContainerStatuses"] = [
                            {"name": c.get("name", ""),
                             "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}} for c in inits]
                    st["containerStatuses"] = [{"name": c.get("name", ""),
                                                "state": {"running": {"startedAt": self.kubelet_time(node)}}}
                                               for c in (obj.get("spec") or {}).get("containers") or []]
                    self._set_kubelet_conditions(obj, node, PodReadyToStartContainers=True, Initialized=True,
                                                 ContainersReady=True)
                self.server.update("", "pods", ns, name, run, status=True)
                self._start(pod)
        for node in [n for n in self.back if n not in self.frozen and n not in self.partitioned]:
            self.back.discard(node)
            # A pod deleted from the API while it was cut off is still in its kubelet's memory on that first
            # sync: a crashed container of it is started once more too, before the kubelet hears of it.
            for uid, pod in self.cut_off_pods.pop(node, {}).items():
                now = self.server.get("", "pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
                if uid in self._crashed and uid not in self._processes and self._may_restart(pod) and (
                        now is None or now["metadata"]["uid"] != uid):
                    self._crashed.pop(uid)
                    self._start(pod)
                    self._end(self._processes[uid])

    def _may_restart(self, pod: Obj) -> bool:
        """Whether the kubelet restarts the pod's crashed container (its last exit code in ``_crashed``)."""
        return bool(self._restart_action(pod, self._crashed.get(pod["metadata"]["uid"], 1)))

    @staticmethod
    def _restart_action(pod: Obj, exit_code: int) -> str:
        """What a real kubelet (1.35 to 1.38, ``ContainerShouldRestart``) does after the pod's containers exit
        with ``exit_code``: ``"RestartAllContainers"``, ``"Restart"`` or ``""``. Per container: its
        ``restartPolicyRules`` first, only when it sets its own ``restartPolicy`` (the first rule whose exit
        codes match acts; an unknown operator matches nothing, an unknown action falls through), then its own
        ``restartPolicy``, then the pod's. The fake runs one process per pod: it restarts when any container
        would."""
        spec = pod.get("spec") or {}
        pod_policy = spec.get("restartPolicy") or "Always"
        out = ""
        for c in spec.get("containers") or []:
            own = c.get("restartPolicy")
            action = ""
            if own:
                for rule in c.get("restartPolicyRules") or []:
                    codes = rule.get("exitCodes") or {}
                    found = exit_code in (codes.get("values") or [])
                    matched = found if codes.get("operator") == "In" else (
                        not found if codes.get("operator") == "NotIn" else False)
                    if matched and rule.get("action") in ("Restart", "RestartAllContainers"):
                        action = str(rule["action"])
                        break
            if not action:
                policy = own or pod_policy
                action = "Restart" if policy == "Always" or (policy == "OnFailure" and exit_code != 0) else ""
            if action == "RestartAllContainers" or not out:
                out = action or out
        return out

    def _reject(self, pod: Obj, reason: str, message: str) -> None:
        """What a real kubelet's admission rejection writes (reference: real-node-statuses A, B, C2):
        phase, reason, message, qosClass and startTime; no conditions (even the binding's PodScheduled
        goes) and no container statuses. The pod never runs."""
        def rejected(obj: Obj) -> None:
            obj["status"] = {"phase": "Failed", "reason": reason, "message": "Pod was rejected: " + message,
                             "qosClass": "BestEffort",
                             "startTime": self.kubelet_time((pod.get("spec") or {}).get("nodeName"))}
        self.server.update("", "pods", pod["metadata"]["namespace"], pod["metadata"]["name"], rejected, status=True)

    def _sandbox_gone(self, pod: Obj) -> None:
        """The kubelet tears down a terminal pod whose containers are not running: its sandbox goes, and it
        reports ``PodReadyToStartContainers=False`` (a real kubelet did so once it learned a Failed phase
        written by someone else)."""
        node = (pod.get("spec") or {}).get("nodeName")

        def gone(obj: Obj) -> None:
            self._set_kubelet_conditions(obj, node, PodReadyToStartContainers=False)
        with contextlib.suppress(ApiFailure):
            self.server.update("", "pods", pod["metadata"]["namespace"], pod["metadata"]["name"], gone, status=True)

    def _set_kubelet_conditions(self, obj: Obj, node: str | None, **states: bool) -> None:
        """Set the kubelet's own pod conditions (``PodReadyToStartContainers``, ``Initialized``,
        ``ContainersReady``) as a real kubelet does: a changed status gets a new ``lastTransitionTime``, in
        its node's clock."""
        conds = obj.setdefault("status", {}).setdefault("conditions", [])
        for ctype, ok in states.items():
            value = "True" if ok else "False"
            found = next((c for c in conds if c.get("type") == ctype), None)
            if found is None:
                conds.append({"type": ctype, "status": value, "lastTransitionTime": self.kubelet_time(node)})
            elif found.get("status") != value:
                found.update(status=value, lastTransitionTime=self.kubelet_time(node))

    def _kubelet_stopped(self, pod: Obj, phase: str, exit_code: int) -> None:
        """The kubelet reports the pod's containers stopped, as a real one does on its way out: a
        terminal phase (one already terminal is kept); a container it stopped terminated with
        ``exit_code``; one already terminated kept; one that never started (the pod was rejected, or
        its image never came) ``ContainerStatusUnknown``/137 by its last step; and, if the pod never
        finished its init containers, the running init container killed while the containers stay
        ``waiting: PodInitializing`` for good. Its sandbox goes (``PodReadyToStartContainers=False``), and
        every time it writes is its node's clock, as in each recorded real ending. The process ends."""
        meta = pod["metadata"]
        running = meta["uid"] in self._processes
        node = (pod.get("spec") or {}).get("nodeName")

        def stopped(obj: Obj) -> None:
            st = obj.setdefault("status", {})
            if st.get("phase") not in ("Succeeded", "Failed"):
                st["phase"] = phase
            old = {c.get("name"): c for c in st.get("containerStatuses") or []}
            inits = st.get("initContainerStatuses") or []
            # the kubelet's hasPodInitialized: every init container exited 0
            initialised = all(((c.get("state") or {}).get("terminated") or {}).get("exitCode") == 0 for c in inits)
            self._set_kubelet_conditions(obj, node, PodReadyToStartContainers=False, ContainersReady=False)
            for c in st.get("ephemeralContainerStatuses") or []:  # killed with the pod (TerminatePod leaves them)
                state = c.get("state") or {}
                if "running" in state:
                    c["state"] = {"terminated": {"exitCode": 137, "reason": "Error",
                                                 "startedAt": (state.get("running") or {}).get("startedAt"),
                                                 "finishedAt": self.kubelet_time(node)}}
            if not initialised:
                # as recorded (init-then-deleted-held): the running init container killed, Error/137, with
                # its start and end; the containers stay waiting; Initialized stays False
                for c in inits:
                    state = c.get("state") or {}
                    if "running" in state:
                        started = (state.get("running") or {}).get("startedAt")
                        c["state"] = {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": started,
                                                     "finishedAt": self.kubelet_time(node)}}
                self._set_kubelet_conditions(obj, node, Initialized=False)
                return
            out = []
            for c in (obj.get("spec") or {}).get("containers") or []:
                name = c.get("name", "")
                state = (old.get(name) or {}).get("state") or {}
                if "terminated" in state and not running:
                    out.append(old[name])
                elif "running" in state or running:
                    out.append({"name": name, "state": {"terminated": {"finishedAt": self.kubelet_time(node),
                                                                       "exitCode": exit_code, "reason": "Error"
                                                                       if exit_code else "Completed"}}})
                else:
                    out.append({"name": name, "state": {"terminated": {
                        "exitCode": 137, "reason": "ContainerStatusUnknown", "message": TERMINATED_BY_KUBELET}}})
            st["containerStatuses"] = out
        try:
            self.server.update("", "pods", meta["namespace"], meta["name"], stopped, status=True)
        except ApiFailure:
            pass
        proc = self._processes.get(meta["uid"])
        if proc:
            self._end(proc)

    def confirm_termination(self, pod: str, namespace: str | None = None) -> None:
        """The kubelet confirms a deleted pod's containers stopped: it writes a terminal phase (Failed,
        unless it had already ended) with every container terminated, the process ends, and the object
        goes (or stays, Failed, while a finalizer holds it)."""
        ns = namespace or self.namespace
        obj = self.server.get("", "pods", ns, pod)
        if obj is None:
            return
        states = [(c.get("state") or {}) for c in (obj.get("status") or {}).get("containerStatuses") or []]
        if obj["metadata"]["uid"] in self._processes or \
                (obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed") or \
                not states or any("terminated" not in s for s in states):
            self._kubelet_stopped(obj, "Failed", 137)
        try:
            self.server.delete("", "pods", ns, pod, grace=0)
        except ApiFailure:
            pass

    def finish_pod(self, pod: str, phase: str = "Succeeded", namespace: str | None = None) -> None:
        """Ask the pod's kubelet to end it in ``phase`` (takes effect on its next sync)."""
        obj = self.server.get("", "pods", namespace or self.namespace, pod)
        if obj is not None:
            self._finish_requested[obj["metadata"]["uid"]] = phase

    def force_delete(self, pod: str, namespace: str | None = None) -> None:
        """``kubectl delete --force --grace-period=0``. On a reachable node the kubelet kills it (and
        reports so); on a lost node (frozen, or partitioned: its kubelet hears nothing from the API until it
        is back) it may run on. A finalizer keeps the object, with a deletionTimestamp."""
        ns = namespace or self.namespace
        obj = self.server.get("", "pods", ns, pod)
        if obj is None:
            return
        self.server.delete("", "pods", ns, pod, grace=0)
        node = obj["spec"].get("nodeName")
        if node and node not in self.frozen and node not in self.machines_gone and node not in self.partitioned:
            self._kubelet_stopped(obj, "Failed", 137)

    def mark_failed(self, pod: str, namespace: str | None = None, *, reason: str = "DeletionByPodGC") -> None:
        """Someone other than the kubelet writes ``phase: Failed``: PodGC (a ``DisruptionTarget``
        condition with ``reason``), or, with ``reason="KueueForcefullyDeleted"``, Kueue's failure
        recovery (its own ``KueueFailureRecovery`` condition). The container states stay as they were.
        A pod already Succeeded or Failed is left as it is: PodGC patches the phase and condition only of a
        pod not yet terminal (``markFailedAndDeletePodWithCondition`` in its controller), so it never puts a
        condition that says "not its kubelet" over an end its kubelet reported."""
        ns = namespace or self.namespace
        ctype = "KueueFailureRecovery" if reason == "KueueForcefullyDeleted" else "DisruptionTarget"

        def failed(obj: Obj) -> None:
            st = obj.setdefault("status", {})
            if st.get("phase") in ("Succeeded", "Failed"):
                return
            st["phase"] = "Failed"
            st.setdefault("conditions", []).append({"type": ctype, "status": "True", "reason": reason,
                                                    "lastTransitionTime": _now_text(self.now)})
        if self.server.get("", "pods", ns, pod) is not None:
            self.server.update("", "pods", ns, pod, failed, status=True)

    def _podgc_failed(self, pod: str, namespace: str) -> None:
        """PodGC's out-of-service and never-scheduled paths (``markFailedAndDeletePod``, v1.37.2): phase Failed and
        nothing else, no condition, the containers as they were."""
        def failed(obj: Obj) -> None:
            st = obj.setdefault("status", {})
            if st.get("phase") not in ("Succeeded", "Failed"):
                st["phase"] = "Failed"
        with contextlib.suppress(ApiFailure):
            self.server.update("", "pods", namespace, pod, failed, status=True)

    ORPHAN_QUARANTINE = 40.0
    """Seconds PodGC waits after it finds a pod's Node missing before it deletes the pod (``quarantineTime``
    in its controller; seen on the testbed: ~40 s after ``kubectl delete node``)."""

    def pod_gc(self) -> None:
        """PodGC: pods of a Node missing for ``ORPHAN_QUARANTINE`` seconds (whether or not its machine still
        runs) are marked Failed with ``DisruptionTarget``/``DeletionByPodGC`` (``gcOrphaned``), Terminating pods
        on not-Ready out-of-service nodes Failed with no condition (``gcTerminating``), as the real PodGC writes
        them (v1.37.2); each is then force-deleted. A deleted pod never scheduled (its delete had no grace
        period; a finalizer keeps it) is marked Failed with no condition (``gcUnscheduledTerminating``; seen on
        the testbed within one 20 s pass: tests/contract/test_podgc_unscheduled.py)."""
        nodes = {n["metadata"]["name"]: n for n in self.server.objects("", "nodes")}
        for name in [n for n in self._orphaned_at if n in nodes]:
            del self._orphaned_at[name]
        for pod in self.server.objects("", "pods"):
            node = pod["spec"].get("nodeName")
            if not node:
                if pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in (
                        "Succeeded", "Failed"):
                    self._podgc_failed(pod["metadata"]["name"], pod["metadata"]["namespace"])
                continue
            nobj = nodes.get(node)
            if nobj is None:
                since = self._orphaned_at.setdefault(node, self.now)
                if (self.now - since).total_seconds() < self.ORPHAN_QUARANTINE:
                    continue
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            oos = nobj is not None and any(t.get("key") == OUT_OF_SERVICE_TAINT
                                           for t in (nobj.get("spec") or {}).get("taints") or [])
            ready = nobj is not None and any(c.get("type") == "Ready" and c.get("status") == "True"
                                             for c in (nobj.get("status") or {}).get("conditions") or [])
            if nobj is None or (oos and not ready and pod["metadata"].get("deletionTimestamp")):
                if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                    if nobj is None:
                        self.mark_failed(name, ns)
                    else:
                        self._podgc_failed(name, ns)
                if not (pod["metadata"].get("deletionTimestamp")
                        and int(pod["metadata"].get("deletionGracePeriodSeconds") or 0) == 0):
                    try:
                        self.server.delete("", "pods", ns, name, grace=0)
                    except ApiFailure:
                        pass  # gone already

    def step(self, *, honour_grace: bool = True) -> None:
        """One pass of every controller, in the order a healthy cluster converges."""
        self.trainer_sync()
        self.jobset_sync()
        self.job_sync()
        self.schedule()
        self.kubelet_sync(honour_grace=honour_grace)
        self.pod_gc()
        self.job_sync()
        self.jobset_sync()

    def settle(self, rounds: int = 4, *, honour_grace: bool = True) -> None:
        for _ in range(rounds):
            self.step(honour_grace=honour_grace)

    def pods(self, obj_name: str | None = None) -> list[Obj]:
        return [p for p in self.server.objects("", "pods", self.namespace)
                if obj_name is None or _labels(p).get(JOBSET_NAME_LABEL) == obj_name]


TRAINER_CONTROLLER = "trainer.kubeflow.org/trainjob-controller"
JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
"""The label the Job controller puts on every pod of a Job (with the legacy ``controller-uid``) and selects by."""
