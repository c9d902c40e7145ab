"""Every writer at once, under random schedules: the promise against all of them together.

The Kueue-mode machine (``test_stateful_kueue``: the controller one Workload at a time, in batches with
fresh, stale or no hints, two replicas deciding at once, a replica dying between raising A and setting
Ready, its finalizer keeper; Kueue admitting, preempting and re-reserving quota while pods are still
Terminating; the cluster's controllers stepped one layer at a time; nodes frozen, thawed, tainted
out-of-service, deleted and replaced; pods finishing and force-deleted on reachable and frozen nodes;
injected API errors) gains every other writer here:

* dispatch's plain-mode writers: a sync ``Adapter`` (release, hold, close, re-open, inspect, ceased, an
  open of the same submission under another name), two ``AsyncAdapter`` releases at once, an async release
  beside a controller decision, and a release with a cluster event (or Kueue, or another writer) landing
  between its read and its write;
* Kueue managing objects with the queue-name label, with the label removed while suspended, and without
  one under ``manageJobsWithoutQueueName`` (each object's way is drawn per example), Kueue's job
  reconciler creating and releasing Workloads and suspending what it did not admit, and evicting a
  Workload that a writer deactivated;
* a bypassing writer (``kubectl patch`` of ``spec.suspend=false``, bare or with the ``started`` mark a
  careful forger would add) that only dispatch's guard stands against: the guard's decision judges every
  TrainJob write, and refuses the bypass's; per example, it refuses everyone's (as deployed) or records
  what it would refuse of dispatch's and Kueue's own writes (so the rule of the writers is tested without
  the guard behind it; its pod webhook refuses as deployed in every example);
* replies lost after the server applied the write, on records and TrainJobs;
* kubelets as real ones end pods (issue 23): a kubelet that rejects pods at admission, pods whose init
  containers never finish, containers that crash and are restarted under OnFailure, a node partitioned
  from the API server whose kubelet goes on restarting them, and Kueue's failure recovery writing Failed
  over such a pod and force-deleting it;
* issue 25's writers: pod label and finalizer writers, record writers, other managers' runtime patch
  entries (and issue 35's: entries carrying a strategic-merge directive), enrolment collisions, a lagging
  garbage collector, runtime edits after ``open`` (JobSet's webhook keeping a JobSet as it was built),
  interrupted closes, and the namespace deleted (the namespace
  controller deleting its content, dispatch's finalizer holding it Terminating while a pod may run) and
  re-created, its submissions opened again.

Liveness: when a schedule ends, faults stop (partitions heal, frozen nodes not declared down thaw,
kubelets admit again, API errors end) and the cluster runs a bounded number of rounds. Then every object
whose processes are all gone must be proven ceased, or its status must name an action (an admin command)
that, taken, proves it, and a namespace being deleted must be gone; a stall only an undocumented action
ends fails the machine.

Every client holds exactly the shipped roles. After every step the strict history checker
(``dispatch.testing.History.check``) asserts: no two executions of one submission alive at once whatever
their A and TrainJob name, no two processes of one rank of one execution, every pod of an execution
carrying the A its TrainJob reported, and A rising from one execution to the next; and
``an_a_is_issued_once`` that no A a record issued was issued to two TrainJobs, across the namespace's lives.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import os
import random
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from dispatch import Adapter, AsyncAdapter, DispatchError, InvalidInput, JobSpec, NotFound, PodsRemain, Refused
from dispatch import _api as api
from dispatch import _kube as k
from dispatch import _names as n
from dispatch._identity import record_name
from dispatch._views import POD_FINALIZER, PodView
from dispatch.controller._events import EventRecorder
from dispatch.controller._finalizers import FinalizerKeeper
from dispatch.controller._guard import Guard
from dispatch.controller._metrics import Metrics
from dispatch.controller._reconcile import Reconciler
from dispatch.controller.testing import FakeGuard, FakeKueue
from dispatch.testing import ApiFailure, FakeCluster

from .test_stateful_kueue import NODES, OBJECTS, NeverTwoExecutionsUnderKueue
from .test_stateful_kueue import _step as kueue_walk_step

NS = "default"
EDITOR = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: namespace-editor}
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get", "list", "patch", "update", "delete"]
"""
"""A pod editor beside dispatch (as Kubernetes' own ``edit`` role): only the ``dispatch-pods`` policy stops it."""
WRITER = ("dispatch-writer", "dispatch-node-reader")
"""dispatch's library, and the bypassing ``kubectl`` user: exactly the shipped writer role."""
ADMIN = ("dispatch-admin", "dispatch-node-reader")
"""The operator who takes the actions a status names (``dispatch admin release-pod``)."""
HEALING_ROUNDS = 3
"""Rounds of the cluster, Kueue and the finalizer keeper after faults stop: grace periods end, kubelets
confirm, the keeper deletes rejected pods and frees proven ones."""
ACTION = re.compile(r"`(?:dispatch admin release-pod ([a-z0-9.-]+) (--process-gone|--node-confirmed-down)|"
                    r"kubectl delete pod ([a-z0-9.-]+))`")
WAYS = ("plain", "kueue", "kueue-unlabelled", "kueue-without-queue-name")
"""How an object is managed: by dispatch alone; by Kueue through the queue-name label; through the label,
removed while suspended; or without a label by a Kueue with ``manageJobsWithoutQueueName``."""
RELEASE_BOUNDARIES = (0, 1, 2, 8, 9, 10, 12)
"""Where ``release_with_event_inside`` lands its event, as the count of the release's requests sent before it. An
admitting plain release sends the TrainJob's get (1), then every other read at once (its Workload, runtime, record,
JobSets and Jobs: 7), the two pod lists (pinned one after the other), then the floor, the record and the raise that
starts (the writes): so before the release, between the TrainJob and the rest, among the reads sent together,
after them, between the pod lists, after the consistent read, and between the record's A and the TrainJob's."""
EXAMPLES = int(os.environ.get("DISPATCH_EVERY_WRITER_EXAMPLES", "2000" if os.environ.get("CI") else "100"))

def _to_its_end(work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``work`` to its end: here, or, when a cluster event lands inside a request the fake serves to a client
    whose loop is running (``release_with_event_inside``), on a loop of a thread of its own, as the controller
    runs beside that client."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(work())
        return
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: asyncio.run(work())).result()


def _directive_entry(pod: dict[str, Any] | None = None, *, job: dict[str, Any] | None = None,
                     jobset: dict[str, Any] | None = None) -> Callable[[str], dict[str, Any]]:
    def make(manager: str) -> dict[str, Any]:
        rj: dict[str, Any] = {"name": "node", "template": {"spec": {"template": copy.deepcopy(pod or {})}}}
        if job is not None:
            rj["template"]["metadata"] = {"labels": dict(job)}
        template: dict[str, Any] = {"spec": {"replicatedJobs": [rj]}}
        if jobset is not None:
            template["metadata"] = {"labels": dict(jobset)}
        return {"manager": manager, "trainingRuntimeSpec": {"template": template}}
    return make


DIRECTIVE_ENTRIES: dict[str, Callable[[str], dict[str, Any]]] = {
    "pod-labels-replace": _directive_entry({"metadata": {"labels": {"$patch": "replace", "team": "a"}}}),
    "pod-labels-delete": _directive_entry({"metadata": {"labels": {"$patch": "delete"}}}),
    "job-labels-replace": _directive_entry(job={"$patch": "replace"}),
    "jobset-labels": _directive_entry(jobset={"$patch": "replace"}),
    "node-selector-delete": _directive_entry({"spec": {"nodeSelector": {"$patch": "delete"}}}),
}
"""Runtime patch entries with a strategic-merge directive where the CRD keeps it and Trainer's merge reads it
(issue 35, item 1), by the manager that writes them."""

SEEN: Counter[str] = Counter()
"""What the schedules reached (the walks assert it, so a machine that stops reaching them fails)."""

TRAINER = n.TRAINER_GROUP


