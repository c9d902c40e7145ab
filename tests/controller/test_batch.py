"""Deciding many Workloads from one shared read gives exactly what deciding each alone gives.

The batch path exists for speed only (a controller start or a burst of preemptions queues hundreds of
Workloads at once). These tests build the same cluster twice, decide it once Workload by Workload and
once as batches, and require the same outcomes, the same checks written and the same A on every
TrainJob; then they count what the batch saves and check that its errors stay per Workload.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatch import ANNOTATION_ADMISSION, LABEL_JOB_ID, LABEL_SUBMISSION, AsyncAdapter, JobSpec
from dispatch import _kube as k
from dispatch import _names as n
from dispatch._identity import new_record
from dispatch._kueue import WorkloadHint
from dispatch.controller._events import EventRecorder
from dispatch.controller._metrics import Metrics
from dispatch.controller._reconcile import Outcome, Reconciler
from dispatch.controller.testing import KUEUE, T0, FakeKueue
from dispatch.errors import Conflict
from dispatch.testing import FakeCluster

NS = "default"
KINDS = ("free", "blocked", "by-jobset-name", "by-dispatch-labels", "lost", "reopened", "foreign", "no-quota",
         "not-ours", "ready", "unlabelled")


@dataclass
class World:
    cluster: FakeCluster
    kueue: FakeKueue
    kube: k.Kube
    reconciler: Reconciler
    workloads: list[str]


def reconciler_for(kube: k.Kube) -> Reconciler:
    metrics = Metrics.create()
    return Reconciler(kube, check_names=lambda: {"dispatch"}, events=EventRecorder(kube, metrics, instance="t"),
                      metrics=metrics)


async def build(kinds: Sequence[str]) -> World:
    """One Workload per entry of ``kinds``, each in the state its name says, all with our check Pending."""
    cluster = FakeCluster()
    cluster.add_runtime()
    for node in ("node-0", "node-1", "node-2"):
        cluster.add_node(node)
    kueue = FakeKueue(cluster)
    kueue.install()
    kube = k.Kube.connect(namespace=NS, transport=cluster.transport("dispatch-controller"))  # the shipped role
    adapter = AsyncAdapter(k.Kube.connect(namespace=NS, transport=cluster.transport(
        roles=("dispatch-writer", "dispatch-node-reader"))))
    rec = reconciler_for(kube)
    names: list[str] = []
    for i, kind in enumerate(kinds):
        node = "node-2" if kind == "lost" else "node-0"
        spec = JobSpec(job_id="batch", submission=f"s{i}", queue="lq-dispatch",
                       node_selector={"kubernetes.io/hostname": node})
        obj = f"batch-s{i}"
        if kind == "foreign":
            names.append(foreign_workload(cluster, f"other-{i}"))
            continue
        if kind == "unlabelled":  # a TrainJob under the queue but without the queue label: found by get
            await adapter.open(spec)
            strip_queue_label(cluster, obj)
            names.append(kueue.workload_for(obj))
            continue
        if kind == "reopened":  # closed at A=3 earlier: its identity record lifts the next A above it
            cluster.server.create(n.DOMAIN, "submissionrecords", NS, new_record("batch", f"s{i}", "", admission=3))
        await adapter.open(spec)
        wl = kueue.workload_for(obj, reserve=kind != "no-quota",
                                other_checks=["other"] if kind == "not-ours" else ())
        if kind == "not-ours":
            drop_our_check(cluster, wl)
        if kind == "ready":
            kueue.set_check(wl, "dispatch", "Ready", "decided before")
        if kind in ("blocked", "lost"):
            await rec.reconcile(NS, wl)          # first admission, one at a time
            kueue.sync()
            cluster.settle()
            if kind == "lost":
                cluster.freeze_node(node)
            kueue.evict(wl)
            cluster.settle()
            kueue.sync()                          # re-reserved while the pod is Terminating
        if kind == "by-jobset-name":              # a leftover pod only JobSet's label selects
            stray_pod(cluster, f"stray-{i}", "node-1", {"jobset.sigs.k8s.io/jobset-name": obj})
        if kind == "by-dispatch-labels":          # a leftover pod only dispatch's labels select
            stray_pod(cluster, f"stray-{i}", "node-1", {LABEL_JOB_ID: "batch",
                                                        LABEL_SUBMISSION: f"s{i}"})
        names.append(wl)
    await adapter.aclose()
    assert cluster.server.denied == []
    return World(cluster, kueue, kube, rec, names)


def foreign_workload(cluster: FakeCluster, name: str) -> str:
    cluster.server.create(KUEUE, "workloads", NS, {
        "metadata": {"name": name, "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "u-" + name, "controller": True}]},
        "spec": {"queueName": "lq-dispatch", "active": True, "podSets": [{"name": "main", "count": 1}]},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                                   "message": "", "lastTransitionTime": T0}],
                   "admissionChecks": [{"name": "dispatch", "state": "Pending", "message": "",
                                        "lastTransitionTime": T0}]},
    })
    return name


def strip_queue_label(cluster: FakeCluster, trainjob: str) -> None:
    def mutate(obj: dict[str, Any]) -> None:
        obj["metadata"]["labels"].pop("kueue.x-k8s.io/queue-name", None)
    cluster.server.update("trainer.kubeflow.org", "trainjobs", NS, trainjob, mutate, status=False)


def stray_pod(cluster: FakeCluster, name: str, node: str, labels: dict[str, str]) -> None:
    cluster.server.create("", "pods", NS, {
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "example.invalid/x"}]},
        "status": {"phase": "Running"},
    })


def drop_our_check(cluster: FakeCluster, wl: str) -> None:
    def mutate(obj: dict[str, Any]) -> None:
        obj["status"]["admissionChecks"] = [c for c in obj["status"]["admissionChecks"] if c["name"] != "dispatch"]
    cluster.server.update(KUEUE, "workloads", NS, wl, mutate, status=True)


def result(world: World) -> dict[str, tuple[Any, ...]]:
    """What deciding left behind: each check's state, message (pod suffixes folded), pod-set labels, and A."""
    assert world.cluster.server.denied == []  # the reconciler holds exactly the shipped controller role
    out: dict[str, tuple[Any, ...]] = {}
    for wl in world.workloads:
        obj = world.kueue.workload(wl)
        entry: dict[str, Any] = next((c for c in obj["status"]["admissionChecks"] if c["name"] == "dispatch"), {})
        owner = obj["metadata"]["ownerReferences"][0]["name"]
        tj = world.cluster.server.get("trainer.kubeflow.org", "trainjobs", NS, owner)
        a = (tj or {}).get("metadata", {}).get("annotations", {}).get(ANNOTATION_ADMISSION)
        out[wl] = (entry.get("state"), re.sub(r"-[0-9a-z]{5}\b", "-*", str(entry.get("message", ""))),
                   entry.get("podSetUpdates"), a)
    return out


