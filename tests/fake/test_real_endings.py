"""Issue 23: how real kubelets end pods, on the fake cluster (whose kubelet reproduces the recorded real
endings, tests/contract/test_kubelet_endings.py). Each of these failed on main before the rule followed
real kubelets: a rejected pod blocked its object for good on a healthy node; a pod ended during its init
containers blocked for good; a Failed written by Kueue's failure recovery over a crash-looping container
on a partitioned node passed as proof and let a second execution start beside the restarted first; and
an out-of-service taint on a Ready node passed as cessation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatch import Adapter, JobSpec, PodsRemain, Refused
from dispatch import _kube as k
from dispatch.controller._finalizers import FinalizerKeeper
from dispatch.controller._metrics import Metrics
from dispatch.testing import FakeCluster

NAME = "llama-s1"
ADMIN = ("dispatch-admin", "dispatch-node-reader")


def spec(**extra: Any) -> JobSpec:
    return JobSpec(job_id="llama", submission="s1", node_selector={"kubernetes.io/hostname": "node-0"}, **extra)


def only_pod(cluster: FakeCluster) -> dict[str, Any]:
    pods = cluster.pods(NAME)
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def keeper_pass(cluster: FakeCluster) -> dict[str, str]:
    """One pass of the controller's finalizer keeper (with the controller's shipped role)."""

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


def test_a_pod_its_kubelet_rejected_is_deleted_by_the_controller_and_then_no_longer_blocks(
        adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(spec())
    cluster.kubelet_rejects("node-0", "UnexpectedAdmissionError",
                            "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices "
                            "nvidia.com/gpu, which is unexpected")
    assert adapter.release(NAME).admission == 1
    cluster.settle()
    # the Job replaces a failed pod, and the kubelet rejects each one
    rejected = [p for p in cluster.pods(NAME) if p["status"]["phase"] == "Failed"]
    assert rejected and {p["status"]["reason"] for p in rejected} == {"UnexpectedAdmissionError"}
    assert cluster.running_processes() == []
    cluster.kubelet_admits("node-0")
    adapter.hold(NAME)
    cluster.settle()
    with pytest.raises(PodsRemain) as err:
        adapter.release(NAME)
    assert "its kubelet rejected it (UnexpectedAdmissionError) and it never ran" in str(err.value)
    assert "dispatch's controller deletes it" in str(err.value)
    cessation = adapter.ceased(NAME)
    assert not cessation.ceased and "its kubelet rejected it" in cessation.reason
    # the controller deletes them; their kubelet confirms; the controller frees them
    keys = [f"default/{p['metadata']['name']}" for p in rejected]
    got = keeper_pass(cluster)
    assert {key: got[key] for key in keys} == dict.fromkeys(keys, "deleted")
    # a replacement deleted before it was scheduled is freed in the same pass (release no longer frees it:
    # the writer role may not patch pods, issue 25)
    assert set(got.values()) - {"deleted"} <= {"not-scheduled"}
    cluster.settle()
    assert keeper_pass(cluster) == dict.fromkeys(keys, "kubelet-confirmed")
    assert adapter.ceased(NAME).ceased
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    assert len(cluster.running_processes()) == 1
    cluster.history.check()


def test_a_rejected_pod_does_not_keep_a_closed_object_s_namespace_from_going(
        adapter: Adapter, cluster: FakeCluster) -> None:
    """Closing deletes the pods; a real kubelet then writes every container's end on each rejected pod
    (recorded ending ``rejected-then-deleted-held``), which frees it."""
    adapter.open(spec())
    cluster.kubelet_rejects("node-0")
    adapter.release(NAME)
    cluster.settle()
    rejected = [p["metadata"]["name"] for p in cluster.pods(NAME)]
    adapter.close(NAME)
    cluster.settle()
    keeper_pass(cluster)
    cluster.settle()
    keeper_pass(cluster)
    cluster.settle()
    assert [name for name in rejected if cluster.server.get("", "pods", "default", name) is not None] == []


def test_a_pod_ended_during_its_init_containers_does_not_block(adapter: Adapter, cluster: FakeCluster) -> None:
    def with_init(obj: dict[str, Any]) -> None:
        for rj in obj["spec"]["template"]["spec"]["replicatedJobs"]:
            rj["template"]["spec"]["template"]["spec"]["initContainers"] = [
                {"name": "flux-installer", "image": "example.invalid/flux"}]
    cluster.server.update("trainer.kubeflow.org", "clustertrainingruntimes", "", "torch-distributed", with_init,
                          status=None)
    cluster.init_containers_hang("node-0")
    adapter.open(spec())
    adapter.release(NAME)
    cluster.settle()
    assert only_pod(cluster)["status"]["phase"] == "Pending"
    adapter.hold(NAME)  # suspended while its init container runs
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    cluster.init_containers_hang("node-0", False)
    left = cluster.pods(NAME)
    assert [p["status"]["containerStatuses"][0]["state"] for p in left] in ([], [{"waiting": {
        "reason": "PodInitializing"}}])
    assert adapter.ceased(NAME).ceased
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    cluster.history.check()


def test_a_failed_phase_kueue_s_failure_recovery_writes_over_a_crash_looping_container_is_no_proof(
        adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(spec())
    adapter.release(NAME)
    cluster.settle()
    first = only_pod(cluster)["metadata"]["name"]
    assert only_pod(cluster)["spec"]["restartPolicy"] == "OnFailure"
    cluster.crash(first, 1)  # reported: terminated, exit 1, phase Running (OnFailure restarts it)
    cluster.partition("node-0")  # before the restart reaches the API
    adapter.hold(NAME)
    cluster.settle()
    cluster.mark_failed(first, reason="KueueForcefullyDeleted")  # Kueue's failure recovery, a minute later
    cluster.server.delete("", "pods", "default", first, grace=0)
    # dispatch's controller sees the mark and records the pod's resourceVersion then (MarkSeen)
    assert keeper_pass(cluster) == {f"default/{first}": "unproven"}
    cluster.settle()  # the partitioned kubelet restarts the container: A=1 runs again
    assert [p.admission for p in cluster.running_processes()] == [1]
    with pytest.raises(PodsRemain) as err:
        adapter.release(NAME)
    assert "marked Failed by Kueue's failure recovery, not its kubelet" in str(err.value)
    assert not adapter.ceased(NAME).ceased
    cluster.history.check()
    # the partition heals: the kubelet sees the terminal phase and stops the container; what it reports
    # (terminated, 137) could still be a crash under OnFailure, so the operator's word ends the wait
    cluster.heal("node-0")
    cluster.settle()
    assert cluster.running_processes() == []
    with pytest.raises(PodsRemain) as err:
        adapter.release(NAME)
    assert f"dispatch admin release-pod {first} --process-gone" in str(err.value)
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin:
        assert admin.release_pod(first, process_gone=True).proof == "operator-confirmed"
    cluster.settle()
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    cluster.history.check()


def test_process_gone_waits_for_the_kubelets_first_report_after_it_is_back(
        adapter: Adapter, cluster: FakeCluster) -> None:
    """A real kubelet v1.37 cut off while Kueue's failure recovery marked its crash-looping pod Failed
    wrote, on coming back, its own Running over the Failed and started the container once more before it
    learned the phase, then stopped it (tests/testbed/test_real_node_endings.py saw the operator's word
    refused on that Running). Taken in the instant between Ready=True and that first sync, the word would
    have let A=2 start beside the restarted A=1: it counts only once the kubelet reported the pod since."""
    adapter.open(spec())
    adapter.release(NAME)
    cluster.settle()
    first = only_pod(cluster)["metadata"]["name"]
    cluster.crash(first, 1)  # reported: terminated, exit 1, phase Running (OnFailure restarts it)
    cluster.partition("node-0")
    adapter.hold(NAME)
    cluster.settle()  # the cut-off kubelet restarts the container; the API does not hear of it
    cluster.crash(first, 1)  # ... and it crashes again: nothing runs when the node comes back
    cluster.advance(90)
    cluster.mark_failed(first, reason="KueueForcefullyDeleted")
    cluster.server.delete("", "pods", "default", first, grace=0)
    assert cluster.running_processes() == []
    cluster.advance(30)
    cluster.heal("node-0")  # Ready=True; its kubelet has not synced its pods yet
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin:
        with pytest.raises(Refused, match=r"its kubelet has not written pod .*'s status since") as err:
            admin.release_pod(first, process_gone=True)
        assert err.value.reason == "KubeletNotReported"
        cluster.settle()  # its first sync: the container runs once more, is stopped, and its end reported
        assert [p.admission for p in cluster.history.processes if p.pod == first].count(1) >= 3
        assert admin.release_pod(first, process_gone=True).proof == "operator-confirmed"
    cluster.settle()
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    cluster.history.check()


def test_process_gone_is_refused_while_the_node_is_unreachable(adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(spec())
    adapter.release(NAME)
    cluster.settle()
    first = only_pod(cluster)["metadata"]["name"]
    cluster.crash(first, 1)
    cluster.partition("node-0")
    cluster.mark_failed(first, reason="KueueForcefullyDeleted")
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin, \
            pytest.raises(Refused, match="its kubelet is not back"):
        admin.release_pod(first, process_gone=True)


def test_an_out_of_service_taint_on_a_node_that_still_reports_ready_proves_nothing(
        adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(spec())
    adapter.release(NAME)
    cluster.settle()
    first = only_pod(cluster)["metadata"]["name"]
    cluster.partition("node-0")  # the kubelet cannot confirm the delete: the pod stays Terminating
    adapter.hold(NAME)
    cluster.settle()
    cluster.heal("node-0")
    cluster.freeze_node("node-0")

    def taint_but_ready(obj: dict[str, Any]) -> None:
        obj.setdefault("spec", {}).setdefault("taints", []).append(
            {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"})
        for c in obj["status"]["conditions"]:
            if c["type"] == "Ready":
                c["status"] = "True"
    cluster.server.update("", "nodes", "", "node-0", taint_but_ready, status=None)
    cessation = adapter.ceased(NAME)
    assert not cessation.ceased
    assert "tainted out-of-service but its kubelet still reports Ready=True" in cessation.reason
    with pytest.raises(PodsRemain):
        adapter.release(NAME)
    assert [p.pod for p in cluster.running_processes()] == [first]
    cluster.history.check()


def test_ceased_is_false_while_a_layer_below_could_still_start_a_pod(adapter: Adapter, cluster: FakeCluster) -> None:
    """Issue 25, item 9: cessation judges the JobSet and its Jobs as the rule does."""
    adapter.open(spec())
    adapter.release(NAME)
    cluster.settle()
    adapter.hold(NAME)
    cluster.trainer_sync()  # the JobSet is suspended; its Job has not acted on it yet
    cluster.jobset_sync()
    cessation = adapter.ceased(NAME)
    assert not cessation.ceased
    assert cessation.reason.startswith("a layer below could still start a pod: job llama-s1-node-0")
    cluster.settle()
    cluster.advance(60)
    cluster.settle()
    assert adapter.ceased(NAME).ceased


def test_podgc_never_marks_a_pod_its_kubelet_ended_so_the_freed_pod_stays_proven(
        adapter: Adapter, cluster: FakeCluster) -> None:
    """The every-writer walks (issue 25) stalled here: a pod its kubelet reported Failed, freed by the keeper,
    then marked Failed by the fake's PodGC, read as "not its kubelet", and ``ceased`` named
    ``admin release-pod`` for a pod with no finalizer left. The real PodGC patches the phase and its
    DisruptionTarget condition only onto a pod not yet Succeeded or Failed; so does the fake now."""
    adapter.open(spec())
    adapter.release(NAME)
    cluster.settle()
    first = only_pod(cluster)["metadata"]["name"]
    cluster.finish_pod(first, "Failed")                     # its kubelet: the process ended
    cluster.settle()
    adapter.hold(NAME)
    cluster.settle()
    cluster.advance(31)                                      # the replacement's grace period ends
    cluster.settle()
    keeper_pass(cluster)
    pod = cluster.server.get("", "pods", "default", first)
    if pod is not None:                                      # still there, freed
        assert not pod["metadata"].get("finalizers"), pod["metadata"]
        cluster.mark_failed(first)                           # PodGC (an orphan pass) reaches it later
        after = cluster.server.get("", "pods", "default", first)
        assert after is not None
        assert after["status"] == pod["status"], after["status"]
    assert adapter.ceased(NAME).ceased
    cluster.history.check()