class EveryWriter(NeverTwoExecutionsUnderKueue):
    """The Kueue-mode machine with every other writer added."""

    adapter: Adapter
    guard: FakeGuard

    def setup(self) -> None:
        """Not a step here: ``setup_every_writer`` draws how each object is managed."""
        raise AssertionError("EveryWriter starts with setup_every_writer")

    @initialize(ways=st.tuples(*(st.sampled_from(WAYS) for _ in OBJECTS)), guard_everyone=st.booleans(),
                init_containers=st.booleans(), liveness=st.booleans(), gc_lag=st.booleans())
    def setup_every_writer(self, ways: tuple[str, ...], guard_everyone: bool, init_containers: bool = False,
                           liveness: bool = True, gc_lag: bool = False) -> None:
        self.ways = dict(zip(OBJECTS, ways, strict=True))
        self.liveness = liveness  # half the examples end with the healing phase (it doubles an example's cost)
        self.cluster = FakeCluster()
        self.cluster.server.gc_lag = gc_lag  # garbage collection waits for the garbage_collector rule
        self.cluster.install_jobset_webhook()  # a JobSet's replicatedJobs never change (runtime edits)
        self.cluster.add_runtime(replacement_policy="Failed")
        # issue 35 item 6: a runtime a platform team wrote with a NonIndexed node Job
        self.cluster.add_runtime("torch-bag", replacement_policy="Failed", completion_mode="NonIndexed")
        if init_containers:  # as Trainer's Flux runtime injects one
            def with_init(obj: dict[str, Any]) -> None:
                for rj in obj["spec"]["template"]["spec"]["replicatedJobs"]:
                    rj["template"]["spec"]["template"]["spec"]["initContainers"] = [
                        {"name": "installer", "image": "example.invalid/installer"}]
            self.cluster.server.update(TRAINER, "clustertrainingruntimes", "", "torch-distributed", with_init,
                                       status=None)
        for node in ("node-0", "node-1", "node-2"):
            self.cluster.add_node(node)
        sync = self.cluster.kubelet_sync

        def kubelet_sync_after_the_controller_saw(*, honour_grace: bool = True) -> None:
            """The installed controller's pod watch sees a terminal mark someone else wrote (Kueue, PodGC, any
            writer) and records it (MarkSeen) before the pod's kubelet acts on it at its next sync: "written
            after the mark" is ordered by the pod's resourceVersion (issue 35), so only a record before the
            kubelet's write lets the operator's word count. (A kubelet that wins that race, or a mark written
            while no controller runs, leaves only a shut-down node's word: tests/fake/test_process_gone.py.)"""
            if any(PodView.from_obj(p).needs_mark_record for p in self.cluster.pods()):
                _to_its_end(self._release_finalizers)
            sync(honour_grace=honour_grace)
        self.cluster.kubelet_sync = kubelet_sync_after_the_controller_saw  # type: ignore[method-assign]
        self.kueue = FakeKueue(self.cluster, manage_jobs_without_queue_name="kueue-without-queue-name" in ways)
        self.kueue.install()
        self.bypassing = False
        self.guard_everyone = guard_everyone
        # The pod webhook refuses as deployed in every example: only the TrainJob writes of dispatch and Kueue are
        # judged without the webhook behind them. Pods are the Job controller's, which starts a re-created Job's
        # pod beside the old one's (it counts a Job's pods by the Job's uid, issue 35); without the pod webhook
        # that is the guard-less limit docs/concepts/limits.md names, not a writer's rule to keep.
        self.guard = FakeGuard(self.cluster, enforce=lambda: self.guard_everyone or self.bypassing,
                               enforce_pods=lambda: True)
        self.guard.install()
        self.tainted: set[str] = set()
        self.workloads: dict[str, str] = {}
        self.interrupted: set[str] = set()
        """Objects whose close was interrupted after it released the claim (a later close finishes it)."""
        self.issued: dict[tuple[str, str, int], tuple[str, int]] = {}
        """(job-id, submission, A) -> the uid it was issued to and the namespace's life it was issued in."""
        self.lives = [0]
        """The history clock when each life of the namespace began (the first at 0; then each re-creation)."""
        self.adapter = Adapter.connect(NS, transport=self.cluster.transport(roles=WRITER))
        self.adapter.core.settle_seconds = 0  # nothing else steps while a writer waits here: wall time only
        for name in OBJECTS:
            self.adapter.open(self.spec(name))
        self._kueue_jobs()                 # Kueue makes the Workloads; then labels go from those that lose them
        for name in OBJECTS:
            if self.ways[name] == "kueue-unlabelled":
                self._strip_queue_label(name)
        self.stale = self._cache()
        self.stale_versions = self._versions()

    def spec(self, name: str, *, alias: str = "") -> JobSpec:
        job_id, submission = name.split("-")
        queue = "lq-dispatch" if self.ways[name] in ("kueue", "kueue-unlabelled") else None
        return JobSpec(job_id=job_id, submission=submission, num_nodes=2, queue=queue,
                       name=f"{name}-{alias}" if alias else None)

    def teardown(self) -> None:
        if hasattr(self, "cluster") and self.liveness:
            self.faults_stop_and_every_ended_object_becomes_admissible()
            per: dict[tuple[str, ...], set[object]] = {}
            for p in self.cluster.history.processes:
                per.setdefault(p.subject, set()).add(p.execution)
            SEEN["re-admitted"] += sum(len(e) - 1 for e in per.values())
            SEEN["executions"] += sum(len(e) for e in per.values())
            SEEN["guard-unenforced"] += len(self.guard.unenforced)
            SEEN["kueue-admitted"] += len(self.kueue.admitted)
        if hasattr(self, "cluster"):
            self._count_runtime_edits_and_lives()
        adapter = getattr(self, "adapter", None)
        if adapter is not None:
            adapter.shutdown()

    # ------------------------------------------------------------------ Kueue (its job reconciler too)

    def _kueue_jobs(self) -> None:
        """Kueue's job reconciler, then the machine's map of object to Workload (which close and re-open
        change)."""
        SEEN["workloads-created"] += len(self.kueue.reconcile_jobs())
        by_uid = {(wl["metadata"].get("labels") or {}).get(n.KUEUE_JOB_UID_LABEL): wl["metadata"]["name"]
                  for wl in self.cluster.server.objects(n.KUEUE_GROUP, "workloads", NS)}
        self.workloads = {tj["metadata"]["name"]: by_uid[tj["metadata"]["uid"]]
                          for tj in self.cluster.server.objects(TRAINER, "trainjobs", NS)
                          if tj["metadata"]["uid"] in by_uid}

    def _strip_queue_label(self, name: str) -> None:
        """Someone removes the queue-name label while the TrainJob is suspended: Kueue keeps its Workload."""
        tj = self.cluster.server.get(TRAINER, "trainjobs", NS, name)
        if tj is None or not tj["spec"].get("suspend"):
            return

        def strip(obj: dict[str, Any]) -> None:
            obj["metadata"]["labels"].pop(n.KUEUE_QUEUE_LABEL, None)
        self.cluster.server.update(TRAINER, "trainjobs", NS, name, strip, status=False)
        SEEN["label-stripped"] += 1

    @rule(step=st.sampled_from(["sync", "settle", "preempt", "preempt-and-requeue", "jobs", "strip-label"]),
          name=st.sampled_from(OBJECTS))
    def kueue_step(self, step: str, name: str) -> None:
        self._kueue_jobs()
        if step == "strip-label":
            if self.ways[name] == "kueue-unlabelled":
                self._strip_queue_label(name)
        elif step != "jobs" and (name in self.workloads or step in ("sync", "settle")):
            super().kueue_step(step, name)
        self._kueue_jobs()

    async def _release_finalizers(self) -> None:
        """One pass of the controller's finalizer keeper, as the Kueue machine's, with the controller's role."""
        kube = k.Kube.connect(namespace=NS, transport=self.cluster.transport("dispatch-controller"))
        keeper = FinalizerKeeper(kube, Metrics.create())
        try:
            keeper.list_pods(self.cluster.server.objects("", "pods"))
            for etype, node in self.cluster.server.events("", "nodes"):  # as its Node informer saw them
                keeper.on_node(etype, node)
            for key in sorted(keeper.signatures):
                try:
                    await keeper.release(key)
                except DispatchError:
                    pass
        finally:
            await kube.aclose()

    @rule(mode=st.sampled_from(["one", "batch", "two-replicas", "dies-mid-admission", "finalizers"]),
          names=st.lists(st.sampled_from(OBJECTS), min_size=1, max_size=3, unique=True),
          other=st.sampled_from(OBJECTS), hints=st.sampled_from(["fresh", "stale", "none"]))
    def decide(self, mode: str, names: list[str], other: str, hints: str) -> None:
        self._kueue_jobs()
        names = [x for x in names if x in self.workloads]
        if mode != "finalizers" and not names:
            return
        if mode != "finalizers" and other not in self.workloads:
            other = names[0]
        super().decide(mode, names, other, hints)
        for wl in self.workloads.values():
            if self.kueue.entry(wl)["message"].startswith("waiting for pods"):
                SEEN["waited"] += 1

    # ------------------------------------------------------------------ dispatch's plain-mode writers

    def _call(self, fn: Callable[[], object]) -> object:
        try:
            return fn()
        except PodsRemain as exc:
            SEEN["waited"] += 1
            return exc
        except DispatchError as exc:
            return exc

    @rule(op=st.sampled_from(["release", "release", "hold", "close", "reopen", "reopen-held", "inspect",
                              "ceased", "open-alias"]), name=st.sampled_from(OBJECTS))
    def writer(self, op: str, name: str) -> None:
        a = self.adapter
        if op == "release":
            self._call(lambda: a.release(name))
        elif op == "hold":
            self._call(lambda: a.hold(name))
        elif op == "close":
            self._call(lambda: a.close(name))
            if name in self.interrupted:
                self.interrupted.discard(name)
                tj = self.cluster.server.get(TRAINER, "trainjobs", NS, name)
                if tj is None or tj["metadata"].get("deletionTimestamp"):
                    SEEN["close-interrupted-finished"] += 1
        elif op in ("reopen", "reopen-held"):
            self._call(lambda: a.open(self.spec(name), hold=op == "reopen-held"))
        elif op == "inspect":
            self._call(lambda: a.inspect(name))
        elif op == "ceased":
            self._call(lambda: a.ceased(name))
        else:  # the same submission under another TrainJob name: refused while one holds it
            self._call(lambda: a.open(self.spec(name, alias="x"), hold=False))
        if op.startswith(("reopen", "open")):
            self.interrupted.discard(name)  # the submission may be claimed again: no longer the interrupted close
        self._kueue_jobs()

    @rule(name=st.sampled_from(OBJECTS), stop=st.sampled_from(["hold", "preempt", "none"]),
          wait=st.sampled_from([0, 31]))
    def round_trip(self, name: str, stop: str, wait: int) -> None:
        """A whole stop and start in one step, so short schedules reach re-admission too: a hold (or
        Kueue's preemption), time passing, the cluster converging, a release, the check deciding, Kueue
        admitting and the cluster starting what was admitted. The checker reads the whole history, so an
        overlap inside the step is caught after it."""
        self._kueue_jobs()
        c = self.cluster
        if stop == "hold":
            self._call(lambda: self.adapter.hold(name))
        elif stop == "preempt" and name in self.workloads:
            super().kueue_step("preempt", name)
        c.advance(wait)
        c.settle(2)
        self.kueue.sync()
        self._kueue_jobs()
        self._call(lambda: self.adapter.release(name))
        self._kueue_jobs()
        if name in self.workloads:
            asyncio.run(self._decide([([self.workloads[name]], "none", False)]))
            self.kueue.sync()
        c.settle(2)

    async def _reconciler_once(self, names: list[str]) -> None:
        kube = k.Kube.connect(namespace=NS, transport=self.cluster.transport("dispatch-controller"))
        metrics = Metrics.create()
        rec = Reconciler(kube, check_names=lambda: {"dispatch"}, metrics=metrics,
                         events=EventRecorder(kube, metrics, instance="every-writer"))
        try:
            for wl in names:
                try:
                    await rec.reconcile(NS, wl)
                except DispatchError:
                    pass
        finally:
            await rec._events.drain()
            await kube.aclose()

    @rule(mode=st.sampled_from(["two-releases", "release-beside-controller", "release-beside-hold"]),
          name=st.sampled_from(OBJECTS))
    def concurrent_writers(self, mode: str, name: str) -> None:
        """Writers at once, interleaved per request: the resourceVersion preconditions fence them."""
        self._kueue_jobs()

        async def run() -> list[object]:
            one = AsyncAdapter.connect(NS, transport=self.cluster.transport(roles=WRITER))
            two = AsyncAdapter.connect(NS, transport=self.cluster.transport(roles=WRITER))
            one.settle_seconds = two.settle_seconds = 0
            try:
                other: Awaitable[object]
                if mode == "two-releases":
                    other = two.release(name)
                elif mode == "release-beside-hold":
                    other = two.hold(name)
                else:
                    other = self._reconciler_once(list(self.workloads.values()))
                return list(await asyncio.gather(one.release(name), other, return_exceptions=True))
            finally:
                await one.aclose()
                await two.aclose()

        for result in asyncio.run(run()):
            if isinstance(result, PodsRemain):
                SEEN["waited"] += 1
            elif isinstance(result, BaseException) and not isinstance(result, DispatchError):
                raise result

    @rule(name=st.sampled_from(OBJECTS), at=st.integers(0, 6),
          event=st.sampled_from(["trainer", "jobset", "job", "kubelet", "kubelet-now", "gc", "kueue-sync",
                                 "kueue-evict", "kueue-jobs", "bypass"]))
    def release_with_event_inside(self, name: str, at: int, event: str) -> None:
        """A cluster event, Kueue, or the bypassing writer acts between release's read and its write: before one
        of the boundaries of an admitting release's requests (``RELEASE_BOUNDARIES``)."""
        count = {"n": 0}
        c = self.cluster

        def hook(method: str, path: str) -> None:
            count["n"] += 1
            if count["n"] != RELEASE_BOUNDARIES[at] + 1:
                return
            c.server.before_request = None
            try:
                if event == "kueue-sync":
                    self.kueue.sync()
                elif event == "kueue-evict":
                    wl = self.workloads.get(name)
                    if wl and self.cluster.server.get(n.KUEUE_GROUP, "workloads", NS, wl) is not None:
                        self.kueue.evict(wl)
                elif event == "kueue-jobs":
                    self.kueue.reconcile_jobs()
                elif event == "bypass":
                    self._bypass_direct(name, started=False)
                else:
                    {"trainer": c.trainer_sync, "jobset": c.jobset_sync, "job": c.job_sync,
                     "kubelet": c.kubelet_sync, "kubelet-now": lambda: c.kubelet_sync(honour_grace=False),
                     "gc": c.pod_gc}[event]()
            except ApiFailure:  # the cluster's own writes may meet the fake's refusals
                pass

        c.server.before_request = hook
        try:
            self._call(lambda: self.adapter.release(name))
        finally:
            c.server.before_request = None
        self._kueue_jobs()

    # ------------------------------------------------------------------ the bypassing writer

    def _bypass_direct(self, name: str, *, started: bool) -> None:
        """The bypass's write, made on the server directly (from inside another call's request)."""
        tj = self.cluster.server.get(TRAINER, "trainjobs", NS, name)
        if tj is None or not tj["spec"].get("suspend"):
            return

        def start(obj: dict[str, Any]) -> None:
            obj["spec"]["suspend"] = False
            if started:
                ann = obj["metadata"].setdefault("annotations", {})
                ann[n.ANNOTATION_STARTED] = ann.get(n.ANNOTATION_ADMISSION, "0")
        self.bypassing = True
        try:
            self.cluster.server.update(TRAINER, "trainjobs", NS, name, start, status=False)
            SEEN["bypass-started"] += 1
        except ApiFailure:
            SEEN["bypass-refused"] += 1
        finally:
            self.bypassing = False

    @rule(name=st.sampled_from(OBJECTS), started=st.booleans())
    def bypass(self, name: str, started: bool) -> None:
        """``kubectl patch trainjob NAME --type=merge -p '{"spec":{"suspend":false}}'`` as a user holding the
        shipped writer role; ``started`` also sets the started mark to the TrainJob's A, as dispatch's own
        unsuspend does. Only the guard stands in its way."""
        tj = self.cluster.server.get(TRAINER, "trainjobs", NS, name)
        if tj is None or not tj["spec"].get("suspend"):
            return
        patch: dict[str, object] = {"spec": {"suspend": False}}
        if started:
            a = (tj["metadata"].get("annotations") or {}).get(n.ANNOTATION_ADMISSION, "0")
            patch["metadata"] = {"annotations": {n.ANNOTATION_STARTED: a}}

        async def run() -> None:
            kube = k.Kube.connect(namespace=NS, transport=self.cluster.transport(roles=WRITER))
            try:
                await kube.merge_patch(k.TRAINJOBS, name, patch)
                SEEN["bypass-started"] += 1
            except DispatchError:
                SEEN["bypass-refused"] += 1
            finally:
                await kube.aclose()

        self.bypassing = True
        try:
            asyncio.run(run())
        finally:
            self.bypassing = False

    # ------------------------------------------------------------------ writers of pods, records, entries (issue 25)

    def _as(self, roles: tuple[str, ...], res: k.Res, name: str, body: dict[str, Any], rbac: str | None = None
            ) -> bool:
        """A merge patch as a user holding ``roles``; True if it went through. The refusals it provokes are
        expected (the RBAC or a policy stands in its way), so they are not the shipped roles' denials the
        invariant looks for."""
        before = len(self.cluster.server.denied)

        async def go() -> bool:
            kube = k.Kube.connect(namespace=NS, transport=self.cluster.transport(roles=roles, rbac=rbac))
            try:
                await kube.merge_patch(res, name, body)
                return True
            except DispatchError:
                return False
            finally:
                await kube.aclose()
        try:
            return asyncio.run(go())
        finally:
            del self.cluster.server.denied[before:]

    @precondition(lambda self: bool(self.cluster.pods()))
    @rule(who=st.sampled_from(["writer", "editor"]), what=st.sampled_from(["relabel", "unfinalize", "force-delete"]),
          index=st.integers(0, 20))
    def pod_writer(self, who: str, what: str, index: int) -> None:
        """Issue 25, item 1: a writer (the shipped writer role) or a pod editor (no dispatch role, Kubernetes'
        ``edit`` on pods) takes dispatch's labels and the JobSet's and Job's off a pod, or its finalizer after
        a force delete. RBAC refuses the writer, the ``dispatch-pods`` policy the editor; were either let
        through, the checker would see the next execution start beside the hidden pod."""
        pods = self.cluster.pods()
        pod = pods[index % len(pods)]["metadata"]["name"]
        if what == "force-delete":
            self.cluster.force_delete(pod)
        obj = self.cluster.server.get("", "pods", NS, pod)
        if (what != "relabel" and obj is not None and POD_FINALIZER not in (obj["metadata"].get("finalizers") or [])
                and obj["status"].get("phase") in ("Succeeded", "Failed")):
            SEEN["pod-write-already-freed"] += 1  # its end was proven and the keeper freed it: nothing to remove
            return
        roles, rbac = (WRITER, None) if who == "writer" else (("namespace-editor",), EDITOR)
        body: dict[str, Any] = ({"metadata": {"labels": dict.fromkeys(n.POD_KEPT_LABELS)}} if what == "relabel"
                                else {"metadata": {"finalizers": None}})
        SEEN["pod-write-" + ("went-through" if self._as(roles, k.PODS, pod, body, rbac) else "refused")] += 1

    @rule(name=st.sampled_from(OBJECTS), how=st.sampled_from(["bind", "forge-a"]))
    def record_writer(self, name: str, how: str) -> None:
        """Issue 25, item 4: a writer binds the submission's record to the object's uid without a raise, or
        raises the TrainJob's annotation and entry to the record's A (an A that may have run under an earlier
        object of the submission). The CRD's rule refuses the first; release never takes the second."""
        tj = self.cluster.server.get(TRAINER, "trainjobs", NS, name)
        if tj is None:
            return
        job_id, submission = name.split("-")
        record = self.cluster.server.get(n.DOMAIN, "submissionrecords", NS, record_name(job_id, submission))
        if record is None:
            return
        if how == "bind":
            body: dict[str, Any] = {"spec": {"trainJob": {"name": name, "uid": tj["metadata"]["uid"]}}}
            went = self._as(WRITER, api.SUBMISSION_RECORDS, record["metadata"]["name"], body)
            if went and record["spec"].get("trainJob", {}).get("uid") not in ("", tj["metadata"]["uid"], None):
                raise AssertionError("a record was bound to another TrainJob without a raise")
        else:
            a = str(record["spec"]["admission"])
            patches = copy.deepcopy(tj["spec"].get("runtimePatches") or [])
            for entry in patches:
                if entry.get("manager") == n.PATCH_MANAGER:
                    for rj in entry["trainingRuntimeSpec"]["template"]["spec"].get("replicatedJobs") or []:
                        rj["template"]["spec"]["template"]["metadata"]["labels"][n.LABEL_ADMISSION] = a
            went = self._as(WRITER, k.TRAINJOBS, name, {"metadata": {"annotations": {n.ANNOTATION_ADMISSION: a}},
                                                        "spec": {"runtimePatches": patches}})
        SEEN[f"record-{how}-" + ("went-through" if went else "refused")] += 1

    @rule(name=st.sampled_from(OBJECTS), delta=st.sampled_from([-1, 0, 1]))
    def foreign_manager(self, name: str, delta: int) -> None:
        """Issue 25, item 5: another manager adds an entry after dispatch's that sets the admission label
        (the TrainJob's A, or one off it). Off it: refused by the ``dispatch-identity`` CEL policy, which the
        API server enforces with or without the webhook (so in every example); equal: allowed, and the start
        it later meets (after a raise) is refused by dispatch's own release and controller, which judge the
        pods Trainer will build from every entry, and by the webhook where it enforces."""
        tj = self.cluster.server.get(TRAINER, "trainjobs", NS, name)
        if tj is None or not tj["spec"].get("suspend"):
            return
        a = int((tj["metadata"].get("annotations") or {}).get(n.ANNOTATION_ADMISSION, "0")) + delta
        entry = {"manager": "example.com/tuner", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
            {"name": "node", "template": {"spec": {"template": {"metadata": {"labels": {
                n.LABEL_ADMISSION: str(max(a, 0))}}}}}}]}}}}
        patches = [e for e in tj["spec"].get("runtimePatches") or [] if e.get("manager") != "example.com/tuner"]
        went = self._as(WRITER, k.TRAINJOBS, name, {"spec": {"runtimePatches": [*patches, entry]}})
        SEEN["foreign-entry-" + ("went-through" if went else "refused")] += 1

    @rule(name=st.sampled_from(OBJECTS), how=st.sampled_from(sorted(DIRECTIVE_ENTRIES)), forged=st.booleans())
    def directive_entry(self, name: str, how: str, forged: bool) -> None:
        """Issue 35, item 1: a writer adds a runtime patch entry (another manager's, or one forging Kueue's
        manager name) with a strategic-merge directive where Trainer's merge reads it: its pod template's labels
        replaced or deleted, its Job's or JobSet's labels, its nodeSelector. Trainer would merge it into the pods
        and strip dispatch's labels (the pod guard would never see their creates, the rule's look-up by the
        submission would miss them). The ``dispatch-identity`` CEL policy refuses it in every example (with the
        webhook recording only, too); were one let through, the checker would see the next execution start
        beside the hidden pods."""
        tj = self.cluster.server.get(TRAINER, "trainjobs", NS, name)
        if tj is None or not tj["spec"].get("suspend"):
            return
        manager = "kueue.x-k8s.io/manager" if forged else "example.com/tuner"
        patches = [e for e in tj["spec"].get("runtimePatches") or [] if e.get("manager") != manager]
        body = {"spec": {"runtimePatches": [*patches, DIRECTIVE_ENTRIES[how](manager)]}}
        before = len(self.cluster.server.denied)

        async def go() -> str | None:
            kube = k.Kube.connect(namespace=NS, transport=self.cluster.transport(roles=WRITER))
            try:
                await kube.merge_patch(k.TRAINJOBS, name, body)
                return None
            except DispatchError as exc:
                return str(exc)
            finally:
                await kube.aclose()
        try:
            refused = asyncio.run(go())
        finally:
            del self.cluster.server.denied[before:]
        if refused is None:
            SEEN["directive-entry-went-through"] += 1
            raise AssertionError(f"an entry with a strategic-merge directive ({how}) was written on {name}")
        # Trainer's own webhook refuses any entry change while a replicatedJob is still active
        SEEN["directive-entry-" + ("refused" if "strategic-merge directive" in refused else "trainer-refused")] += 1

    @rule(owners=st.sampled_from([1, 0]))
    def garbage_collector(self, owners: int) -> None:
        """Issue 25, item 2: the lagging garbage collector reaches one removed owner's dependents (or all).
        Until it does, a closed object's JobSet and Jobs stay, unsuspended if it was running, and the
        submission re-opened (under its name or another) waits for them."""
        server = self.cluster.server
        gone = set(server.gc_pending)
        jobsets = {js["metadata"]["uid"]: js for js in server.objects(n.JOBSET_GROUP, "jobsets", NS)}
        lagging = [job for job in server.objects("batch", "jobs", NS)
                   if any(o.get("uid") in gone or (o.get("uid") in jobsets and any(
                       jo.get("uid") in gone for jo in jobsets[o["uid"]]["metadata"].get("ownerReferences") or []))
                          for o in job["metadata"].get("ownerReferences") or [])]
        if lagging:  # a Job whose TrainJob (or JobSet) is gone and the collector has not reached yet
            SEEN["gc-lagging-job"] += 1
            SEEN["gc-lagging-job-unsuspended"] += any(not job["spec"].get("suspend") for job in lagging)
        SEEN["gc-collected"] += server.collect_garbage(owners or None)

    # Only gains: a runtime that loses a replicatedJob after gaining it left a suspended object's lost Job
    # unsuspended and its status named no action (found by the walks, when the fake's JobSet took the change;
    # the real one refuses it, as ``install_jobset_webhook`` now has it, but a loss is not generated yet).
    @rule(gain=st.just(True))
    def runtime_edit(self, gain: bool) -> None:
        """Issue 25, item 3: the platform team adds a replicatedJob to the runtime every object names (or takes
        it away again). Every raise re-targets dispatch's entry at the runtime as it is; a start between a raise
        and the next is refused by the guard, so only in examples where the guard judges everyone's writes
        (without it, Kueue starting an object the runtime changed under after dispatch's raise would run the
        new job's pods without dispatch's labels: the guard is what closes that)."""
        if not self.guard_everyone:
            return
        for tj in self.cluster.server.objects(TRAINER, "trainjobs", NS):
            js = self.cluster.server.get(n.JOBSET_GROUP, "jobsets", NS, tj["metadata"]["name"])
            own = js is not None and any(o.get("uid") == tj["metadata"]["uid"]
                                         for o in js["metadata"].get("ownerReferences") or [])
            if not tj["spec"].get("suspend") and (not own or js is None or js["spec"].get("suspend")):
                # Started, and Trainer has not yet built the JobSet from the runtime (or will build it again:
                # the one there is an earlier object's of that name, which garbage collection deletes): an edit
                # now is the one window the guard cannot see (it judged the start on the runtime as it was).
                # Left out, and named as open in the report of issue 25: closing it needs Trainer's build
                # judged, not the start.
                SEEN["runtime-edit-skipped"] += 1
                return

        def edit(obj: dict[str, Any]) -> None:
            jobs = obj["spec"]["template"]["spec"]["replicatedJobs"]
            names = [j["name"] for j in jobs]
            if gain and "launcher" not in names:
                jobs.append({**copy.deepcopy(jobs[0]), "name": "launcher"})
            elif not gain and "launcher" in names:
                obj["spec"]["template"]["spec"]["replicatedJobs"] = [j for j in jobs if j["name"] != "launcher"]
        self.cluster.server.update(TRAINER, "clustertrainingruntimes", "", "torch-distributed", edit, status=None)
        SEEN["runtime-" + ("gained" if gain else "lost")] += 1

    @rule(name=st.sampled_from(OBJECTS))
    def interrupted_close(self, name: str) -> None:
        """Issue 25, item 8: a ``close`` releases the claim and its delete never arrives. Status must then
        name ``close`` again, and nothing admits the object until a close finishes."""
        self.cluster.server.inject(method="DELETE", path=rf"/trainjobs/{name}$", status=500, times=10)
        try:
            self._call(lambda: self.adapter.close(name))
        finally:
            self.cluster.server.faults[:] = [f for f in self.cluster.server.faults if f.method != "DELETE"]
        tj = self.cluster.server.get(TRAINER, "trainjobs", NS, name)
        if tj is None or not tj["spec"].get("suspend") or tj["metadata"].get("deletionTimestamp"):
            return
        job_id, submission = name.split("-")
        record = self.cluster.server.get(n.DOMAIN, "submissionrecords", NS, record_name(job_id, submission))
        if record is None or (record["spec"].get("trainJob") or {}).get("name"):
            return  # the close failed before it released the claim (an injected error): nothing was begun
        status = self._call(lambda: self.adapter.inspect(name))
        if getattr(status, "cause", None) is not None:
            cause = status.cause  # type: ignore[attr-defined]
            assert cause.reason == "CloseInterrupted" and f"`dispatch close {name}` again" in cause.detail, cause
            SEEN["close-interrupted-named"] += 1
            self.interrupted.add(name)

    @rule(name=st.sampled_from(OBJECTS))
    def enrolment_collision(self, name: str) -> None:
        """Issue 25, item 7: a TrainJob created in an enrolled namespace with a held submission's labels is
        refused by enrolment (the guard's mutating webhook, with the controller's role)."""
        job_id, submission = name.split("-")
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "collide", "operation": "CREATE", "namespace": NS, "name": f"{name}-thief", "object": {
                "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": f"{name}-thief", "namespace": NS,
                             "labels": {n.LABEL_JOB_ID: job_id, n.LABEL_SUBMISSION: submission}},
                "spec": {"runtimeRef": {"name": "torch-distributed"}}}}}

        async def go() -> dict[str, Any]:
            kube = k.Kube.connect(namespace=NS, transport=self.cluster.transport("dispatch-controller"))
            try:
                return dict((await Guard(kube).mutate(review, timeout=5))["response"])
            finally:
                await kube.aclose()
        answer = asyncio.run(go())
        held = any(not tj["metadata"].get("deletionTimestamp")
                   for tj in self.cluster.server.objects(TRAINER, "trainjobs", NS)
                   if (tj["metadata"].get("labels") or {}).get(n.LABEL_JOB_ID) == job_id
                   and (tj["metadata"].get("labels") or {}).get(n.LABEL_SUBMISSION) == submission)
        if held:  # refused: for the collision, or (an injected API error) because the guard fails closed
            assert answer["allowed"] is False, answer
            SEEN["enrol-collision-refused" if "is held by trainjob" in answer["status"]["message"]
                 else "enrol-collision-failed-closed"] += 1
        else:
            SEEN["enrol-collision-free"] += 1

    @rule(name=st.sampled_from(OBJECTS), suspend=st.booleans())
    def copy_marks(self, name: str, suspend: bool) -> None:
        """Issue 35 item 3: a writer adds MultiKueue's origin and prebuilt-workload labels (naming the object's
        Workload) so that the guard would take its copy check, then (``suspend``) suspends the running object
        itself, which Kueue's reconciler unsuspends while its Workload stays admitted. The marks are refused by
        the ``dispatch-identity`` policy in every example; the suspend only where the guard judges everyone's
        writes (elsewhere Kueue's restart of the same A, like the bare bypass, has only the guard against it)."""
        tj = self.cluster.server.get(TRAINER, "trainjobs", NS, name)
        if tj is None:
            return
        marks = {n.MULTIKUEUE_ORIGIN_LABEL: "multikueue", n.PREBUILT_WORKLOAD_LABEL: self.workloads.get(name, name)}
        went = self._as(WRITER, k.TRAINJOBS, name, {"metadata": {"labels": marks}})
        assert not went, "a writer marked a dispatch TrainJob as a MultiKueue copy"
        SEEN["copy-marks-refused"] += 1
        if suspend and self.guard_everyone and not tj["spec"].get("suspend"):
            went = self._as(WRITER, k.TRAINJOBS, name, {"spec": {"suspend": True}})
            SEEN["writer-suspend-" + ("went-through" if went else "refused")] += 1

    @rule(name=st.sampled_from(OBJECTS), nodes=st.sampled_from([2, 3]))
    def nonindexed_open(self, name: str, nodes: int) -> None:
        """Issue 35 item 6: a writer opens a submission on a runtime whose node Job is NonIndexed with more than
        one pod at once (numNodes): refused naming the replicatedJob and its fields, and nothing is written."""
        job_id, _ = name.split("-")
        before = len(self.cluster.server.objects(TRAINER, "trainjobs", NS))
        try:
            self.adapter.open(JobSpec(job_id=job_id, submission="bag", num_nodes=nodes, runtime="torch-bag"))
        except InvalidInput as exc:
            assert f"replicatedJob node (completionMode: NonIndexed, parallelism {nodes})" in str(exc), exc
            SEEN["nonindexed-open-refused"] += 1
        except DispatchError:
            SEEN["nonindexed-open-failed"] += 1       # an injected API error, or the namespace going
        else:
            raise AssertionError("a NonIndexed Job with parallelism above 1 was opened")
        assert len(self.cluster.server.objects(TRAINER, "trainjobs", NS)) == before

    # ------------------------------------------------------------------ the namespace deleted and re-created (issue 25)

    @rule(op=st.sampled_from(["delete", "mark", "recreate"]))
    def namespace(self, op: str) -> None:
        """Issue 25, item 6: ``kubectl delete namespace`` (the API server marks it Terminating; with ``delete``
        the namespace controller's first pass follows at once, with ``mark`` it is a step behind, and writers
        and controllers act in between), and, with ``recreate``, the namespace controller's next pass and, once
        it is gone, the team's manifests applied again (the Namespace and its LocalQueue) and its submissions
        opened again, held, as at the start; the writers go on from there. dispatch's finalizer holds a pod
        that may still run, and so the namespace, until its end is proven, so nothing of the namespace's
        earlier life runs beside its next; the records go with it and the cluster-scoped floors stay, so A
        goes on from there (``an_a_is_issued_once``)."""
        server = self.cluster.server
        if op == "recreate":
            self._namespace_controller()
            if server.get("", "namespaces", "", NS) is None:
                server.create("", "namespaces", "", {"metadata": {"name": NS}})
                server.create(n.KUEUE_GROUP, "localqueues", NS, {
                    "metadata": {"name": self.kueue.queue}, "spec": {"clusterQueue": self.kueue.cluster_queue}})
                self.lives.append(self.cluster.history.clock)
                SEEN["ns-recreated"] += 1
                for name in OBJECTS:
                    with contextlib.suppress(DispatchError):
                        self.adapter.open(self.spec(name))
                self._kueue_jobs()
                for name in OBJECTS:
                    if self.ways[name] == "kueue-unlabelled":
                        self._strip_queue_label(name)
        elif server.get("", "namespaces", "", NS) is not None and not self._namespace_deleting():
            server.terminate_namespace(NS)
            SEEN["ns-deleted"] += 1
            if op == "delete":
                self._namespace_controller()
        self._kueue_jobs()

    def _namespace_deleting(self) -> bool:
        ns = self.cluster.server.get("", "namespaces", "", NS)
        return ns is not None and bool(ns["metadata"].get("deletionTimestamp"))

    def _namespace_controller(self) -> None:
        """One pass of the namespace controller, if the namespace is being deleted."""
        if not self._namespace_deleting():
            return
        if self.cluster.server.namespace_controller_pass(NS):
            SEEN["ns-held"] += 1  # content stays Terminating: pods whose end is unproven, finalizers
        else:
            SEEN["ns-gone"] += 1
            self.interrupted.clear()

    @invariant()
    def an_a_is_issued_once(self) -> None:
        """A is never reused: each A a submission's record issued (bound to a TrainJob's uid) was issued to
        that TrainJob alone, across closes, re-opens and the namespace's deletion and re-creation, and an A
        issued in a later life of the namespace is above every A issued in its earlier lives. (The history
        checker holds the executions to the same; this holds every issued A, also one that never ran.)"""
        if not hasattr(self, "cluster"):
            return
        life = len(self.lives) - 1
        for record in self.cluster.server.objects(n.DOMAIN, "submissionrecords", NS):
            spec = record["spec"]
            uid, a = str((spec.get("trainJob") or {}).get("uid") or ""), spec.get("admission")
            if not uid or not isinstance(a, int) or a < 1:
                continue
            key = (str(spec["jobId"]), str(spec["submission"]), a)
            first = self.issued.get(key)
            assert first is None or first[0] == uid, (
                f"A={a} of {key[:2]} was issued to TrainJob uid {first[0]} and again to {uid}")
            if first is None:
                self.issued[key] = (uid, life)
            if first is None and life:
                before = [b for (j, sub, b), (_, lf) in self.issued.items() if (j, sub) == key[:2] and lf < life]
                if before:
                    assert a > max(before), (f"A={a} of {key[:2]} issued after the namespace was re-created, "
                                             f"not above the A={max(before)} issued before")
                    SEEN["ns-a-continued"] += 1

    def _count_runtime_edits_and_lives(self) -> None:
        """What the runtime edits and the namespace's lives reached, counted once per walk."""
        SEEN["runtime-edit-refused"] += sum("not covered by dispatch's runtime patch entry" in msg
                                            for msg in self.guard.denied)
        launcher = [p for p in self.cluster.history.processes if "-launcher-" in p.rank]
        SEEN["runtime-edit-covered"] += len({p.execution for p in launcher if p.job_id and p.admission})
        SEEN["runtime-edit-uncovered-ran"] += sum(1 for p in launcher if not (p.job_id and p.admission))
        runtime = self.cluster.server.get(TRAINER, "clustertrainingruntimes", "", "torch-distributed") or {}
        jobs = [rj["name"] for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]]
        SEEN["runtime-edit-jobset-kept"] += sum(  # JobSet's webhook refused Trainer's rebuild from the new runtime
            1 for js in self.cluster.server.objects(n.JOBSET_GROUP, "jobsets", NS)
            if [rj["name"] for rj in js["spec"]["replicatedJobs"]] != jobs)
        lives: dict[tuple[str, ...], set[int]] = {}
        for p in self.cluster.history.processes:
            lives.setdefault(p.subject, set()).add(sum(1 for start in self.lives if start < p.started))
        SEEN["ns-ran-in-two-lives"] += sum(1 for x in lives.values() if len(x) > 1)

    # ------------------------------------------------------------------ more faults

    @rule(path=st.sampled_from([r"/submissionrecords", r"/trainjobs$", r"/trainjobs/", r"/workloads/"]),
          method=st.sampled_from(["POST", "PATCH"]))
    def lost_reply(self, path: str, method: str) -> None:
        """The server applies the write and the reply is lost."""
        self.cluster.server.inject(method=method, path=path, status="timeout", after=True)

    @precondition(lambda self: bool(self.cluster.pods()))
    @rule(index=st.integers(0, 20))
    def marked_failed_by_someone_else(self, index: int) -> None:
        """PodGC or Kueue writes Failed onto a pod of a held object (its containers' states unchanged)."""
        pods = self.cluster.pods()
        pod = pods[index % len(pods)]
        tj = self.cluster.server.get(TRAINER, "trainjobs", NS,
                                     pod["metadata"]["labels"].get(n.JOBSET_NAME_LABEL, ""))
        if tj is not None and tj["spec"].get("suspend"):
            self.cluster.mark_failed(pod["metadata"]["name"])

    # ------------------------------------------------------------------ Nodes deleted under live kubelets

    @rule(event=st.sampled_from(["freeze", "thaw", "taint-out-of-service", "delete", "replace"]),
          node=st.sampled_from(NODES))
    def node_event(self, event: str, node: str) -> None:
        """The Kueue machine's Node events, counted: a ``delete`` of a node that still reports Ready deletes the
        Node of a live kubelet (issue 40: its containers run on, PodGC takes its pods 40 s on, and nothing may
        re-admit while they run); ``replace`` of it is its kubelet restarted, registering again."""
        c = self.cluster
        live = event == "delete" and node not in c.deleted_nodes and node not in c.frozen and node not in c.partitioned
        again = event == "replace" and node in c.deleted_nodes and node not in c.machines_gone
        super().node_event(event, node)
        if live:
            SEEN["node-deleted-live"] += 1
        if again:
            SEEN["kubelet-registered-again"] += 1

    # ------------------------------------------------------------------ kubelets as real ones end pods

    @rule(outcome=st.sampled_from(["reject", "admit", "init-hangs", "init-finishes", "crash", "partition", "heal",
                                   "failure-recovery"]),
          node=st.sampled_from(("node-0", "node-1", "node-2")), index=st.integers(0, 20))
    def kubelet_outcome(self, outcome: str, node: str, index: int) -> None:
        c = self.cluster
        pods = c.pods()
        pod = pods[index % len(pods)] if pods else None
        if outcome == "reject":
            c.kubelet_rejects(node, *(("UnexpectedAdmissionError", "Allocate failed due to no healthy devices")
                                      if index % 2 else ("OutOfcpu", "Node didn't have enough resource: cpu")))
        elif outcome == "admit":
            c.kubelet_admits(node)
        elif outcome in ("init-hangs", "init-finishes"):
            c.init_containers_hang(node, outcome == "init-hangs")
        elif outcome == "crash" and pod is not None:
            c.crash(pod["metadata"]["name"], 1 if index % 3 else 0)
            SEEN["crashed"] += 1
        elif outcome == "partition" and node not in c.deleted_nodes and node not in c.frozen:
            c.partition(node)
        elif outcome == "heal" and node in c.partitioned:
            c.heal(node)
        elif outcome == "failure-recovery":
            # Kueue's failure recovery: a deleting pod on an unreachable node, a minute on, is marked
            # Failed (its own condition, container states untouched) and force-deleted.
            for p in pods:
                if p["spec"].get("nodeName") in c.partitioned and p["metadata"].get("deletionTimestamp"):
                    c.mark_failed(p["metadata"]["name"], reason="KueueForcefullyDeleted")
                    c.force_delete(p["metadata"]["name"])
                    SEEN["failure-recovery"] += 1
                    break

    # ------------------------------------------------------------------ liveness

    def _submission_alive(self, name: str) -> bool:
        job_id, submission = name.split("-")
        return any(p.subject == (NS, "submission", job_id, submission) for p in self.cluster.running_processes())

    def faults_stop_and_every_ended_object_becomes_admissible(self) -> None:
        """Faults stop; after a bounded number of rounds every suspended object none of whose processes
        runs is proven ceased, directly or after the one action its status names."""
        c = self.cluster
        c.server.faults.clear()
        for node in list(c.partitioned):
            c.heal(node)
        for node in list(c.frozen):
            if node not in self.tainted:
                c.thaw_node(node)
        for node in sorted(c.deleted_nodes - c.machines_gone):
            c.restart_kubelet(node)  # the runbook's way out of a Node deleted while its kubelet lived
        for node in ("node-0", "node-1", "node-2"):
            c.kubelet_admits(node)
            c.init_containers_hang(node, False)

        def rounds() -> None:
            for _ in range(HEALING_ROUNDS):
                c.server.collect_garbage()
                c.advance(31)
                c.settle(2)
                self.kueue.sync()
                asyncio.run(self._release_finalizers())
                if self._namespace_deleting():  # Kueue frees the Workloads of the TrainJobs that went
                    self._kueue_jobs()
                    self._namespace_controller()
        rounds()
        c.history.check()
        with Adapter.connect(NS, transport=c.transport(roles=ADMIN)) as admin:
            for name in OBJECTS:
                tj = c.server.get(TRAINER, "trainjobs", NS, name)
                if tj is None or not tj["spec"].get("suspend") or self._submission_alive(name):
                    continue
                try:
                    cessation = self.adapter.ceased(name)
                except NotFound:
                    continue
                if cessation.ceased:
                    SEEN["healed-ceased"] += 1
                    continue
                if self._jobset_frozen(name):  # see _jobset_frozen: reported, left out of liveness
                    SEEN["runtime-edit-stalled"] += 1
                    continue
                self._take_named_actions(admin, name, cessation.reason)
                rounds()
                after = self.adapter.ceased(name)
                assert after.ceased or self._submission_alive(name), (
                    f"{name} still stalls after the named action: {after.reason}")
            if self._namespace_deleting():
                # What holds it is pods dispatch's finalizer keeps (the namespace controller deletes the rest
                # only once its pods are gone, as the real one does): `dispatch ceased` of their object's name
                # (read by jobset-name) names the action that frees each. A JobSet frozen by a runtime edit
                # still names none (see _jobset_frozen): `close`, its way out, lets the collector take it.
                for name in sorted({p["metadata"]["labels"].get(n.JOBSET_NAME_LABEL, "") for p in c.pods()} - {""}):
                    if self._jobset_frozen(name):
                        SEEN["runtime-edit-stalled"] += 1
                        with contextlib.suppress(DispatchError):
                            self.adapter.close(name)
                        rounds()
                    cessation = self.adapter.ceased(name)
                    if not cessation.ceased:
                        # a running object whose pod the namespace controller is deleting: ceased names the
                        # action that frees the rank's ending pod, as status does
                        self._take_named_actions(admin, name, cessation.reason)
                        SEEN["ns-healed-by-action"] += 1
                rounds()
        c.history.check()
        assert not self._namespace_deleting(), (
            "the namespace is still Terminating after faults stopped and the named actions", [
                (kind.plural, o["metadata"]) for kind in api.ALL if kind.namespaced
                for o in c.server.objects(kind.group, kind.plural, NS)])

    def _jobset_frozen(self, name: str) -> bool:
        """Whether the object's JobSet was built before the runtime last changed its replicatedJobs. JobSet's
        webhook then refuses every re-apply of it by Trainer (``jobset_update_problem``), so a hold or Kueue's
        preemption never suspends it and a release never starts it: a stall of Trainer and JobSet whose status
        (``jobset ... is not suspended yet``) names no action (``close`` and re-open ends it). Found with the
        runtime edits in the walks; see ``test_a_hold_after_the_runtime_gained_a_job_names_the_way_out``."""
        server = self.cluster.server
        js = server.get(n.JOBSET_GROUP, "jobsets", NS, name)
        runtime = server.get(TRAINER, "clustertrainingruntimes", "", "torch-distributed")
        return js is not None and runtime is not None and (
            [rj["name"] for rj in js["spec"]["replicatedJobs"]]
            != [rj["name"] for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]])

    def _take_named_actions(self, admin: Adapter, name: str, reason: str) -> None:
        """The operator takes each action a stalled object's cessation names (it must name one)."""
        c = self.cluster
        actions = ACTION.findall(reason)
        assert actions, (f"{name} stalls with no action named after faults stopped: {reason}",
                         [(p["metadata"], p["status"]) for p in c.pods()])
        for pod, flag, deleted in actions:
            if deleted:  # the operator's kubectl, with the admin role's delete on pods
                with contextlib.suppress(ApiFailure):
                    c.server.delete("", "pods", NS, deleted)
                SEEN["healed-by-delete"] += 1
                continue
            node = (c.server.get("", "pods", NS, pod) or {}).get("spec", {}).get("nodeName")
            if flag == "--node-confirmed-down" and node not in self.tainted and node not in c.frozen:
                if node and f"shut {node} down and run `dispatch admin release-pod {pod} --node-confirmed-down`" \
                        in reason:
                    # its kubelet wrote the pod's end before dispatch saw the mark and writes nothing more: the
                    # status names the node's shut-down as the way out, then the word
                    c.shut_down(node)
                    self.tainted.add(node)  # down for good in this walk: its pods are the operator's to release
                    admin.release_pod(pod, node_confirmed_down=True)
                    SEEN["healed-by-shutdown"] += 1
                    SEEN["healed-by-action"] += 1
                continue  # only true of a node that is down; a healed node's kubelet acts itself
            try:
                admin.release_pod(pod, process_gone=flag == "--process-gone",
                                  node_confirmed_down=flag == "--node-confirmed-down")
            except NotFound:
                pass
            except Refused as exc:
                # Its kubelet wrote the pod's end before dispatch saw the mark (it raced the controller's
                # watch, or the mark came with the kubelet's own stop): it writes nothing more, so the word is
                # refused for good, and the status names the other way out: the node shut down, then its word.
                assert exc.reason == "KubeletNotReported" and node, exc
                assert f"release-pod {pod} --node-confirmed-down" in reason, reason
                c.shut_down(node)
                self.tainted.add(node)  # down for good in this walk: its pods are the operator's to release
                admin.release_pod(pod, node_confirmed_down=True)
                SEEN["healed-by-shutdown"] += 1
            SEEN["healed-by-action"] += 1

    # ------------------------------------------------------------------ the promise

    @invariant()
    def the_guard_refused_every_unsafe_bypass(self) -> None:
        """The checker sees every start; this says the bypass was judged at all (every denial is the
        guard's own message, none an error of the fake)."""
        if hasattr(self, "guard"):
            assert all(msg.startswith("trainjob ") for msg in self.guard.denied + self.guard.unenforced), (
                self.guard.denied, self.guard.unenforced)
            assert all(msg.startswith("pod ") for msg in self.guard.pod_denied + self.guard.pod_unenforced), (
                self.guard.pod_denied, self.guard.pod_unenforced)


