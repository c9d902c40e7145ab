"""Force-deleted pods, Failed phases nobody's kubelet reported, dispatch's pod finalizer, pod replacement.

Issue 11, items 3 and 8, as named regression tests on the fake cluster. Each one failed on the main
branch before dispatch put its finalizer on every pod: a force delete on a frozen node removed the pod
from the API, ``ceased`` answered True and ``release`` admitted A=2 beside a process still running.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatch import (
    LABEL_ADMISSION,
    POD_FINALIZER,
    Adapter,
    Forbidden,
    JobSpec,
    NotFound,
    PodsRemain,
    Refused,
    State,
)
from dispatch import _kube as k
from dispatch.controller._finalizers import FinalizerKeeper
from dispatch.controller._metrics import Metrics
from dispatch.testing import FakeCluster

ADMIN = ("dispatch-admin", "dispatch-node-reader")

NAME = "llama-s1"


def spec(**extra: Any) -> JobSpec:
    return JobSpec(job_id="llama", submission="s1", node_selector={"kubernetes.io/hostname": "node-0"}, **extra)


def running(adapter: Adapter, cluster: FakeCluster) -> str:
    adapter.open(spec())
    assert adapter.release(NAME).admission == 1
    cluster.settle()
    pods = cluster.pods(NAME)
    assert len(pods) == 1 and pods[0]["status"]["phase"] == "Running"
    return str(pods[0]["metadata"]["name"])


def pod(cluster: FakeCluster, name: str) -> dict[str, Any] | None:
    return cluster.server.get("", "pods", "default", name)


def keeper_pass(cluster: FakeCluster) -> dict[str, str]:
    """One pass of the controller's finalizer keeper over the pods its informers would list."""

    async def go() -> dict[str, str]:
        kube = k.Kube.connect(namespace="default", transport=cluster.transport("dispatch-controller"))
        keeper = FinalizerKeeper(kube, Metrics.create())
        try:
            keeper.list_pods(cluster.server.objects("", "pods"))
            for etype, node in cluster.server.events("", "nodes"):  # as its Node informer saw them
                keeper.on_node(etype, node)
            return {key: await keeper.release(key) for key in sorted(keeper.signatures)}
        finally:
            await kube.aclose()

    return asyncio.run(go())


# ---------------------------------------------------------------- item 3: force delete on a frozen node


@pytest.mark.parametrize("proof", ["out-of-service", "node-deleted"])
def test_a_force_deleted_pod_on_a_frozen_node_is_not_admitted_past_nor_ceased_until_its_node_is_proven_down(
    adapter: Adapter, cluster: FakeCluster, proof: str
) -> None:
    first = running(adapter, cluster)
    cluster.freeze_node("node-0")
    adapter.hold(NAME)
    cluster.settle()
    cluster.force_delete(first)
    cluster.settle()
    left = pod(cluster, first)
    assert left is not None, "dispatch's finalizer must keep a force-deleted pod in the API"
    assert left["metadata"]["deletionTimestamp"] and left["metadata"]["finalizers"] == [POD_FINALIZER]
    assert cluster.running_processes(NAME), "its process goes on: the node is frozen"
    with pytest.raises(PodsRemain, match=rf"{first} on node-0 \(Ready=Unknown\)"):
        adapter.release(NAME)
    cessation = adapter.ceased(NAME)
    assert not cessation.ceased
    assert [(e.name, e.proof, e.finalizer) for e in cessation.ends] == [(first, "unproven", True)]
    status = adapter.inspect(NAME)
    assert status.state is State.HELD
    assert f"pod {first} was deleted for good" in status.cause.detail
    assert f"dispatch admin release-pod {first} --node-confirmed-down" in status.cause.detail
    assert status.remaining[0].held
    assert keeper_pass(cluster) == {f"default/{first}": "unproven"}  # the controller keeps it too
    assert pod(cluster, first) is not None

    if proof == "out-of-service":
        cluster.taint_out_of_service("node-0")
        cessation = adapter.ceased(NAME)
        assert cessation.ceased, cessation.reason
        assert [e.proof for e in cessation.ends] == [proof]
    else:
        # The frozen machine is really gone and its Node deleted. A plain read finds only that the Node is gone,
        # which proves nothing by itself (issue 40); the controller's keeper saw it Ready=Unknown when deleted.
        cluster.remove_machine("node-0")
        cessation = adapter.ceased(NAME)
        assert not cessation.ceased and "node-0 was deleted, which proves nothing by itself" in cessation.reason
    cluster.settle()
    # The writer role may not patch pods (issue 25, item 1): freeing is the controller's, and until it runs
    # release names the way out.
    with pytest.raises(PodsRemain, match=rf"its end is proven \({proof}\); dispatch's controller removes"
                       if proof == "out-of-service" else "dispatch's controller takes the deletion as proof"):
        adapter.release(NAME)
    assert pod(cluster, first) is not None and not cluster.server.denied, "release tried no write on the pod"
    assert keeper_pass(cluster) == {f"default/{first}": proof}
    assert pod(cluster, first) is None, "the controller freed the pod whose end its node proves"
    assert adapter.release(NAME).admission == 2
    cluster.history.check()


