"""A lone decision reads the lower layers at once with its TrainJob, and uses that read only when it is sound.

The rule reads a TrainJob before the layers below it. The controller may send those reads beside the TrainJob's
when a watch has shown the TrainJob at a version ``v`` before they are sent; the read is used only if the
TrainJob, read at the same time, is still at ``v`` (``_read.EarlyRead``). The schedule that would break it: the
TrainJob changes and a pod of the submission appears after the early pod lists were answered and before the
TrainJob is read. Here the early read must be dropped, and the layers read again after the TrainJob.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import httpx2

from dispatch import LABEL_JOB_ID, LABEL_SUBMISSION
from dispatch import _kube as k
from dispatch.controller._events import EventRecorder
from dispatch.controller._metrics import Metrics
from dispatch.controller._reconcile import Reconciler
from dispatch.controller._versions import TrainJobVersions

from .test_batch import NS, build, cache_of, outcomes, result, stray_pod

TRAINER = "trainer.kubeflow.org"


def seen_now(world: Any) -> TrainJobVersions:
    """The versions a watch would hold right now of every TrainJob of the world."""
    versions = TrainJobVersions()
    versions.begin()
    versions.page(world.cluster.server.objects(TRAINER, "trainjobs", NS))
    versions.end()
    return versions


def reconciler(kube: k.Kube, versions: TrainJobVersions) -> tuple[Reconciler, Metrics]:
    metrics = Metrics.create()
    return Reconciler(kube, check_names=lambda: {"dispatch"}, events=EventRecorder(kube, metrics, instance="t"),
                      metrics=metrics, seen_trainjob=versions.seen), metrics


def early(metrics: Metrics, outcome: str) -> float:
    return float(metrics.early_reads.labels(outcome)._value.get())


class HoldTrainJobReads(httpx2.AsyncBaseTransport):
    """Holds every TrainJob read until the early read's two pod lists were answered, then runs ``between``
    (what a third party does in that gap) and lets the TrainJob reads go."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, between: Any) -> None:
        self.inner, self.between = inner, between
        self.pod_lists = 0
        self.gate = asyncio.Event()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        path = request.url.path
        if request.method == "GET" and "/trainjobs" in path and not self.gate.is_set():
            await self.gate.wait()
        reply = await self.inner.handle_async_request(request)
        if request.method == "GET" and path.endswith("/pods") and not self.gate.is_set():
            self.pod_lists += 1
            if self.pod_lists == 2:
                self.between()
                self.gate.set()
        return reply


async def test_a_trainjob_still_at_the_version_seen_uses_the_early_read_and_reads_the_layers_once() -> None:
    world = await build(["free"])
    versions = seen_now(world)
    rec, metrics = reconciler(world.kube, versions)
    before = len(world.cluster.server.requests)
    got = outcomes(await rec.reconcile_many(NS, world.workloads, hints=cache_of(world)))
    assert got == {world.workloads[0]: "admitted"}
    assert (early(metrics, "used"), early(metrics, "stale")) == (1.0, 0.0)
    gets = [p for m, p, _ in world.cluster.server.requests[before:] if m == "GET"]
    assert sum(p.endswith("/pods") for p in gets) == 2, gets       # one consistent read: both selections once
    assert result(world)[world.workloads[0]][3] == "1"
    await world.kube.aclose()


async def test_a_trainjob_changed_after_the_version_seen_drops_the_early_read_and_sees_the_pod_made_meanwhile(
) -> None:
    world = await build(["free"])
    versions = seen_now(world)
    obj = "batch-s0"

    def third_party() -> None:
        # After the early pod lists were answered, before the TrainJob is read: the TrainJob is edited (a new
        # version) and a pod of the same submission starts (say, under an earlier TrainJob of another name).
        def edit(tj: dict[str, Any]) -> None:
            tj["metadata"].setdefault("annotations", {})["example.com/edited"] = "1"
        world.cluster.server.update(TRAINER, "trainjobs", NS, obj, edit, status=False)
        stray_pod(world.cluster, "meanwhile", "node-1", {LABEL_JOB_ID: "batch", LABEL_SUBMISSION: "s0"})

    hold = HoldTrainJobReads(world.cluster.transport("dispatch-controller"), third_party)
    kube = k.Kube.connect(namespace=NS, transport=hold)
    rec, metrics = reconciler(kube, versions)
    got = outcomes(await rec.reconcile_many(NS, world.workloads, hints=cache_of(world)))
    assert hold.gate.is_set()                                        # the schedule happened as written
    assert got == {world.workloads[0]: "waiting"}, got
    assert (early(metrics, "used"), early(metrics, "stale")) == (0.0, 1.0)
    state, message, _, a = result(world)[world.workloads[0]]
    assert state == "Pending" and "meanwhile on node-1" in message and a == "0"      # A not raised
    await kube.aclose()
    await world.kube.aclose()