def outcomes(values: dict[str, Outcome | Exception]) -> dict[str, str]:
    return {name: v.outcome if isinstance(v, Outcome) else repr(v) for name, v in values.items()}


async def decide_one_by_one(world: World) -> dict[str, str]:
    return {wl: (await world.reconciler.reconcile(NS, wl)).outcome for wl in world.workloads}


def cache_of(world: World) -> dict[str, WorkloadHint]:
    """The Workloads as a controller's informer would hold them: hints for the batch's reads."""
    return {wl["metadata"]["name"]: WorkloadHint.from_obj(wl)
            for wl in world.cluster.server.objects(KUEUE, "workloads")}


async def decide_in_batches(world: World, size: int, known: int, hinted: bool = True) -> dict[str, str]:
    got: dict[str, str] = {}
    hints = cache_of(world) if hinted else None     # taken once: stale for every batch after the first
    for start in range(0, len(world.workloads), size):
        chunk = world.workloads[start:start + size]
        got.update(outcomes(await world.reconciler.reconcile_many(NS, chunk, known=known, hints=hints)))
    return got


async def both(kinds: Sequence[str], size: int, known: int, hinted: bool = True
               ) -> tuple[World, World, dict[str, str], dict[str, str]]:
    single, batched = await build(kinds), await build(kinds)
    one = await decide_one_by_one(single)
    many = await decide_in_batches(batched, size, known, hinted)
    return single, batched, one, many


