"""The controller's finalizer keeper on the fake cluster: both modes, event-driven, never on unproven ends."""

from __future__ import annotations

from typing import Any

from dispatch import POD_FINALIZER, AsyncAdapter, JobSpec
from dispatch import _kube as k
from dispatch.controller._finalizers import FinalizerKeeper
from dispatch.controller._metrics import Metrics
from dispatch.testing import FakeCluster

from .conftest import quiet, running, until

PLAIN = JobSpec(job_id="plain", submission="s1", node_selector={"kubernetes.io/hostname": "node-0"})


def pod_of(cluster: FakeCluster, name: str) -> dict[str, object] | None:
    return cluster.server.get("", "pods", "default", name)


async def test_the_controller_releases_a_plain_mode_pod_once_its_kubelet_confirms_its_end(
    adapter: AsyncAdapter, cluster: FakeCluster, kube: k.Kube
) -> None:
    await adapter.open(PLAIN)
    await adapter.release("plain-s1")
    cluster.settle()
    first = cluster.pods("plain-s1")[0]["metadata"]["name"]
    async with running(kube) as ctl:
        await adapter.hold("plain-s1")
        cluster.settle()
        cluster.advance(60)
        cluster.settle()  # the kubelet confirms; only the controller removes dispatch's finalizer now
        await until(lambda: pod_of(cluster, first) is None, what="the pod released and gone")
        assert ctl.finalizers.released == 1
        assert ctl.metrics.writes.labels("pod-finalizer")._value.get() == 1


async def test_the_controller_keeps_a_force_deleted_pod_of_a_frozen_node_until_the_taint(
    adapter: AsyncAdapter, cluster: FakeCluster, kube: k.Kube
) -> None:
    await adapter.open(PLAIN)
    await adapter.release("plain-s1")
    cluster.settle()
    first = cluster.pods("plain-s1")[0]["metadata"]["name"]
    async with running(kube) as ctl:
        cluster.freeze_node("node-0")
        cluster.force_delete(first)
        cluster.pod_gc()
        await until(lambda: f"default/{first}" in ctl.finalizers.signatures, what="the keeper sees the pod")
        await until(lambda: len(ctl.finalizers.queue) == 0, what="the keeper took the pod")
        await quiet(0.5)  # and looked at it: the end is unproven, so nothing is written
        assert pod_of(cluster, first) is not None
        assert ctl.finalizers.released == 0
        held = ctl.metrics.registry.get_sample_value
        assert held("dispatch_pods_held_unproven") == 1 and list(ctl.finalizers.held) == [f"default/{first}"]
        assert (held("dispatch_pods_held_unproven_longest_seconds") or 0) >= 0
        cluster.taint_out_of_service("node-0")  # the Node's change routes the pods on it
        await until(lambda: pod_of(cluster, first) is None, what="released by the taint")
        await until(lambda: held("dispatch_pods_held_unproven") == 0, what="no pod held any more")
        assert held("dispatch_pods_held_unproven_longest_seconds") == 0
    cluster.history.check()