def test_before_the_fix_the_same_force_delete_would_have_removed_the_pod(cluster: FakeCluster) -> None:
    """The hazard itself, on a pod without dispatch's finalizer: the API forgets it, its process runs on."""
    cluster.freeze_node("node-0")
    cluster.server.create("", "pods", "default", {
        "metadata": {"name": "bare", "labels": {"jobset.sigs.k8s.io/jobset-name": NAME}},
        "spec": {"nodeName": "node-0", "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "c", "state": {"running": {}}}]},
    })
    cluster.force_delete("bare")
    assert pod(cluster, "bare") is None


def test_a_force_delete_on_a_reachable_node_is_confirmed_by_its_kubelet_and_released(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    first = running(adapter, cluster)
    adapter.hold(NAME)
    cluster.force_delete(first)
    left = pod(cluster, first)
    assert left is not None and left["status"]["phase"] == "Failed"
    assert all("terminated" in c["state"] for c in left["status"]["containerStatuses"])
    assert [e.proof for e in adapter.ceased(NAME).ends] == ["kubelet-confirmed"]
    cluster.settle()
    assert adapter.release(NAME).admission == 2  # a kubelet-confirmed end does not block
    assert pod(cluster, first) is not None  # the writer role may not patch pods: the controller frees it
    assert keeper_pass(cluster) == {f"default/{first}": "kubelet-confirmed"}
    assert pod(cluster, first) is None


# ---------------------------------------------------------------- item 3: a Failed phase written by others


def test_podgc_or_kueue_writing_failed_on_a_pod_of_an_unreachable_node_proves_nothing(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    first = running(adapter, cluster)
    cluster.freeze_node("node-0")
    adapter.hold(NAME)
    cluster.settle()
    cluster.mark_failed(first, reason="KueueForcefulTermination")  # phase only; containers still running
    assert pod(cluster, first)["status"]["phase"] == "Failed"  # type: ignore[index]
    with pytest.raises(PodsRemain, match=first):
        adapter.release(NAME)
    cessation = adapter.ceased(NAME)
    assert not cessation.ceased
    # (issue 35: the fake's kubelet reports the sandbox it runs the container in, and a terminal phase beside a
    # sandbox still reported ready is read as another writer's, whatever condition it came with)
    assert ("marked Failed by PodGC or another writer (its sandbox still reported ready), not its kubelet, and "
            "container node is reported running") in cessation.reason
    assert [e.proof for e in cessation.ends] == ["unproven"]
    assert keeper_pass(cluster) == {f"default/{first}": "unproven"}
    cluster.history.check()


def test_podgc_on_an_out_of_service_node_marks_failed_and_dispatch_releases_it_by_the_taint(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    first = running(adapter, cluster)
    cluster.freeze_node("node-0")
    adapter.hold(NAME)
    cluster.settle()
    cluster.taint_out_of_service("node-0")
    cluster.pod_gc()
    left = pod(cluster, first)
    assert left is not None and left["status"]["phase"] == "Failed"
    assert left["metadata"]["deletionGracePeriodSeconds"] == 0
    assert keeper_pass(cluster) == {f"default/{first}": "out-of-service"}
    assert pod(cluster, first) is None


# ---------------------------------------------------------------- the finalizer's lifecycle


def test_the_finalizer_lifecycle_pod_terminal_then_finalizer_removed_then_pod_gone(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    first = running(adapter, cluster)
    assert POD_FINALIZER in pod(cluster, first)["metadata"]["finalizers"]  # type: ignore[index]
    adapter.hold(NAME)
    cluster.settle()
    cluster.advance(60)
    cluster.settle()  # the kubelet confirms: Failed, containers terminated; the finalizer keeps the object
    left = pod(cluster, first)
    assert left is not None and left["status"]["phase"] == "Failed"
    assert left["metadata"]["finalizers"] == [POD_FINALIZER]
    assert adapter.ceased(NAME).ceased  # kubelet-confirmed: proven, and it does not block
    assert keeper_pass(cluster) == {f"default/{first}": "kubelet-confirmed"}
    assert pod(cluster, first) is None
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    second = cluster.pods(NAME)
    assert len(second) == 1 and POD_FINALIZER in second[0]["metadata"]["finalizers"], "kept by the raise"
    assert second[0]["metadata"]["labels"][LABEL_ADMISSION] == "2"
    cluster.history.check()


def test_a_succeeded_pod_kept_by_its_job_is_released_without_blocking(adapter: Adapter, cluster: FakeCluster) -> None:
    first = running(adapter, cluster)
    cluster.finish_pod(first, "Succeeded")
    cluster.settle()
    assert pod(cluster, first)["status"]["phase"] == "Succeeded"  # type: ignore[index]
    assert [e.proof for e in adapter.ceased(NAME).ends] == ["kubelet-confirmed"]
    assert keeper_pass(cluster) == {f"default/{first}": "kubelet-confirmed"}
    left = pod(cluster, first)
    assert left is not None and POD_FINALIZER not in (left["metadata"].get("finalizers") or [])


def test_close_frees_the_pods_it_can_prove_and_keeps_the_others(adapter: Adapter, cluster: FakeCluster) -> None:
    first = running(adapter, cluster)
    cluster.freeze_node("node-0")
    cluster.force_delete(first)
    remaining = adapter.close(NAME)
    assert [p.name for p in remaining] == [first]
    assert pod(cluster, first) is not None  # unproven: kept
    cluster.remove_machine("node-0")  # the frozen machine is gone, and its Node deleted
    assert keeper_pass(cluster) == {f"default/{first}": "node-deleted"}
    assert pod(cluster, first) is None


def test_the_pod_finalizer_release_is_conditioned_on_the_pod_as_read(adapter: Adapter, cluster: FakeCluster) -> None:
    """A pod that changed between the read and the patch (another finalizer added, say) is not overwritten."""
    first = running(adapter, cluster)
    adapter.hold(NAME)
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    from dispatch._core import remove_finalizer
    from dispatch._views import PodView

    stale = PodView.from_obj(pod(cluster, first))  # type: ignore[arg-type]

    def add(obj: dict[str, Any]) -> None:
        obj["metadata"]["finalizers"].append("example.com/audit")
    cluster.server.update("", "pods", "default", first, add)

    async def go() -> bool:
        kube = k.Kube.connect(namespace="default", transport=cluster.transport())
        try:
            return await remove_finalizer(kube, stale)
        finally:
            await kube.aclose()

    assert asyncio.run(go()) is False
    assert pod(cluster, first)["metadata"]["finalizers"] == [POD_FINALIZER, "example.com/audit"]  # type: ignore[index]
    assert keeper_pass(cluster) == {f"default/{first}": "kubelet-confirmed"}
    assert pod(cluster, first)["metadata"]["finalizers"] == ["example.com/audit"]  # type: ignore[index]


# ---------------------------------------------------------------- the operator's release


def test_release_pod_needs_proof_or_the_operators_word_and_never_a_ready_node(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    first = running(adapter, cluster)
    with pytest.raises(Refused, match="Ready=True"):
        adapter.release_pod(first, node_confirmed_down=True)  # a live kubelet will confirm it itself
    cluster.freeze_node("node-0")
    adapter.hold(NAME)
    cluster.settle()
    cluster.force_delete(first)
    with pytest.raises(Refused, match="end is unproven") as err:
        adapter.release_pod(first)
    assert err.value.reason == "Unproven"
    assert pod(cluster, first) is not None
    # the writer may not (the dispatch-writer role has no patch on pods: issue 25); the admin may
    with pytest.raises(Forbidden, match="cannot patch resource \"pods\""):
        adapter.release_pod(first, node_confirmed_down=True)
    cluster.server.denied.clear()
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin:
        end = admin.release_pod(first, node_confirmed_down=True)
        assert (end.name, end.node, end.proof) == (first, "node-0", "operator-confirmed")
        assert pod(cluster, first) is None
        with pytest.raises(NotFound):
            admin.release_pod(first)


def test_release_pod_refuses_a_pod_without_dispatchs_finalizer(adapter: Adapter, cluster: FakeCluster) -> None:
    cluster.server.create("", "pods", "default", {
        "metadata": {"name": "foreign"}, "spec": {"nodeName": "node-1", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"}})
    with pytest.raises(Refused, match="does not carry dispatch's finalizer"):
        adapter.release_pod("foreign", node_confirmed_down=True)


# ---------------------------------------------------------------- item 8: pod replacement


def test_the_default_replacement_policy_starts_a_second_process_of_one_rank_and_dispatch_warns(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    status = adapter.open(JobSpec(job_id="llama", submission="s1"))
    assert any("podReplacementPolicy: Failed" in w for w in status.warnings), status.warnings
    adapter.release(NAME)
    cluster.settle()
    first = cluster.pods(NAME)[0]
    node = first["spec"]["nodeName"]
    cluster.freeze_node(node)
    cluster.force_delete(first["metadata"]["name"])
    cluster.settle()
    rank0 = [p for p in cluster.running_processes(NAME)]
    assert len(rank0) == 2 and {p.admission for p in rank0} == {1}, "TerminatingOrFailed: replaced at once"
    assert any("TerminatingOrFailed" in w for w in adapter.inspect(NAME).warnings)


def test_with_replacement_policy_failed_a_deleting_pod_is_not_replaced_until_it_has_failed() -> None:
    cluster = FakeCluster()
    cluster.add_runtime(replacement_policy="Failed")
    for node in ("node-0", "node-1"):
        cluster.add_node(node)
    with Adapter.connect("default", transport=cluster.transport()) as adapter:
        assert adapter.open(JobSpec(job_id="llama", submission="s1")).warnings == ()
        adapter.release(NAME)
        cluster.settle()
        first = cluster.pods(NAME)[0]
        node = first["spec"]["nodeName"]
        cluster.freeze_node(node)
        cluster.force_delete(first["metadata"]["name"])
        cluster.settle()
        assert len(cluster.running_processes(NAME)) == 1
        assert [p["metadata"]["name"] for p in cluster.pods(NAME)] == [first["metadata"]["name"]]
        assert adapter.inspect(NAME).warnings == ()
        cluster.taint_out_of_service(node)  # the operator confirms the node is down; PodGC marks it Failed
        cluster.settle()
        assert len(cluster.running_processes(NAME)) == 1  # the replacement, on the other node
        assert {p.node for p in cluster.running_processes(NAME)} != {node}
        cluster.history.check()


# ---------------------------------------------------------------- issue 38 item 6: a controller that is not running


def test_status_names_ended_pods_that_wait_for_a_controller_that_is_not_running(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    """Plain mode without a controller: the kubelet confirmed the pod's end, but dispatch's finalizer stays, so
    the pod (and its namespace's deletion) waits. Status says so once a minute has passed on the API server's
    clock since its deletion, and not before, nor once the keeper (the controller) has freed it."""
    first = running(adapter, cluster)
    adapter.hold(NAME)
    cluster.settle()
    cluster.advance(31)
    cluster.settle()  # the kubelet confirms: Failed; the finalizer keeps the object
    assert pod(cluster, first)["metadata"]["finalizers"] == [POD_FINALIZER]  # type: ignore[index]
    assert not any("finalizer" in w for w in adapter.inspect(NAME).warnings), "too early to say"
    cluster.advance(61)
    [said] = [w for w in adapter.inspect(NAME).warnings if "finalizer" in w]
    assert said.startswith(f"pods whose end is proven still carry dispatch's finalizer {POD_FINALIZER}: "
                           f"{first} (kubelet-confirmed, deleted ")
    assert "dispatch's controller removes it by itself" in said and "The controller is down" in said
    assert f"`dispatch admin release-pod {first}`" in said
    assert keeper_pass(cluster) == {f"default/{first}": "kubelet-confirmed"}
    assert not any("finalizer" in w for w in adapter.inspect(NAME).warnings)
