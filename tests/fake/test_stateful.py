"""Random interleavings of every writer call and every cluster event, checked for overlapping executions.

A hypothesis state machine drives two writers (a sync adapter and two concurrent async releases), the fake
cluster's controllers and kubelets one step at a time, nodes freezing, thawing, being deleted or tainted,
pods finishing or being force-deleted (on reachable and frozen nodes), pods of frozen nodes marked Failed by
someone other than their kubelet (PodGC, Kueue), and injected API errors (409, 500, timeouts, lost
replies) — including cluster events fired *inside* a call, between its read and its write. After every
step the history checker asserts that no two admission numbers of one object ever ran at once and that A
rose with each execution.

Force deletion on an unreachable node used to be left out: such a pod may keep running and, once gone from
the API, nothing could see it. dispatch's finalizer now keeps it in the API until its end is proven, so
the machine force-deletes pods on frozen nodes too.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dispatch import Adapter, AsyncAdapter, DispatchError, JobSpec
from dispatch import _names as n
from dispatch._identity import record_name
from dispatch.testing import FakeCluster

WRITER = ("dispatch-writer", "dispatch-node-reader")
"""Writers hold exactly the shipped writer role."""
OBJECTS = ("a-s1", "b-s1")
NODES = ("node-0", "node-1", "node-2")
EXAMPLES = int(os.environ.get("DISPATCH_STATEFUL_EXAMPLES", "1000" if os.environ.get("CI") else "150"))


def spec(name: str) -> JobSpec:
    job_id, submission = name.split("-")
    return JobSpec(job_id=job_id, submission=submission, num_nodes=2)


class NeverTwoExecutions(RuleBasedStateMachine):
    """The promise under random schedules."""

    cluster: FakeCluster
    adapter: Adapter

    @initialize()
    def setup(self) -> None:
        self.cluster = FakeCluster()
        self.cluster.add_runtime(replacement_policy="Failed")
        for node in NODES:
            self.cluster.add_node(node)
        self.adapter = Adapter.connect("default", transport=self.cluster.transport(roles=WRITER))
        # Nothing else steps while a writer waits here, so release's wait for a layer to acknowledge a
        # suspension would only pass wall time (10 s a call: 1000 examples under CI took hours).
        self.adapter.core.settle_seconds = 0
        self.tainted: set[str] = set()
        self.admissions: dict[str, list[int]] = {o: [] for o in OBJECTS}
        self.forgotten: set[str] = set()
        for name in OBJECTS:
            self.adapter.open(spec(name))

    def teardown(self) -> None:
        adapter = getattr(self, "adapter", None)
        if adapter is not None:
            adapter.shutdown()

    def _call(self, fn: Callable[[], object]) -> object:
        try:
            return fn()
        except DispatchError as exc:
            return exc

    def _record(self, name: str, result: object) -> None:
        admission = getattr(result, "admission", None)
        if isinstance(admission, int) and admission > 0:
            seen = self.admissions[name]
            assert not seen or admission >= seen[-1], (name, seen, admission)
            if not seen or admission != seen[-1]:
                seen.append(admission)

    # ------------------------------------------------------------------ writers

    @rule(name=st.sampled_from(OBJECTS))
    def release(self, name: str) -> None:
        self._record(name, self._call(lambda: self.adapter.release(name)))

    @rule(name=st.sampled_from(OBJECTS), at=st.integers(0, 6),
          event=st.sampled_from(["trainer", "jobset", "job", "kubelet", "kubelet-now", "gc", "hold"]))
    def release_with_event_inside(self, name: str, at: int, event: str) -> None:
        """A cluster event (or another writer's hold) lands between release's read and its write."""
        count = {"n": 0}

        def hook(method: str, path: str) -> None:
            count["n"] += 1
            if count["n"] == at + 1:
                self.cluster.server.before_request = None
                self._event(event, name)

        self.cluster.server.before_request = hook
        try:
            self._record(name, self._call(lambda: self.adapter.release(name)))
        finally:
            self.cluster.server.before_request = None

    @rule(name=st.sampled_from(OBJECTS))
    def concurrent_releases(self, name: str) -> None:
        """Two writers release the same object at once; the resourceVersion preconditions fence them."""

        async def both() -> list[object]:
            one = AsyncAdapter.connect("default", transport=self.cluster.transport(roles=WRITER))
            two = AsyncAdapter.connect("default", transport=self.cluster.transport(roles=WRITER))
            one.settle_seconds = two.settle_seconds = 0
            try:
                return list(await asyncio.gather(one.release(name), two.release(name), return_exceptions=True))
            finally:
                await one.aclose()
                await two.aclose()

        results = asyncio.run(both())
        admitted = {getattr(r, "admission", None) for r in results if not isinstance(r, BaseException)}
        assert len(admitted - {None}) <= 1 or self.cluster.running_processes(name) == [], results
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, DispatchError):
                raise r
            self._record(name, r)

    @rule(name=st.sampled_from(OBJECTS))
    def hold(self, name: str) -> None:
        self._call(lambda: self.adapter.hold(name))

    @rule(name=st.sampled_from(OBJECTS))
    def close(self, name: str) -> None:
        self._call(lambda: self.adapter.close(name))

    @rule(name=st.sampled_from(OBJECTS), hold=st.booleans())
    def reopen(self, name: str, hold: bool) -> None:
        result = self._call(lambda: self.adapter.open(spec(name), hold=hold))
        self._record(name, getattr(result, "identity", None))

    @rule(name=st.sampled_from(OBJECTS))
    def inspect_and_ceased(self, name: str) -> None:
        self._call(lambda: self.adapter.inspect(name))
        self._call(lambda: self.adapter.ceased(name))

    @rule(name=st.sampled_from(OBJECTS), hold=st.booleans())
    def open_under_another_name(self, name: str, hold: bool) -> None:
        """A second open of the same submission under another TrainJob name: refused while one holds it."""
        job_id, submission = name.split("-")
        alt = JobSpec(job_id=job_id, submission=submission, num_nodes=2, name=f"{name}-x")
        result = self._call(lambda: self.adapter.open(alt, hold=hold))
        self._record(name, getattr(result, "identity", None))

    @rule(name=st.sampled_from(OBJECTS))
    def concurrent_opens_of_one_submission(self, name: str) -> None:
        job_id, submission = name.split("-")

        async def both() -> list[object]:
            one = AsyncAdapter.connect("default", transport=self.cluster.transport(roles=WRITER))
            two = AsyncAdapter.connect("default", transport=self.cluster.transport(roles=WRITER))
            one.settle_seconds = two.settle_seconds = 0
            try:
                return list(await asyncio.gather(
                    one.open(JobSpec(job_id=job_id, submission=submission, num_nodes=2, name=f"{name}-p"),
                             hold=False),
                    two.open(JobSpec(job_id=job_id, submission=submission, num_nodes=2, name=f"{name}-q"),
                             hold=False),
                    return_exceptions=True))
            finally:
                await one.aclose()
                await two.aclose()

        results = asyncio.run(both())
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, DispatchError):
                raise r
        assert sum(1 for r in results if not isinstance(r, BaseException)) <= 1, results

    @rule(path=st.sampled_from([r"/submissionrecords", r"/trainjobs$", r"/trainjobs/"]),
          method=st.sampled_from(["POST", "PATCH"]))
    def lost_reply(self, path: str, method: str) -> None:
        """The server applies the write and the reply is lost."""
        self.cluster.server.inject(method=method, path=path, status="timeout", after=True)

    @rule(name=st.sampled_from(OBJECTS), edit=st.sampled_from(["delete", "release-claim", "token"]))
    def third_party_edits_the_record(self, name: str, edit: str) -> None:
        """Someone else edits a submission's identity record (an admin deletes it, a writer patches it)."""
        job_id, submission = name.split("-")
        rname = record_name(job_id, submission)
        if self.cluster.server.get(n.DOMAIN, "submissionrecords", "default", rname) is None:
            return
        if edit == "delete":
            self.cluster.server.delete(n.DOMAIN, "submissionrecords", "default", rname)
            self.forgotten.add(name)
        elif edit == "release-claim":
            self.cluster.server.update(n.DOMAIN, "submissionrecords", "default", rname,
                                       lambda o: o["spec"]["trainJob"].update(name="", uid=""))
        else:
            self.cluster.server.update(n.DOMAIN, "submissionrecords", "default", rname,
                                       lambda o: o["spec"].update(token="someone-else"))

    # ------------------------------------------------------------------ the cluster

    def _event(self, event: str, name: str) -> None:
        c = self.cluster
        if event == "trainer":
            c.trainer_sync()
        elif event == "jobset":
            c.jobset_sync()
        elif event == "job":
            c.job_sync()
        elif event == "kubelet":
            c.kubelet_sync()
        elif event == "kubelet-now":
            c.kubelet_sync(honour_grace=False)
        elif event == "gc":
            c.pod_gc()
        elif event == "hold":
            c.server.update("trainer.kubeflow.org", "trainjobs", "default", name,
                            lambda o: o["spec"].update(suspend=True), status=False, admit=False) \
                if c.server.get("trainer.kubeflow.org", "trainjobs", "default", name) else None

    @rule(event=st.sampled_from(["trainer", "jobset", "job", "kubelet", "kubelet-now", "gc"]))
    def controller_step(self, event: str) -> None:
        self.cluster.schedule()
        self._event(event, OBJECTS[0])

    @rule()
    def settle(self) -> None:
        self.cluster.settle(2)

    @rule(seconds=st.sampled_from([1, 10, 31, 120]))
    def time_passes(self, seconds: int) -> None:
        self.cluster.advance(seconds)

    @rule(node=st.sampled_from(NODES))
    def freeze(self, node: str) -> None:
        if node not in self.cluster.deleted_nodes:
            self.cluster.freeze_node(node)

    @rule(node=st.sampled_from(NODES))
    def thaw(self, node: str) -> None:
        if node in self.cluster.frozen and node not in self.tainted:
            self.cluster.thaw_node(node)

    @rule(node=st.sampled_from(NODES))
    def operator_taints_a_lost_node(self, node: str) -> None:
        if node in self.cluster.frozen and node not in self.tainted:
            self.tainted.add(node)
            self.cluster.taint_out_of_service(node)

    @rule(node=st.sampled_from(NODES))
    def node_deleted(self, node: str) -> None:
        """The operator deletes a lost node's Node (frozen: the machine goes, as they assert) or, by mistake, a
        live one's: its kubelet runs on and does not register again (issue 40)."""
        c = self.cluster
        if node not in c.deleted_nodes:
            if node in c.frozen or node in c.partitioned:
                c.remove_machine(node)
            else:
                c.delete_node(node)
            self.tainted.discard(node)

    @rule(node=st.sampled_from(NODES))
    def node_replaced(self, node: str) -> None:
        """Another machine under the name, or the live kubelet restarted (it registers again)."""
        c = self.cluster
        if node in c.machines_gone:
            c.add_node(node)
        elif node in c.deleted_nodes:
            c.restart_kubelet(node)

    @precondition(lambda self: bool(self.cluster.pods()))
    @rule(index=st.integers(0, 20), phase=st.sampled_from(["Succeeded", "Failed"]))
    def pod_finishes(self, index: int, phase: str) -> None:
        pods = self.cluster.pods()
        pod = pods[index % len(pods)]
        self.cluster.finish_pod(pod["metadata"]["name"], phase)

    @precondition(lambda self: bool(self.cluster.pods()))
    @rule(index=st.integers(0, 20))
    def force_delete(self, index: int) -> None:
        pods = self.cluster.pods()
        pod = pods[index % len(pods)]
        self.cluster.force_delete(pod["metadata"]["name"])

    @precondition(lambda self: bool(self.cluster.pods()))
    @rule(index=st.integers(0, 20))
    def marked_failed_by_someone_else(self, index: int) -> None:
        """Only while the object is held: in a running Job, a Failed phase is the Job controller's cue for
        a replacement of that rank, which is Kueue's and the operator's trade-off, not dispatch's rule."""
        pods = self.cluster.pods()
        pod = pods[index % len(pods)]
        tj = self.cluster.server.get("trainer.kubeflow.org", "trainjobs", "default",
                                     pod["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name", ""))
        if tj is not None and tj["spec"].get("suspend"):
            self.cluster.mark_failed(pod["metadata"]["name"])

    @rule(status=st.sampled_from([409, 500, 503, 429, "timeout", "connect"]), after=st.booleans(),
          method=st.sampled_from(["GET", "PATCH", None]))
    def api_error(self, status: int | str, after: bool, method: str | None) -> None:
        self.cluster.server.inject(method=method, status=status, after=after and method == "PATCH")

    # ------------------------------------------------------------------ the promise

    @invariant()
    def no_two_executions_overlap(self) -> None:
        if hasattr(self, "cluster"):
            self.cluster.history.check()

    @invariant()
    def a_is_never_reused_and_each_execution_has_one(self) -> None:
        """Per submission, every A a process ran with is at most its record's A (so the next is above it),
        unless an admin deleted the record; a running TrainJob's pods all carry the A it reports."""
        if not hasattr(self, "cluster"):
            return
        for name in OBJECTS:
            job_id, submission = name.split("-")
            rec = self.cluster.server.get(n.DOMAIN, "submissionrecords", "default", record_name(job_id, submission))
            ran = [p.admission for p in self.cluster.history.processes
                   if p.obj_name.startswith(name) and p.admission]
            if rec is not None and ran and name not in self.forgotten:
                assert max(ran) <= rec["spec"]["admission"], (name, ran, rec["spec"])
        for tj in self.cluster.server.objects("trainer.kubeflow.org", "trainjobs", "default"):
            if tj["spec"].get("suspend") is True:
                continue
            a = tj["metadata"].get("annotations", {}).get(n.ANNOTATION_ADMISSION)
            live = [p for p in self.cluster.pods(tj["metadata"]["name"])
                    if not p["metadata"].get("deletionTimestamp")
                    and p["status"].get("phase") not in ("Succeeded", "Failed")]
            fresh = [p for p in live if p["metadata"]["labels"].get(n.LABEL_ADMISSION) != a]
            # a pod of the previous execution may still run while a new one was admitted only if the rule let it:
            # pods not carrying the TrainJob's A must be Terminating (checked above) or belong to none
            assert not fresh, (tj["metadata"]["name"], a, [p["metadata"]["labels"] for p in fresh])

    @invariant()
    def the_shipped_roles_allowed_every_request(self) -> None:
        if hasattr(self, "cluster"):
            assert self.cluster.server.denied == []


NeverTwoExecutions.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestNeverTwoExecutions = NeverTwoExecutions.TestCase