async def test_the_keeper_keeps_one_table_entry_per_pod() -> None:
    """A pod's node is the first field of its signature: no second table files each pod (issue 37: ~9 MiB at
    100,000 pods); the keeper counts its pods per Node, and finds a Node's pods from the signatures."""
    cluster = FakeCluster()
    kube = k.Kube.connect(namespace="default", transport=cluster.transport())
    keeper = FinalizerKeeper(kube, Metrics.create())
    spec: dict[str, Any] = {"nodeName": "n", "containers": [{"name": "c"}]}
    pod = {"metadata": {"name": "p", "namespace": "default", "finalizers": [POD_FINALIZER], "resourceVersion": "1"},
           "spec": spec,
           "status": {"phase": "Running", "containerStatuses": [{"name": "c", "state": {"running": {}}}]}}
    keeper.on_pod("ADDED", pod)
    per_pod = [name for name, value in vars(keeper).items() if isinstance(value, dict) and "default/p" in value]
    assert per_pod == ["signatures"] and keeper.on_node_of == {"n": {"default/p"}}
    assert keeper.pods_per_node == {"n": 1} and keeper.pods_on("n") == ["default/p"]
    keeper.on_pod("ADDED", {**pod, "metadata": {**pod["metadata"], "name": "q"}})
    keeper.on_pod("MODIFIED", {**pod, "spec": {**spec, "nodeName": "m"}})
    assert keeper.on_node_of == {"m": {"default/p"}, "n": {"default/q"}} and keeper.pods_per_node == {"n": 1, "m": 1}
    assert keeper.pods_on("m") == ["default/p"] and keeper.pods_on("gone") == []
    keeper.on_pod("DELETED", pod)
    keeper.on_pod("DELETED", {**pod, "metadata": {**pod["metadata"], "name": "q"}})
    assert keeper.on_node_of == {} and keeper.signatures == {} and keeper.pods_per_node == {}
    await kube.aclose()


