"""Kueue mode under random schedules: the admission check, Kueue, the cluster and failures interleaved.

A hypothesis state machine drives the fake Kueue (admitting Workloads whose checks are Ready, preempting
them, releasing and re-reserving quota as soon as JobSet reports no active Job, which is while pods may
still be Terminating), the fake cluster's controllers and kubelets one step at a time, nodes freezing,
being tainted out-of-service or deleted, pods finishing or force-deleted (on reachable and on frozen nodes:
dispatch's finalizer keeps a force-deleted pod that may still run in the API), injected API errors, and
the controller itself: one Workload at a time, batches with fresh, stale or no hints, two replicas
deciding at once, a replica that dies between raising A and setting Ready, and its finalizer keeper
releasing pods whose end is proven. After every
step the history checker asserts that no two admission numbers of one object ever ran at once and that A
rose with each execution.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from collections.abc import Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dispatch import AsyncAdapter, DispatchError, JobSpec
from dispatch import _kube as k
from dispatch._kueue import WorkloadHint
from dispatch.controller._events import EventRecorder
from dispatch.controller._finalizers import FinalizerKeeper
from dispatch.controller._metrics import Metrics
from dispatch.controller._reconcile import Reconciler
from dispatch.controller._versions import TrainJobVersions
from dispatch.controller.testing import KUEUE, FakeKueue
from dispatch.testing import FakeCluster

NS = "default"
OBJECTS = ("a-s1", "b-s1", "c-s1")
NODES = ("node-0", "node-1", "node-2")
EXAMPLES = int(os.environ.get("DISPATCH_KUEUE_STATEFUL_EXAMPLES", "300" if os.environ.get("CI") else "60"))


SEEN: Counter[str] = Counter()
"""What the schedules reached, for the test that the machine exercises what matters."""


class Crash(Exception):
    """A replica dies between raising A and setting Ready."""


def spec(name: str) -> JobSpec:
    job_id, submission = name.split("-")
    return JobSpec(job_id=job_id, submission=submission, queue="lq-dispatch", num_nodes=2)


class NeverTwoExecutionsUnderKueue(RuleBasedStateMachine):
    cluster: FakeCluster
    kueue: FakeKueue

    @initialize()
    def setup(self) -> None:
        self.cluster = FakeCluster()
        self.cluster.add_runtime(replacement_policy="Failed")
        for node in NODES:
            self.cluster.add_node(node)
        self.kueue = FakeKueue(self.cluster)
        self.kueue.install()
        self.tainted: set[str] = set()
        self.workloads: dict[str, str] = {}
        self.stale: dict[str, WorkloadHint] = {}

        async def open_all() -> None:
            kube = k.Kube.connect(namespace=NS, transport=self.cluster.transport(
                roles=("dispatch-writer", "dispatch-node-reader")))
            try:
                for name in OBJECTS:
                    await AsyncAdapter(kube).open(spec(name))
            finally:
                await kube.aclose()
        asyncio.run(open_all())
        for name in OBJECTS:
            self.workloads[name] = self.kueue.workload_for(name)
        self.stale = self._cache()
        self.stale_versions = self._versions()

    def _versions(self) -> TrainJobVersions:
        """The TrainJob versions a controller's watch would hold now (kept, they lag as the stale hints do)."""
        versions = TrainJobVersions()
        versions.begin()
        versions.page(self.cluster.server.objects("trainer.kubeflow.org", "trainjobs", NS))
        versions.end()
        return versions

    def _cache(self) -> dict[str, WorkloadHint]:
        return {w["metadata"]["name"]: WorkloadHint.from_obj(w)
                for w in self.cluster.server.objects(KUEUE, "workloads")}

    async def _decide(self, plans: list[tuple[list[str], str, bool]]) -> None:
        """Run one reconciler per plan at once (replicas): (Workload names, hints, dies mid-admission)."""

        async def one(names: list[str], hints: str, dies: bool) -> None:
            kube = k.Kube.connect(namespace=NS, transport=self.cluster.transport("dispatch-controller"))
            metrics = Metrics.create()
            # A decision alone reads the lower layers early when the versions hold its TrainJob: fresh ones, or
            # ones as old as the stale hints (a lagging watch), whose early read must then be dropped.
            versions = {"fresh": self._versions(), "stale": self.stale_versions}.get(hints)
            rec = Reconciler(kube, check_names=lambda: {"dispatch"}, metrics=metrics,
                             events=EventRecorder(kube, metrics, instance="fuzz"),
                             seen_trainjob=versions.seen if versions is not None else lambda _ns, _name: None)
            if dies:
                def crash() -> None:
                    raise Crash
                rec.before_ready = crash
            try:
                if len(names) == 1 and hints == "none":
                    try:
                        await rec.reconcile(NS, names[0])
                    except (DispatchError, Crash):
                        pass
                else:
                    cache = {"fresh": self._cache(), "stale": self.stale, "none": {}}[hints]
                    results = await rec.reconcile_many(NS, names, known=len(cache), hints=cache)
                    for value in results.values():
                        if isinstance(value, Exception) and not isinstance(value, DispatchError | Crash):
                            raise value
                    for outcome in ("used", "stale"):
                        SEEN[f"early-{outcome}"] += int(metrics.early_reads.labels(outcome)._value.get())
            finally:
                await rec._events.drain()
                await kube.aclose()

        await asyncio.gather(*(one(*plan) for plan in plans))
        for wl in self.workloads.values():
            if self.kueue.entry(wl)["message"].startswith("waiting for pods"):
                SEEN["waited"] += 1

    def teardown(self) -> None:
        if hasattr(self, "cluster"):
            for name in OBJECTS:
                numbers = {p.admission for p in self.cluster.history.processes if p.obj_name == name}
                if len(numbers) > 1:
                    SEEN["re-admitted"] += 1

    # ------------------------------------------------------------------ the admission check
    # Few rules with many variants each: hypothesis picks rules uniformly, so the deciding, Kueue and
    # cluster steps stay frequent enough for preemption, waiting and re-admission to happen often.

    async def _release_finalizers(self) -> None:
        """One pass of the controller's finalizer keeper over every pod it would watch."""
        kube = k.Kube.connect(namespace=NS, transport=self.cluster.transport())
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
        wls = [self.workloads[n] for n in names]
        if mode == "finalizers":
            asyncio.run(self._release_finalizers())
            return
        if mode == "one":
            plans = [(wls[:1], "none", False)]
        elif mode == "batch":
            plans = [(wls, hints, False)]
        elif mode == "two-replicas":
            plans = [(wls, hints, False), ([self.workloads[other]], "none", False)]
        else:
            plans = [(wls, "fresh", True)]
        asyncio.run(self._decide(plans))

    @rule()
    def cache_goes_stale(self) -> None:
        self.stale = self._cache()
        self.stale_versions = self._versions()

    # ------------------------------------------------------------------ Kueue

    @rule(step=st.sampled_from(["sync", "settle", "preempt", "preempt-and-requeue"]), name=st.sampled_from(OBJECTS))
    def kueue_step(self, step: str, name: str) -> None:
        if step == "sync":
            self.kueue.sync()
        elif step == "settle":              # a while passes in which Kueue and the cluster act, not the check
            self.kueue.sync()
            self.cluster.settle(2)
            self.kueue.sync()
        else:
            wl = self.kueue.workload(self.workloads[name])
            if any(c.get("type") == "Admitted" and c.get("status") == "True"
                   for c in wl["status"].get("conditions") or []):
                self.kueue.evict(self.workloads[name])
            if step == "preempt-and-requeue":
                # The hazard in one step: suspended all the way down while its pods are still
                # Terminating, and Kueue re-reserves quota at once because JobSet reports no active Job.
                self.cluster.settle(2)
                self.kueue.sync()

    # ------------------------------------------------------------------ the cluster

    @rule(step=st.sampled_from(["trainer", "jobset", "job", "kubelet", "kubelet-now", "gc", "settle", "10s",
                                "grace-periods-end", "grace-periods-end"]))
    def cluster_step(self, step: str) -> None:
        c = self.cluster
        c.schedule()
        if step.endswith("s") and step[:-1].isdigit():
            c.advance(int(step[:-1]))
        elif step == "settle":
            c.settle(2)
        elif step == "grace-periods-end":   # every reachable kubelet confirms its pods' termination
            c.advance(31)
            c.settle(2)
            self.kueue.sync()
        else:
            {"trainer": c.trainer_sync, "jobset": c.jobset_sync, "job": c.job_sync, "kubelet": c.kubelet_sync,
             "kubelet-now": lambda: c.kubelet_sync(honour_grace=False), "gc": c.pod_gc}[step]()

    @rule(event=st.sampled_from(["freeze", "thaw", "taint-out-of-service", "delete", "replace"]),
          node=st.sampled_from(NODES))
    def node_event(self, event: str, node: str) -> None:
        c = self.cluster
        if event == "freeze" and node not in c.deleted_nodes:
            c.freeze_node(node)
        elif event == "thaw" and node in c.frozen and node not in self.tainted:
            c.thaw_node(node)
        elif event == "taint-out-of-service" and node in c.frozen and node not in self.tainted:
            self.tainted.add(node)
            c.taint_out_of_service(node)
        elif event == "delete" and node not in c.deleted_nodes:
            # An operator deletes a lost node's Node (Ready=Unknown: the machine is gone, as they assert, and
            # as for the out-of-service taint the model makes the assertion true), or a live node's by mistake:
            # its kubelet runs on and does not register again (issue 40).
            if node in c.frozen or node in c.partitioned:
                c.remove_machine(node)
            else:
                c.delete_node(node)
            self.tainted.discard(node)
        elif event == "replace" and node in c.machines_gone:
            c.add_node(node)  # another machine under the same name
        elif event == "replace" and node in c.deleted_nodes:
            c.restart_kubelet(node)  # the way out of a mistaken delete: it registers again

    @precondition(lambda self: bool(self.cluster.pods()))
    @rule(index=st.integers(0, 20), event=st.sampled_from(["Succeeded", "Failed", "force-deleted"]))
    def pod_event(self, index: int, event: str) -> None:
        """A pod finishes, or is force-deleted, on a reachable node or a frozen one (there its process
        goes on, and only dispatch's finalizer keeps it visible to the rule)."""
        pods = self.cluster.pods()
        pod = pods[index % len(pods)]
        if event != "force-deleted":
            self.cluster.finish_pod(pod["metadata"]["name"], event)
        else:
            self.cluster.force_delete(pod["metadata"]["name"])

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
    def the_shipped_roles_allowed_every_request(self) -> None:
        if hasattr(self, "cluster"):
            assert self.cluster.server.denied == []