async def test_a_batch_decides_every_kind_of_workload_as_one_by_one_does() -> None:
    kinds = list(KINDS) * 2
    # JobSets listed or got; reads narrowed by hints or every Workload and TrainJob got
    for known, hinted in ((0, True), (10_000, True), (0, False)):
        single, batched, one, many = await both(kinds, size=len(kinds), known=known, hinted=hinted)
        assert many == one
        assert result(batched) == result(single)
        assert sorted(set(one.values())) == sorted(
            {"admitted", "waiting", "foreign-ready", "no-quota", "not-ours", "not-pending"})
        by_kind: dict[str, tuple[Any, ...]] = {}
        for kind, wl in zip(kinds, batched.workloads, strict=True):
            by_kind.setdefault(kind, result(batched)[wl])   # the first of each kind
        assert by_kind["reopened"][3] == "4"      # above the ledger's 3
        assert by_kind["blocked"][0] == "Pending" and "on node-0" in by_kind["blocked"][1]
        for kind in ("by-jobset-name", "by-dispatch-labels"):
            assert by_kind[kind][:2] == ("Pending", "waiting for pods of the previous execution to go: "
                                                    f"stray-{kinds.index(kind)} on node-1"), kind
        assert "on node-2" in by_kind["lost"][1]
        assert by_kind["free"][3] == "1" and by_kind["unlabelled"][3] == "1"
        for world in (single, batched):
            await world.kube.aclose()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=10), size=st.integers(1, 6),
       known=st.sampled_from([0, 1_000]), hinted=st.booleans())
def test_any_mix_and_any_batch_size_decide_as_one_by_one(kinds: list[str], size: int, known: int,
                                                         hinted: bool) -> None:
    async def run() -> None:
        single, batched, one, many = await both(kinds, size, known, hinted)
        assert many == one
        assert result(batched) == result(single)
        for world in (single, batched):
            await world.kube.aclose()
    asyncio.run(run())


async def test_a_batch_of_waiting_workloads_reads_a_constant_number_of_times() -> None:
    world = await build(["blocked"] * 12)
    before = len(world.cluster.server.requests)
    got = outcomes(await world.reconciler.reconcile_many(NS, world.workloads, known=len(world.workloads),
                                                         hints=cache_of(world)))
    assert set(got.values()) == {"waiting"}
    reads = [(m, p, q) for m, p, q in world.cluster.server.requests[before:] if m == "GET" and "/events" not in p]
    # Workloads, TrainJobs, JobSets, Jobs (by jobset-name, and by the submissions: a closed object's lagging
    # Jobs, issue 25 item 2), two pod lists, one Node: not one read per Workload.
    assert [p.rsplit("/", 1)[-1] for _, p, _ in reads] == [
        "workloads", "trainjobs", "jobsets", "jobs", "jobs", "pods", "pods", "node-0"], reads
    assert "kueue.x-k8s.io/job-uid in (" in reads[0][2]["labelSelector"]
    assert "dispatch.phpboyscout.uk/job-id in (batch)" in reads[1][2]["labelSelector"]
    await world.kube.aclose()


async def test_a_batch_of_admissions_writes_one_record_each_and_no_shared_object() -> None:
    world = await build(["free"] * 8)
    before = len(world.cluster.server.requests)
    got = outcomes(await world.reconciler.reconcile_many(NS, world.workloads, known=8))
    assert set(got.values()) == {"admitted"}
    writes = [p for m, p, _ in world.cluster.server.requests[before:] if m in ("POST", "PATCH", "PUT")]
    assert sum("/configmaps" in p for p in writes) == 0
    records = [p for p in writes if "/submissionrecords/" in p]
    assert len(records) == 8 and len(set(records)) == 8   # one per submission: no hot object
    assert sum("/trainjobs/" in p for p in writes) == 8
    assert sum(p.endswith("/status") and "/workloads/" in p for p in writes) == 8
    stored = world.cluster.server.objects(n.DOMAIN, "submissionrecords", NS)
    assert sorted(r["spec"]["admission"] for r in stored) == [1] * 8
    await world.kube.aclose()