async def test_routing_queues_pods_of_a_node_that_becomes_proven_down() -> None:
    cluster = FakeCluster()
    kube = k.Kube.connect(namespace="default", transport=cluster.transport())
    keeper = FinalizerKeeper(kube, Metrics.create())
    pod = {"metadata": {"name": "p", "namespace": "default", "finalizers": [POD_FINALIZER], "resourceVersion": "1"},
           "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
           "status": {"phase": "Running", "containerStatuses": [{"name": "c", "state": {"running": {}}}]}}
    keeper.on_pod("ADDED", pod)
    assert len(keeper.queue) == 0  # running, not deleting: nothing to look at
    keeper.on_node("MODIFIED", {"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready",
                                                                                      "status": "Unknown"}]}})
    assert len(keeper.queue) == 0  # Ready=Unknown proves nothing
    keeper.on_node("MODIFIED", {"metadata": {"name": "n"}, "spec": {"taints": [
        {"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}]}})
    assert len(keeper.queue) == 1
    keeper.on_pod("DELETED", pod)
    assert keeper.on_node_of == {} and keeper.signatures == {}
    foreign = {"metadata": {"name": "q", "namespace": "default"}, "spec": {"nodeName": "n"}, "status": {}}
    keeper.on_pod("ADDED", foreign)
    assert "default/q" not in keeper.signatures  # without dispatch's finalizer: not ours
    await kube.aclose()


async def test_the_controller_keeps_the_pod_of_a_node_deleted_while_its_kubelet_lives(
    adapter: AsyncAdapter, cluster: FakeCluster, kube: k.Kube
) -> None:
    """Issue 40: the Node deleted while Ready=True; its kubelet runs the pod on (the fake's, as the real one did).
    The keeper, which saw it Ready when deleted, frees nothing until the kubelet itself ends the pod."""
    await adapter.open(PLAIN)
    await adapter.release("plain-s1")
    cluster.settle()
    first = cluster.pods("plain-s1")[0]["metadata"]["name"]
    async with running(kube) as ctl:
        await adapter.hold("plain-s1")
        cluster.settle()
        await until(lambda: f"default/{first}" in ctl.finalizers.signatures, what="the keeper sees the pod")
        cluster.delete_node("node-0")
        await until(lambda: "node-0" in ctl.finalizers.deleted_nodes, what="the keeper sees the deletion")
        assert ctl.finalizers.deleted_nodes["node-0"].ready == "True"
        await quiet(0.5)
        assert pod_of(cluster, first) is not None and ctl.finalizers.released == 0
        assert cluster.running_processes("plain-s1"), "its process runs on"
        cluster.advance(31)
        cluster.settle()  # its live kubelet ends the pod after its grace period: its own end is the proof
        await until(lambda: pod_of(cluster, first) is None, what="freed once its kubelet ended it")
    cluster.history.check()


async def test_the_controller_frees_the_pod_of_a_node_deleted_once_it_was_seen_unknown(
    adapter: AsyncAdapter, cluster: FakeCluster, kube: k.Kube
) -> None:
    await adapter.open(PLAIN)
    await adapter.release("plain-s1")
    cluster.settle()
    first = cluster.pods("plain-s1")[0]["metadata"]["name"]
    async with running(kube) as ctl:
        cluster.freeze_node("node-0")
        cluster.force_delete(first)
        await until(lambda: f"default/{first}" in ctl.finalizers.signatures, what="the keeper sees the pod")
        await until(lambda: ctl.finalizers.last_seen.get("node-0") is not None
                    and ctl.finalizers.last_seen["node-0"].ready == "Unknown", what="the keeper sees it Unknown")
        cluster.remove_machine("node-0")  # the machine is gone, and the operator deletes its Node
        await until(lambda: pod_of(cluster, first) is None, what="freed: node-deleted")
        # the keeper forgets the Node when the pod's deletion reaches it (a watch event after the API's delete)
        await until(lambda: ctl.finalizers.deleted_nodes == {}, what="forgotten once no pod of ours sits on it")
    cluster.history.check()


def test_the_keeper_remembers_a_deleted_node_only_while_a_pod_of_ours_sits_on_it() -> None:
    cluster = FakeCluster()
    kube = k.Kube.connect(namespace="default", transport=cluster.transport())
    keeper = FinalizerKeeper(kube, Metrics.create())
    unknown = {"metadata": {"name": "n", "uid": "u1"}, "status": {"conditions": [{"type": "Ready",
                                                                                   "status": "Unknown"}]}}
    keeper.on_node("DELETED", unknown)
    assert keeper.deleted_nodes == {}, "no pod of ours on it: nothing to remember"
    pod = {"metadata": {"name": "p", "namespace": "default", "finalizers": [POD_FINALIZER], "resourceVersion": "1"},
           "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
           "status": {"phase": "Running", "containerStatuses": [{"name": "c", "state": {"running": {}}}]}}
    keeper.on_pod("ADDED", pod)
    keeper.on_node("ADDED", unknown)
    keeper.on_node("DELETED", {"metadata": {"name": "n"}})  # a relist found it missing: its last state is known
    assert keeper.deleted_nodes["n"].ready == "Unknown" and keeper.deleted_nodes["n"].proven_down
    assert len(keeper.queue) == 1, "its pods are looked at"
    keeper.on_node("ADDED", {"metadata": {"name": "n", "uid": "u2"}, "status": {"conditions": [
        {"type": "Ready", "status": "True"}]}})
    assert keeper.deleted_nodes == {}, "registered again: another object, read afresh"
    keeper.on_node("DELETED", {"metadata": {"name": "n", "uid": "u2"}, "status": {"conditions": [
        {"type": "Ready", "status": "True"}]}})
    assert not keeper.deleted_nodes["n"].proven_down, "deleted while Ready: its kubelet may run on"
    keeper.on_pod("DELETED", pod)
    assert keeper.deleted_nodes == {}


def test_the_keeper_keeps_one_signature_for_the_pods_that_look_alike() -> None:
    """The running pods of one Node look alike to the keeper: one tuple for all of them, not one each (issue 37:
    controller memory at 100,000 pods); a pod that differs has its own."""
    cluster = FakeCluster()
    kube = k.Kube.connect(namespace="default", transport=cluster.transport())
    keeper = FinalizerKeeper(kube, Metrics.create())

    def running(name: str, node: str) -> dict[str, object]:
        return {"metadata": {"name": name, "namespace": "default", "finalizers": [POD_FINALIZER],
                             "resourceVersion": "1"},
                "spec": {"nodeName": node, "containers": [{"name": "c"}]},
                "status": {"phase": "Running", "containerStatuses": [{"name": "c", "state": {"running": {}}}]}}

    keeper.list_pods([running("p0", "n"), running("p1", "n"), running("p2", "other")])
    signatures = keeper.signatures
    assert signatures["default/p0"] is signatures["default/p1"]
    assert signatures["default/p2"] != signatures["default/p0"]