class BeforeTheRaise(httpx2.AsyncBaseTransport):
    """Runs ``between`` once, just before the TrainJob raise is sent: after the early read was used."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, between: Any) -> None:
        self.inner, self.between = inner, between
        self.ran = False

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "PATCH" and "/trainjobs/" in request.url.path and not self.ran:
            self.ran = True
            self.between()
        return await self.inner.handle_async_request(request)


async def test_an_early_read_used_still_answers_to_the_raise_conditioned_on_the_version_seen() -> None:
    """The other half of the argument: the early read is used (the TrainJob read with it is still at ``v``), then
    the TrainJob changes and a pod of the submission starts before the raise. The raise, conditioned on ``v``,
    is refused; nothing is admitted, and the next decision sees the pod."""
    world = await build(["free"])
    versions = seen_now(world)
    obj = "batch-s0"

    def third_party() -> None:
        def edit(tj: dict[str, Any]) -> None:
            tj["metadata"].setdefault("annotations", {})["example.com/edited"] = "1"
        world.cluster.server.update(TRAINER, "trainjobs", NS, obj, edit, status=False)
        stray_pod(world.cluster, "meanwhile", "node-1", {LABEL_JOB_ID: "batch", LABEL_SUBMISSION: "s0"})

    hold = BeforeTheRaise(world.cluster.transport("dispatch-controller"), third_party)
    kube = k.Kube.connect(namespace=NS, transport=hold)
    rec, metrics = reconciler(kube, versions)
    got = outcomes(await rec.reconcile_many(NS, world.workloads, hints=cache_of(world)))
    assert hold.ran and got == {world.workloads[0]: "conflict"}, got
    assert early(metrics, "used") == 1.0
    state, _, _, a = result(world)[world.workloads[0]]
    assert (state, a) == ("Pending", "0"), (state, a)                   # A not raised on the TrainJob
    versions = seen_now(world)                                          # the watch shows the edit
    rec, metrics = reconciler(kube, versions)
    got = outcomes(await rec.reconcile_many(NS, world.workloads, hints=cache_of(world)))
    assert got == {world.workloads[0]: "waiting"}, got
    assert early(metrics, "used") == 1.0
    assert "meanwhile on node-1" in result(world)[world.workloads[0]][1]
    await kube.aclose()
    await world.kube.aclose()


async def test_a_trainjob_made_again_under_its_name_is_another_object_and_its_early_read_is_not_used() -> None:
    world = await build(["free"])
    versions = seen_now(world)
    _, version = versions.seen(NS, "batch-s0") or ("", "")
    assert version
    versions.on_event("MODIFIED", {"metadata": {"name": "batch-s0", "namespace": NS, "uid": "another-uid",
                                                "resourceVersion": version}})
    assert versions.seen(NS, "batch-s0") == ("another-uid", version)
    rec, metrics = reconciler(world.kube, versions)
    got = outcomes(await rec.reconcile_many(NS, world.workloads, hints=cache_of(world)))
    assert got == {world.workloads[0]: "admitted"}
    assert (early(metrics, "used"), early(metrics, "stale")) == (0.0, 1.0)
    await world.kube.aclose()


async def test_a_workload_whose_pod_sets_name_another_identity_than_its_trainjob_does_not_use_the_early_read(
) -> None:
    world = await build(["free"])
    hints = {name: dataclasses.replace(h, pod_set_identity=("batch", "s9")) for name, h in cache_of(world).items()}
    rec, metrics = reconciler(world.kube, seen_now(world))
    got = outcomes(await rec.reconcile_many(NS, world.workloads, hints=hints))
    assert got == {world.workloads[0]: "admitted"}
    assert (early(metrics, "used"), early(metrics, "stale")) == (0.0, 1.0)
    await world.kube.aclose()


async def test_an_early_read_that_fails_is_only_not_used() -> None:
    world = await build(["free"])
    rec, metrics = reconciler(world.kube, seen_now(world))
    world.cluster.server.inject(method="GET", path=r"/jobsets/batch-s0$", status=403, times=1)
    got = outcomes(await rec.reconcile_many(NS, world.workloads, hints=cache_of(world)))
    assert got == {world.workloads[0]: "admitted"}
    assert (early(metrics, "used"), early(metrics, "failed")) == (0.0, 1.0)
    await world.kube.aclose()


async def test_a_batch_or_a_trainjob_no_watch_showed_reads_as_before() -> None:
    world = await build(["free", "free"])
    rec, metrics = reconciler(world.kube, seen_now(world))
    assert set(outcomes(await rec.reconcile_many(NS, world.workloads, hints=cache_of(world))).values()) == {
        "admitted"}
    assert sum(early(metrics, o) for o in ("used", "stale", "failed")) == 0.0
    alone = await build(["free"])
    rec, metrics = reconciler(alone.kube, TrainJobVersions())
    assert outcomes(await rec.reconcile_many(NS, alone.workloads, hints=cache_of(alone))) == {
        alone.workloads[0]: "admitted"}
    assert sum(early(metrics, o) for o in ("used", "stale", "failed")) == 0.0
    await world.kube.aclose()
    await alone.kube.aclose()


def test_the_versions_follow_lists_and_events_and_keep_the_newer() -> None:
    v = TrainJobVersions()

    def tj(name: str, rv: str, uid: str = "u1") -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": NS, "uid": uid, "resourceVersion": rv}}

    v.begin()
    v.page([tj("a", "10"), tj("b", "11")])
    assert v.seen(NS, "a") is None                    # a list under way replaces what is known only at its end
    v.end()
    assert v.seen(NS, "a") == ("u1", "10") and len(v) == 2
    assert v.seen("elsewhere", "a") is None
    v.on_event("MODIFIED", tj("a", "12"))
    v.on_event("MODIFIED", tj("a", "9"))              # an older version never replaces a newer one
    assert v.seen(NS, "a") == ("u1", "12")
    v.on_event("ADDED", tj("a", "5", uid="u2"))       # another object under the name: taken as it is
    assert v.seen(NS, "a") == ("u2", "5")
    v.on_event("DELETED", tj("b", "13"))
    assert v.seen(NS, "b") is None
    v.on_event("MODIFIED", {"metadata": {"name": "c", "namespace": NS}})   # no version: nothing kept
    assert v.seen(NS, "c") is None
    v.begin()
    v.page([tj("d", "20")])
    v.end()                                           # a relist: what it did not list is gone
    assert v.seen(NS, "a") is None and v.seen(NS, "d") == ("u1", "20") and len(v) == 1


async def test_a_workload_the_cache_shows_held_or_without_quota_reads_no_lower_layer_early() -> None:
    """Most reconciles of a Workload come while it cannot be decided (held, evicted, without quota): the early
    read is sent only for one the caller's cache shows past screening, so those read the Workload and TrainJob
    alone, as before."""
    world = await build(["free"])
    rec, metrics = reconciler(world.kube, seen_now(world))
    before = len(world.cluster.server.requests)
    got = outcomes(await rec.reconcile_many(NS, world.workloads, hints=cache_of(world), decidable=set()))
    assert got == {world.workloads[0]: "admitted"}
    assert sum(early(metrics, o) for o in ("used", "stale", "failed")) == 0.0
    gets = [p for m, p, _ in world.cluster.server.requests[before:] if m == "GET"]
    assert sum(p.endswith("/pods") for p in gets) == 2, gets
    await world.kube.aclose()


def test_the_routed_view_is_decidable_only_past_screening() -> None:
    from dispatch._kueue import WorkloadView
    from dispatch.controller._routing import RoutedWorkload

    def wl(**status: Any) -> RoutedWorkload:
        obj: dict[str, Any] = {
            "metadata": {"name": "w", "namespace": NS, "uid": "u", "resourceVersion": "1", "ownerReferences": [{
                "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "t", "uid": "tu",
                "controller": True}]},
            "spec": {"active": status.pop("active", True)},
            "status": {"conditions": [{"type": t, "status": "True"} for t in status.pop("conds", ["QuotaReserved"])],
                       "admissionChecks": [{"name": "dispatch", "state": status.pop("state", "Pending")}]}}
        return RoutedWorkload.of(WorkloadView.from_obj(obj))

    names = frozenset({"dispatch"})
    assert wl().decidable(names)
    assert not wl().decidable(frozenset({"other"}))
    assert not wl(active=False).decidable(names)
    assert not wl(conds=[]).decidable(names)
    assert not wl(conds=["QuotaReserved", "Evicted"]).decidable(names)
    assert not wl(conds=["QuotaReserved", "Finished"]).decidable(names)
    assert not wl(state="Ready").decidable(names)