async def test_a_batch_that_gets_its_jobsets_reads_each_once_and_gets_only_those_its_list_missed() -> None:
    """A batch too small a part of the namespace to list every JobSet lists those carrying its submissions'
    identity labels (dispatch objects' JobSets: all of these) and gets by name only the rest; one JobSet here has
    lost its labels, so it is the one got. Decided as one by one decides them."""
    kinds = ["blocked"] * 5 + ["free"]
    single, batched = await build(kinds), await build(kinds)
    for world in (single, batched):
        world.cluster.settle()
        unlabelled = world.cluster.server.objects("jobset.x-k8s.io", "jobsets", NS)[1]["metadata"]["name"]

        def strip(obj: dict[str, Any]) -> None:
            for key in (LABEL_JOB_ID, LABEL_SUBMISSION):
                obj["metadata"]["labels"].pop(key, None)
        world.cluster.server.update("jobset.x-k8s.io", "jobsets", NS, unlabelled, strip, status=False)
    one = await decide_one_by_one(single)
    before = len(batched.cluster.server.requests)
    many = outcomes(await batched.reconciler.reconcile_many(NS, batched.workloads, known=10_000,
                                                            hints=cache_of(batched)))
    assert many == one and result(batched) == result(single)
    got = [p.rsplit("/", 1)[-1] for m, p, _ in batched.cluster.server.requests[before:]
           if m == "GET" and "/jobsets" in p]
    assert got == ["jobsets", unlabelled], got
    for world in (single, batched):
        await world.kube.aclose()


async def test_a_conflict_on_one_workload_fails_only_that_one() -> None:
    world = await build(["free"] * 4)
    victim = world.workloads[2]
    world.cluster.server.inject(method="PATCH", path=rf"/workloads/{victim}/status$", status=409, times=10)
    got = outcomes(await world.reconciler.reconcile_many(NS, world.workloads, known=4))
    assert got.pop(victim) == "conflict"
    assert set(got.values()) == {"admitted"}
    assert world.kueue.entry(victim)["state"] == "Pending"
    await world.kube.aclose()


async def test_a_pending_write_that_met_a_409_is_written_again_on_the_fresh_workload_once() -> None:
    """Kueue writing the Workload's own fields at the moment our Pending message is written: the Workload is read
    again and, our entry being as read, the message written on the fresh version; no second decision."""
    world = await build(["blocked"])
    wl = world.workloads[0]
    world.cluster.server.inject(method="PATCH", path=rf"/workloads/{wl}/status$", status=409, times=1)
    before = len(world.cluster.server.requests)
    got = await world.reconciler.reconcile(NS, wl)
    assert got.outcome == "waiting"
    assert world.kueue.entry(wl)["message"].startswith("waiting for pods")
    sent = [(m, p.rsplit("/", 2)[-2:]) for m, p, _ in world.cluster.server.requests[before:] if "/workloads/" in p]
    assert sent == [("GET", ["workloads", wl]),     # the decision's read
                    ("PATCH", [wl, "status"]), ("GET", ["workloads", wl]), ("PATCH", [wl, "status"])], sent
    await world.kube.aclose()


async def test_a_pending_write_over_a_changed_entry_is_not_written_again() -> None:
    """Our entry changed meanwhile (another writer): the 409 goes to the caller, to decide afresh."""
    world = await build(["blocked"])
    wl = world.workloads[0]
    world.cluster.server.before_request = lambda method, path: (
        world.kueue.set_check(wl, "dispatch", "Pending", "someone else") if method == "PATCH" else None)
    got = (await world.reconciler.reconcile_many(NS, [wl]))[wl]
    world.cluster.server.before_request = None
    assert isinstance(got, Conflict), got
    assert world.kueue.entry(wl)["message"] == "someone else"
    await world.kube.aclose()