NeverTwoExecutionsUnderKueue.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestNeverTwoExecutionsUnderKueue = NeverTwoExecutionsUnderKueue.TestCase


def _step(rng: random.Random, sm: NeverTwoExecutionsUnderKueue) -> Callable[[], None]:
    """One uniformly chosen rule of the machine with uniformly chosen arguments."""
    choice = rng.choice(["decide", "cache_goes_stale", "kueue_step", "cluster_step", "node_event", "pod_event",
                         "api_error"])
    if choice == "decide":
        names = rng.sample(OBJECTS, rng.randint(1, 3))
        mode = rng.choice(["one", "batch", "two-replicas", "dies-mid-admission", "finalizers"])
        return lambda: sm.decide(mode, names, rng.choice(OBJECTS), rng.choice(["fresh", "stale", "none"]))
    if choice == "kueue_step":
        step, name = rng.choice(["sync", "settle", "preempt", "preempt-and-requeue"]), rng.choice(OBJECTS)
        return lambda: sm.kueue_step(step, name)
    if choice == "cluster_step":
        step = rng.choice(["trainer", "jobset", "job", "kubelet", "kubelet-now", "gc", "settle", "10s",
                           "grace-periods-end", "grace-periods-end"])
        return lambda: sm.cluster_step(step)
    if choice == "node_event":
        event = rng.choice(["freeze", "thaw", "taint-out-of-service", "delete", "replace"])
        node = rng.choice(NODES)
        return lambda: sm.node_event(event, node)
    if choice == "pod_event":
        index, event = rng.randint(0, 20), rng.choice(["Succeeded", "Failed", "force-deleted"])
        return lambda: sm.pod_event(index, event) if sm.cluster.pods() else None
    if choice == "api_error":
        status = rng.choice([409, 500, 503, 429, "timeout", "connect"])
        after, method = rng.random() < 0.5, rng.choice(["GET", "PATCH", None])
        return lambda: sm.api_error(status, after, method)
    return sm.cache_goes_stale


WALKS = 200


def test_seeded_random_walks_reach_re_admission_after_waiting_and_never_overlap() -> None:
    """Hypothesis favours short, shrinkable schedules; these fixed-seed walks are long enough to reach
    preemption, waiting on Terminating pods and re-admission many times, so the invariant is checked
    on exactly the schedules that matter (and the test fails if they stop being reached)."""
    SEEN.clear()
    rng = random.Random(int(os.environ.get("DISPATCH_WALK_SEED", "20261130")))
    for _ in range(WALKS):
        sm = NeverTwoExecutionsUnderKueue()
        sm.setup()
        try:
            for _ in range(50):
                _step(rng, sm)()
                sm.no_two_executions_overlap()
        finally:
            sm.teardown()
    print("walks reached", dict(SEEN))
    assert SEEN["waited"] >= 10 and SEEN["re-admitted"] >= 3, SEEN
    assert SEEN["early-used"] >= 10 and SEEN["early-stale"] >= 1, SEEN   # lone early reads, used and dropped