EveryWriter.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestEveryWriter = EveryWriter.TestCase


# ------------------------------------------------------------------ fixed-seed long walks


def _walk_step(rng: random.Random, sm: EveryWriter) -> Callable[[], None]:
    """One step of a walk, weighted so that executions start, stop and start again often: writers and
    the cluster's progress most, the Kueue machine's own steps (nodes, pods, errors among them) next."""
    name = rng.choice(OBJECTS)
    live = sm.cluster.server.get("", "namespaces", "", NS) is not None and not sm._namespace_deleting()
    choice = rng.choices(
        ["writer", "progress", "kueue", "decide", "kueue-machine", "bypass", "inside", "concurrent", "lost",
         "failed", "kubelet", "second-round", "gc", "runtime-edit", "interrupted-close", "namespace"],
        # a deleted namespace is re-created soon, so most of a walk's steps find it there
        weights=[25, 20, 10, 10, 20, 4, 4, 4, 2, 1, 6, 4, 3, 0.5, 1, 0.3 if live else 20])[0]
    if choice == "writer":
        op = rng.choice(["release", "release", "release", "hold", "hold", "close", "reopen", "reopen-held",
                         "inspect", "ceased", "open-alias"])
        return lambda: sm.writer(op, name)
    if choice == "progress":
        step = rng.choice(["settle", "grace-periods-end", "kubelet", "job", "jobset", "trainer"])
        return lambda: sm.cluster_step(step)
    if choice == "kueue":
        kstep = rng.choice(["sync", "settle", "preempt", "preempt-and-requeue", "jobs", "strip-label"])
        return lambda: sm.kueue_step(kstep, name)
    if choice == "decide":
        mode = rng.choice(["one", "batch", "two-replicas", "dies-mid-admission", "finalizers"])
        names = rng.sample(OBJECTS, rng.randint(1, 3))
        return lambda: sm.decide(mode, names, rng.choice(OBJECTS), rng.choice(["fresh", "stale", "none"]))
    if choice == "kueue-machine":
        inner = kueue_walk_step(rng, sm)

        def kueue_and_jobs() -> None:
            sm._kueue_jobs()
            inner()
        return kueue_and_jobs
    if choice == "bypass":
        started = rng.random() < 0.5
        return lambda: sm.bypass(name, started)
    if choice == "inside":
        at, event = rng.randint(0, 6), rng.choice(["trainer", "jobset", "job", "kubelet", "kubelet-now", "gc",
                                                   "kueue-sync", "kueue-evict", "kueue-jobs", "bypass"])
        return lambda: sm.release_with_event_inside(name, at, event)
    if choice == "concurrent":
        mode = rng.choice(["two-releases", "release-beside-controller", "release-beside-hold"])
        return lambda: sm.concurrent_writers(mode, name)
    if choice == "lost":
        path = rng.choice([r"/submissionrecords", r"/trainjobs$", r"/trainjobs/", r"/workloads/"])
        method = rng.choice(["POST", "PATCH"])
        return lambda: sm.lost_reply(path, method)
    if choice == "second-round":
        kinds = ["pod", "pod", "record", "foreign", "enrol", "marks", "nonindexed"]
        kind, index = rng.choice(kinds), rng.randint(0, 20)
        if kind == "marks":
            suspend = rng.random() < 0.5
            return lambda: sm.copy_marks(name, suspend)
        if kind == "nonindexed":
            nodes = rng.choice([2, 3])
            return lambda: sm.nonindexed_open(name, nodes)
        if kind == "pod":
            who, what = rng.choice(["writer", "editor"]), rng.choice(["relabel", "unfinalize", "force-delete"])
            return lambda: sm.pod_writer(who, what, index) if sm.cluster.pods() else None
        if kind == "record":
            how = rng.choice(["bind", "forge-a"])
            return lambda: sm.record_writer(name, how)
        if kind == "foreign":
            delta = rng.choice([-1, 0, 1])
            if index % 3 == 0:  # issue 35's writer, chosen without drawing again (the walks stay as they were)
                how = sorted(DIRECTIVE_ENTRIES)[(index // 3) % len(DIRECTIVE_ENTRIES)]
                return lambda: sm.directive_entry(name, how, forged=delta == 1)
            return lambda: sm.foreign_manager(name, delta)
        return lambda: sm.enrolment_collision(name)
    if choice == "gc":
        owners = rng.choice([1, 0])
        return lambda: sm.garbage_collector(owners)
    if choice == "runtime-edit":
        if name != OBJECTS[0]:
            return lambda: sm.runtime_edit(True)

        def edit_then_reopen() -> None:
            """The runtime gains a job; then a user closes the first object and opens it again (released), so
            Trainer builds its JobSet from the runtime as it is now (a JobSet already built keeps its jobs: JobSet's
            webhook) and the pods of the job it gained run only under dispatch's rule: covered by its entry, or
            refused. (Drawn by the object already chosen, so the walks' other draws stay as they were.)"""
            sm.runtime_edit(True)
            sm.writer("close", name)
            sm.writer("reopen", name)
        return edit_then_reopen
    if choice == "interrupted-close":
        if name not in sm.interrupted:
            return lambda: sm.interrupted_close(name)

        def remedy() -> None:
            """What its status named, ``close`` again; then the user opens the submission again."""
            sm.writer("close", name)
            sm.writer("reopen-held", name)
        return remedy
    if choice == "namespace":
        if live:
            op = rng.choice(["delete", "delete", "mark"])
            return lambda: sm.namespace(op)

        def while_it_goes() -> None:
            """Time passes while it is deleted: grace periods end, the finalizer keeper frees the pods whose
            end it proves, the namespace controller's pass, and the team re-creates it once it is gone."""
            sm.cluster_step("grace-periods-end")
            sm.decide("finalizers", [name], name, "none")
            sm.namespace("recreate")
        return while_it_goes
    if choice == "kubelet":
        outcome = rng.choice(["reject", "admit", "admit", "init-hangs", "init-finishes", "crash", "partition",
                              "heal", "heal", "failure-recovery"])
        node, index = rng.choice(("node-0", "node-1", "node-2")), rng.randint(0, 20)
        return lambda: sm.kubelet_outcome(outcome, node, index)
    index = rng.randint(0, 20)
    return lambda: sm.marked_failed_by_someone_else(index) if sm.cluster.pods() else None


WALKS = int(os.environ.get("DISPATCH_EVERY_WRITER_WALKS", "30"))
WALK_STEPS = 250


def test_seeded_long_walks_of_every_writer_reach_waiting_and_re_admission_and_never_overlap() -> None:
    """Hypothesis favours short schedules; these fixed-seed walks are long enough to reach waiting on
    pods that may still run, refused bypasses and re-admission many times, with every writer, so the
    checker runs on exactly the schedules that matter (and the test fails if they stop being reached)."""
    SEEN.clear()
    seed = int(os.environ.get("DISPATCH_WALK_SEED", "20261201"))
    rng = random.Random(seed)
    for _ in range(WALKS):
        sm = EveryWriter()
        ways = tuple(rng.choice(WAYS) for _ in OBJECTS)
        sm.setup_every_writer(ways, rng.random() < 0.5, rng.random() < 0.3, gc_lag=rng.random() < 0.5)
        try:
            for _ in range(WALK_STEPS):
                _walk_step(rng, sm)()
                sm.no_two_executions_overlap()
                sm.the_shipped_roles_allowed_every_request()
                sm.the_guard_refused_every_unsafe_bypass()
                sm.an_a_is_issued_once()
        finally:
            sm.teardown()
    print("walks reached", dict(SEEN))
    # The floors below are tuned on the default seed. Another seed's walks may reach some schedule less often
    # (seeds 1, 2, 5 and 10 re-admit 16 to 27 times, not 30) after the checker passed every step: a floor missed
    # says the seed covers less, not that the promise broke (the "== 0" counts below are the writers' own).
    reached = f"seed {seed}'s walks passed the checker at every step; floors tuned on seed 20261201: {dict(SEEN)}"
    assert SEEN["waited"] >= 150 and SEEN["re-admitted"] >= 30, reached
    assert SEEN["bypass-refused"] >= 50, reached
    # the kubelet outcomes and the healing phase are reached too
    assert SEEN["crashed"] >= 10 and SEEN["failure-recovery"] >= 2, reached
    # Nodes of live kubelets were deleted (their processes ran on, unseen by a plain read) and registered again
    assert SEEN["node-deleted-live"] >= 5 and SEEN["kubelet-registered-again"] >= 1, reached
    assert SEEN["healed-ceased"] >= 10 and SEEN["healed-by-action"] >= 2, reached
    # issue 25's writers are reached, and every one that could hide a pod or reuse an A was refused
    assert SEEN["pod-write-refused"] >= 20 and SEEN["pod-write-went-through"] == 0, reached
    assert SEEN["record-bind-refused"] >= 3 and SEEN["foreign-entry-refused"] >= 3, reached
    assert SEEN["directive-entry-refused"] >= 3 and SEEN["directive-entry-went-through"] == 0, reached
    assert SEEN["enrol-collision-refused"] >= 3, reached
    # issue 35's writers: MultiKueue's marks and NonIndexed runtimes, every one refused
    assert SEEN["copy-marks-refused"] >= 3 and SEEN["nonindexed-open-refused"] >= 3, reached
    # a lagging garbage collector found a closed object's Job still there; runtime edits were refused (by the
    # guard, or JobSet's webhook keeping a JobSet as it was built) or covered by a raise, and no pod of a job
    # they added ran outside dispatch's rule; interrupted closes were named and finished by `close` again
    assert SEEN["gc-lagging-job"] >= 10 and SEEN["gc-lagging-job-unsuspended"] >= 3, reached
    assert SEEN["runtime-edit-refused"] + SEEN["runtime-edit-jobset-kept"] >= 3, reached
    assert SEEN["runtime-edit-covered"] >= 2 and SEEN["runtime-edit-uncovered-ran"] == 0, reached
    assert SEEN["close-interrupted-named"] >= 10 and SEEN["close-interrupted-finished"] >= 3, reached
    # the namespace was deleted (held Terminating by pods whose end was unproven) and re-created; submissions
    # ran again in its next life, and every A issued there was above those of its earlier lives
    assert SEEN["ns-deleted"] >= 8 and SEEN["ns-held"] >= 10 and SEEN["ns-recreated"] >= 5, reached
    assert SEEN["ns-a-continued"] >= 10 and SEEN["ns-ran-in-two-lives"] >= 3, reached


def test_a_foreign_entry_below_the_raised_a_is_refused_without_the_webhook_so_pods_carry_the_reported_a() -> None:
    """Issue 25, item 5, as the machine found it with the webhook only recording: dispatch's check raised a
    Kueue object's A to 1 (Ready, still suspended), another manager then listed an entry setting A=0, and
    Kueue's start built pods carrying A=0 while the TrainJob reported 1. The ``dispatch-identity`` CEL policy
    refuses that entry with or without the webhook (the API server enforces it; the chart keeps it with
    ``guard.enabled=false``); the fake enforced it only with the webhook. The machine's steps, replayed."""
    sm = EveryWriter()
    sm.setup_every_writer(ways=("kueue-unlabelled", "plain", "plain"), guard_everyone=False, liveness=False,
                          init_containers=False, gc_lag=True)
    try:
        sm.decide(hints="fresh", mode="one", names=["a-s1"], other="a-s1")
        sm.foreign_manager(delta=-1, name="a-s1")
        tj = sm.cluster.server.get(TRAINER, "trainjobs", NS, "a-s1")
        assert tj is not None
        assert [e.get("manager") for e in tj["spec"]["runtimePatches"]].count("example.com/tuner") == 0, (
            "the CEL policy lets no other manager's entry set A below the TrainJob's")
        refused = f"sets pod label {n.LABEL_ADMISSION}=0"
        assert any(refused in msg for msg in sm.guard.denied), sm.guard.denied
        sm.round_trip(name="a-s1", stop="hold", wait=0)
        sm.no_two_executions_overlap()
        ran = [p for p in sm.cluster.history.processes if p.obj_name == "a-s1"]
        assert ran and {p.admission for p in ran} == {1}, [p.describe() for p in ran]
    finally:
        sm.teardown()


def test_a_resume_trainer_could_not_build_then_held_and_released_is_one_execution_of_the_last_a() -> None:
    """Issue 34, as the walks of seeds 1 and 10 found it, shrunk: a closed object's JobSet is still there (the
    collector lags) when the submission is opened again, released (A=1); Trainer sees that resume and builds
    nothing beside the old JobSet; a hold and a release (A=2) land before its next pass, so it never sees the
    object suspended. Once the collector takes the old JobSet, Trainer builds from the TrainJob as it reads it
    then: every pod carries A=2, what the release reported, and no process carried 1. The checker took the A of
    the resume Trainer first saw as reported (1) and failed this history; it now takes the A Trainer built from."""
    sm = EveryWriter()
    sm.setup_every_writer(ways=("plain", "plain", "plain"), guard_everyone=False, gc_lag=True)
    try:
        sm.cluster_step("grace-periods-end")   # Trainer builds c-s1's JobSet, suspended
        sm.writer("close", "c-s1")              # its collector has not reached the JobSet
        sm.writer("reopen", "c-s1")             # opened again, released: A=1
        sm.cluster_step("grace-periods-end")   # Trainer sees the resume and refuses to build beside the old JobSet
        assert not sm.cluster.pods("c-s1")
        sm.writer("hold", "c-s1")
        sm.writer("release", "c-s1")            # A=2, before Trainer's next pass
        sm.no_two_executions_overlap()
        sm.faults_stop_and_every_ended_object_becomes_admissible()   # the collector takes the old JobSet
        ran = [p for p in sm.cluster.history.processes if p.obj_name == "c-s1"]
        assert ran and {(p.admission, p.reported) for p in ran} == {(2, 2)}, [p.describe() for p in ran]
        assert len({p.execution for p in ran}) == 1
    finally:
        sm.teardown()


def test_a_hold_after_the_runtime_gained_a_job_names_the_way_out() -> None:
    cluster = FakeCluster()
    cluster.add_runtime(replacement_policy="Failed")
    cluster.install_jobset_webhook()
    for node in ("node-0", "node-1"):
        cluster.add_node(node)
    with Adapter.connect(NS, transport=cluster.transport(roles=WRITER)) as writer:
        writer.core.settle_seconds = 0
        writer.open(JobSpec(job_id="llama", submission="s1", num_nodes=2))
        assert writer.release("llama-s1").admission == 1
        cluster.settle()

        def gain(obj: dict[str, Any]) -> None:
            jobs = obj["spec"]["template"]["spec"]["replicatedJobs"]
            jobs.append({**copy.deepcopy(jobs[0]), "name": "launcher"})
        cluster.server.update(TRAINER, "clustertrainingruntimes", "", "torch-distributed", gain, status=None)
        writer.hold("llama-s1")
        cluster.settle()
        cluster.advance(60)
        cluster.settle()
        assert cluster.running_processes("llama-s1"), "JobSet's webhook kept the JobSet running"
        status = writer.inspect("llama-s1")
        assert status.cause is not None and "jobset llama-s1 is not suspended yet" in status.cause.detail
        cluster.history.check()
        assert "`dispatch close llama-s1`" in status.cause.detail, status.cause


@pytest.mark.parametrize("how", sorted(DIRECTIVE_ENTRIES))
def test_a_directive_entry_is_refused_with_the_webhook_only_recording(how: str) -> None:
    """Issue 35, item 1, as the machine draws it with the webhook only recording (so only the API server's own
    ``dispatch-identity`` CEL policy stands in the way): a held object that has run, then an entry with the
    directive, forged as Kueue's; refused, and the entries stay as they were."""
    sm = EveryWriter()
    sm.setup_every_writer(ways=("plain", "plain", "plain"), guard_everyone=False, liveness=False,
                          init_containers=False, gc_lag=False)
    try:
        sm.writer("release", "a-s1")
        sm.cluster_step("settle")
        sm.writer("hold", "a-s1")
        sm.cluster_step("grace-periods-end")
        sm.cluster_step("settle")
        before = sm.cluster.server.get(TRAINER, "trainjobs", NS, "a-s1")
        assert before is not None and before["spec"]["suspend"]
        SEEN.clear()
        sm.directive_entry("a-s1", how, forged=True)
        assert SEEN["directive-entry-refused"] == 1, SEEN
        after = sm.cluster.server.get(TRAINER, "trainjobs", NS, "a-s1")
        assert after is not None and after["spec"]["runtimePatches"] == before["spec"]["runtimePatches"]
        sm.no_two_executions_overlap()
    finally:
        sm.teardown()