async def test_a_failed_shared_read_fails_every_workload_of_the_batch_and_writes_nothing() -> None:
    world = await build(["free"] * 3)
    world.cluster.server.inject(method="GET", path=r"/pods$", status=403, times=1)
    before = len(world.cluster.server.requests)
    got = await world.reconciler.reconcile_many(NS, world.workloads, known=3)
    assert all(isinstance(v, Exception) for v in got.values()), got
    assert [m for m, _, _ in world.cluster.server.requests[before:] if m != "GET"] == []
    await world.kube.aclose()


@pytest.mark.parametrize("size", [1, 3])
async def test_the_queue_hands_out_a_batch_of_one_namespace_in_order(size: int) -> None:
    from dispatch.controller._queue import WorkQueue

    q = WorkQueue()
    for key in ("a/1", "b/1", "a/2", "a/3", "b/2", "a/4"):
        q.add(key)
    first = await q.get_batch(size)
    assert first == ["a/1", "a/2", "a/3"][:size]
    q.add("a/2")                                  # being processed: runs once more afterwards
    rest: Callable[[], int] = lambda: len(q)      # noqa: E731
    for key in first:
        q.done(key)
    assert rest() == 6 - size + (1 if size > 1 else 0)


class InFlight(httpx2.AsyncBaseTransport):
    """A transport that holds every request a moment and notes which requests were in flight together,
    so a test can tell reads sent at once from reads sent one after another."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner
        self.flying: set[str] = set()
        self.together: list[frozenset[str]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        key = f"{request.method} {request.url.path.rsplit('/', 2)[-2]}"
        self.flying.add(key)
        self.together.append(frozenset(self.flying))
        try:
            await asyncio.sleep(0.002)
            return await self.inner.handle_async_request(request)
        finally:
            self.flying.discard(key)

    def overlapped(self, a: str, b: str) -> bool:
        return any(a in group and b in group for group in self.together)


async def lone(kind: str, hint: Callable[[World], dict[str, WorkloadHint]]) -> tuple[World, InFlight, str]:
    """One Workload of ``kind`` decided alone through a transport that sees what overlapped."""
    world = await build([kind])
    spy = InFlight(world.cluster.transport("dispatch-controller"))
    kube = k.Kube.connect(namespace=NS, transport=spy)
    got = await reconciler_for(kube).reconcile_many(NS, world.workloads, hints=hint(world))
    await kube.aclose()
    return world, spy, outcomes(got)[world.workloads[0]]


async def test_a_lone_workload_is_read_with_its_trainjob_and_its_record_with_the_lower_layers() -> None:
    """Latency: the Workload and the TrainJob its cached copy names are one round trip, and the identity
    record is read while JobSet, Jobs and pods are, not after them."""
    world, spy, outcome = await lone("free", cache_of)
    assert outcome == "admitted"
    assert result(world)[world.workloads[0]][:1] == ("Ready",)
    assert spy.overlapped("GET workloads", "GET trainjobs")
    assert spy.overlapped("GET submissionrecords", "GET jobsets") or spy.overlapped("GET submissionrecords",
                                                                                      "GET namespaces")
    # without a cache the TrainJob's name is learnt from the Workload: read after it
    world, spy, outcome = await lone("free", lambda _w: {})
    assert outcome == "admitted"
    assert not spy.overlapped("GET workloads", "GET trainjobs")
    await world.kube.aclose()


async def test_a_hint_naming_the_wrong_owner_costs_a_read_and_decides_as_before() -> None:
    """A cached copy that names another TrainJob (renamed owner, stale cache) is never decided from: the
    fresh Workload's owner is read, and the outcome is the one a cold read gives."""
    def wrong(world: World) -> dict[str, WorkloadHint]:
        return {name: dataclasses.replace(h, trainjob="someone-else") for name, h in cache_of(world).items()}
    for kind, want in (("free", "admitted"), ("blocked", "waiting")):
        world, _spy, outcome = await lone(kind, wrong)
        assert outcome == want
        cold = await build([kind])
        assert outcomes(await cold.reconciler.reconcile_many(NS, cold.workloads)) == {cold.workloads[0]: want}
        assert result(world) == result(cold)
        for w in (world, cold):
            await w.kube.aclose()
