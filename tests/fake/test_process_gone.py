"""Issue 35, items 2, 7, 9 and 10 (pods): when a pod someone other than its kubelet marked terminal has ended,
on the fake cluster with the shipped roles and the shipped ``dispatch-pods`` policy.

* ``release-pod --process-gone`` counted the operator's word once the kubelet "reported after the mark",
  comparing the node's clock (container and kubelet-condition times) with the control plane's (the mark's
  ``lastTransitionTime``): a node clock ahead let a report from before the partition count (A=2 beside the
  restarted A=1), a node clock behind refused the word for good. Now dispatch records the pod's
  resourceVersion when it first saw the mark, and a later kubelet write is one the API server ordered after it.
* The fake's kubelet wrote no times when it stopped a pod during its init containers, so the word never passed.
* A running sidecar or ``kubectl debug`` container was ignored wherever a pod's end was judged.
* PodGC's out-of-service path writes Failed with no condition; the fake added one, and dispatch read such a
  pod as ended by its kubelet once the (wrong) taint was gone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatch import Adapter, JobSpec, PodsRemain, Refused
from dispatch import _kube as k
from dispatch._names import ANNOTATION_MARK_SEEN
from dispatch.controller.testing import keeper_pass as controller_pass
from dispatch.errors import DispatchError
from dispatch.testing import FakeCluster


def keeper_pass(cluster: FakeCluster) -> dict[str, str]:
    """One pass of the controller's finalizer keeper, with the shipped controller role (no settle after)."""
    return controller_pass(cluster, settle=False)

NAME = "llama-s1"
ADMIN = ("dispatch-admin", "dispatch-node-reader")


def spec() -> JobSpec:
    return JobSpec(job_id="llama", submission="s1", node_selector={"kubernetes.io/hostname": "node-0"})


def only_pod(cluster: FakeCluster) -> dict[str, Any]:
    pods = cluster.pods(NAME)
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def started(adapter: Adapter, cluster: FakeCluster) -> str:
    """llama-s1 admitted (A=1) and its one pod running on node-0, with the shipped pod policy installed."""
    cluster.install_pod_policy()
    adapter.open(spec())
    assert adapter.release(NAME).admission == 1
    cluster.settle()
    return str(only_pod(cluster)["metadata"]["name"])


def marked_while_cut_off(adapter: Adapter, cluster: FakeCluster, first: str, *, crash_again: bool) -> None:
    """Its container crashes (reported), the node is cut off, the object held; the cut-off kubelet restarts
    the container (unseen by the API) and (``crash_again``) it crashes again. Kueue's failure recovery marks
    the pod Failed and deletes it; dispatch's controller sees the mark and records it."""
    cluster.crash(first, 1)
    cluster.partition("node-0")
    adapter.hold(NAME)
    cluster.settle()
    if crash_again:
        cluster.crash(first, 1)
    cluster.advance(90)
    cluster.mark_failed(first, reason="KueueForcefullyDeleted")
    cluster.server.delete("", "pods", "default", first, grace=0)
    assert keeper_pass(cluster) == {f"default/{first}": "unproven"}
    pod = only_pod(cluster)
    assert ANNOTATION_MARK_SEEN in pod["metadata"]["annotations"]
    cluster.advance(30)


def test_a_node_clock_ahead_no_longer_lets_a_report_from_before_the_partition_count(
        adapter: Adapter, cluster: FakeCluster) -> None:
    cluster.node_clock_offset["node-0"] = 120.0
    first = started(adapter, cluster)
    marked_while_cut_off(adapter, cluster, first, crash_again=False)
    assert [p.admission for p in cluster.running_processes()] == [1]  # restarted while cut off
    cluster.heal("node-0")  # Ready=True; its kubelet has not synced the pod since
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin:
        # the crash's finishedAt (node clock, 120 s ahead) reads later than the mark: it counted before
        with pytest.raises(Refused) as err:
            admin.release_pod(first, process_gone=True)
        assert err.value.reason == "KubeletNotReported", err.value
        cluster.settle()  # its first sync: it learns the phase, stops A=1 and writes the pod's status
        assert cluster.running_processes() == []
        assert admin.release_pod(first, process_gone=True).proof == "operator-confirmed"
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    cluster.history.check()


def test_a_node_clock_behind_no_longer_refuses_the_word_for_good(adapter: Adapter, cluster: FakeCluster) -> None:
    cluster.node_clock_offset["node-0"] = -120.0
    first = started(adapter, cluster)
    marked_while_cut_off(adapter, cluster, first, crash_again=True)
    cluster.heal("node-0")
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin:
        with pytest.raises(Refused) as err:
            admin.release_pod(first, process_gone=True)
        assert err.value.reason == "KubeletNotReported"
        # what the refusal promises must come true: once its kubelet writes the pod's status, the word counts
        assert "run this again once its kubelet has written the pod's status" in str(err.value)
        before = only_pod(cluster)["status"]
        cluster.settle()  # its first sync: one more run of the container (as observed), stopped, reported
        after = only_pod(cluster)["status"]
        assert after["containerStatuses"] != before["containerStatuses"]
        finished = after["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
        mark = next(c for c in after["conditions"] if c["type"] == "KueueFailureRecovery")["lastTransitionTime"]
        assert finished < mark  # by the clocks the kubelet's write is older than the mark: it was refused for good
        assert admin.release_pod(first, process_gone=True).proof == "operator-confirmed"
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    cluster.history.check()


def test_process_gone_passes_for_a_pod_stopped_during_its_init_containers(
        adapter: Adapter, cluster: FakeCluster) -> None:
    """The kubelet back from a cut stops the pod it finds marked Failed during its init container, and writes
    what a real one writes (the init container killed with its times, its sandbox gone): the word counts."""
    def with_init(obj: dict[str, Any]) -> None:
        for rj in obj["spec"]["template"]["spec"]["replicatedJobs"]:
            rj["template"]["spec"]["template"]["spec"]["initContainers"] = [
                {"name": "flux-installer", "image": "example.invalid/flux"}]
    cluster.server.update("trainer.kubeflow.org", "clustertrainingruntimes", "", "torch-distributed", with_init,
                          status=None)
    cluster.init_containers_hang("node-0")
    first = started(adapter, cluster)
    assert only_pod(cluster)["status"]["initContainerStatuses"][0]["state"].keys() == {"running"}
    cluster.partition("node-0")
    adapter.hold(NAME)
    cluster.settle()
    cluster.advance(90)
    cluster.mark_failed(first, reason="KueueForcefullyDeleted")
    cluster.server.delete("", "pods", "default", first, grace=0)
    assert keeper_pass(cluster) == {f"default/{first}": "unproven"}
    cluster.heal("node-0")
    cluster.settle()
    status = only_pod(cluster)["status"]
    init = status["initContainerStatuses"][0]["state"]["terminated"]
    assert (init["exitCode"], init["reason"]) == (137, "Error") and init["startedAt"] and init["finishedAt"]
    assert status["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    with pytest.raises(PodsRemain, match="marked Failed by Kueue's failure recovery"):
        adapter.release(NAME)
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin:
        assert admin.release_pod(first, process_gone=True).proof == "operator-confirmed"
    assert adapter.release(NAME).admission == 2
    cluster.history.check()


def test_without_a_controller_the_first_release_pod_records_the_mark(adapter: Adapter, cluster: FakeCluster) -> None:
    """No controller saw the mark: the operator's first try records it (refused while the node is away), and
    the kubelet's first sync after its return is then a later write."""
    first = started(adapter, cluster)
    cluster.crash(first, 1)
    cluster.partition("node-0")
    adapter.hold(NAME)
    cluster.settle()
    cluster.mark_failed(first, reason="KueueForcefullyDeleted")
    cluster.server.delete("", "pods", "default", first, grace=0)
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin:
        with pytest.raises(Refused) as err:
            admin.release_pod(first, process_gone=True)
        assert err.value.reason == "NodeNotReady"
        assert ANNOTATION_MARK_SEEN in only_pod(cluster)["metadata"]["annotations"]
        cluster.heal("node-0")
        cluster.settle()
        assert admin.release_pod(first, process_gone=True).proof == "operator-confirmed"
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    cluster.history.check()


POD_EDITOR = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: pod-editor
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get", "patch"]
"""
"""What Kubernetes' own ``edit`` role grants on pods: enough to annotate one, not to release dispatch's finalizer."""


def test_only_dispatch_writes_the_mark_record(adapter: Adapter, cluster: FakeCluster) -> None:
    """The shipped ``dispatch-pods`` policy keeps the record to callers that may release dispatch's pod
    finalizer: a record forged by a namespace's pod editor would let the word count before the kubelet wrote."""
    first = started(adapter, cluster)
    cluster.crash(first, 1)
    cluster.partition("node-0")
    cluster.mark_failed(first, reason="KueueForcefullyDeleted")

    async def forge() -> None:
        kube = k.Kube.connect(namespace="default", transport=cluster.transport("pod-editor", rbac=POD_EDITOR))
        try:
            await kube.merge_patch(k.PODS, first, {"metadata": {"annotations": {
                ANNOTATION_MARK_SEEN: "1/" + "0" * 32}}}, "default")
        finally:
            await kube.aclose()
    with pytest.raises(DispatchError, match="written only by dispatch's controller or `dispatch admin release-pod`"):
        asyncio.run(forge())
    assert ANNOTATION_MARK_SEEN not in (only_pod(cluster)["metadata"].get("annotations") or {})
    assert keeper_pass(cluster) == {f"default/{first}": "unproven"}  # the controller may
    assert ANNOTATION_MARK_SEEN in only_pod(cluster)["metadata"]["annotations"]


def test_a_running_debug_container_keeps_a_pod_from_ending(adapter: Adapter, cluster: FakeCluster,
                                                           ) -> None:
    """``kubectl debug`` added an ephemeral container, still reported running when the pod's own container
    ended and its node was cut off: a process of A=1's pod runs on, so nothing may read the pod as ended. Its
    container's exit 0 completes the Job, the JobSet and so the TrainJob (Trainer copies the JobSet's end), so
    the object is Succeeded: closed and opened again, the submission waits for that pod."""
    first = started(adapter, cluster)

    def debug(obj: dict[str, Any]) -> None:
        obj["spec"]["ephemeralContainers"] = [{"name": "debugger", "image": "example.invalid/busybox",
                                               "targetContainerName": "node"}]
    cluster.server.update("", "pods", "default", first, debug, status=None)

    def debugging(obj: dict[str, Any]) -> None:
        obj["status"]["ephemeralContainerStatuses"] = [
            {"name": "debugger", "state": {"running": {"startedAt": cluster.kubelet_time("node-0")}}}]
    cluster.server.update("", "pods", "default", first, debugging, status=True)
    cluster.crash(first, 0)  # its own container completes: its kubelet writes Succeeded
    cluster.partition("node-0")  # ... and is cut off before it stops the debug container
    cluster.settle()
    assert only_pod(cluster)["status"]["phase"] == "Succeeded"
    with pytest.raises(Refused, match="is succeeded"):
        adapter.release(NAME)
    adapter.close(NAME)
    cluster.settle()
    adapter.open(spec())
    with pytest.raises(PodsRemain, match="container debugger is reported running"):
        adapter.release(NAME)
    cessation = adapter.ceased(NAME)
    assert not cessation.ceased and [e.proof for e in cessation.ends] == ["unproven"]
    assert keeper_pass(cluster) == {f"default/{first}": "unproven"}
    cluster.heal("node-0")
    cluster.settle()  # its kubelet stops the debug container with the pod
    assert keeper_pass(cluster) == {f"default/{first}": "kubelet-confirmed"}
    assert adapter.release(NAME).admission == 2
    cluster.history.check()


def test_podgc_s_out_of_service_failed_is_no_kubelet_proof_once_a_wrong_taint_is_gone(
        adapter: Adapter, cluster: FakeCluster) -> None:
    """An operator taints a node that is only cut off (its kubelet goes on) out-of-service, PodGC writes
    Failed with no condition over the pod's crash report and force-deletes it, and the taint is taken off again.
    The Failed is PodGC's, not its kubelet's: under OnFailure the cut-off kubelet restarted the container."""
    first = started(adapter, cluster)
    cluster.crash(first, 1)  # reported: terminated, exit 1; OnFailure restarts it
    cluster.partition("node-0")
    adapter.hold(NAME)
    cluster.settle()  # the cut-off kubelet restarts the container: A=1 runs again
    assert [p.admission for p in cluster.running_processes()] == [1]

    def taint(on: bool) -> None:
        def mutate(obj: dict[str, Any]) -> None:
            spec = obj.setdefault("spec", {})
            taints = [t for t in spec.get("taints") or [] if t["key"] != "node.kubernetes.io/out-of-service"]
            if on:
                taints.append({"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown",
                               "effect": "NoExecute"})
            spec["taints"] = taints
        cluster.server.update("", "nodes", "", "node-0", mutate, status=False)
    taint(True)  # wrong: the machine is not shut down
    cluster.pod_gc()
    pod = only_pod(cluster)
    assert pod["status"]["phase"] == "Failed" and pod["metadata"]["deletionGracePeriodSeconds"] == 0
    # as the real PodGC's out-of-service path (markFailedAndDeletePod) writes it: no condition of its own
    assert {c["type"] for c in pod["status"]["conditions"]} <= {
        "PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled"}
    taint(False)  # the operator takes it back; the node is still cut off (Ready=Unknown)
    with pytest.raises(PodsRemain, match="marked Failed by PodGC or another writer"):
        adapter.release(NAME)
    assert not adapter.ceased(NAME).ceased
    assert keeper_pass(cluster) == {f"default/{first}": "unproven"}  # and the mark is recorded
    cluster.heal("node-0")
    cluster.settle()  # its kubelet learns the phase, stops A=1 and tears the sandbox down: its own end
    assert cluster.running_processes() == []
    assert keeper_pass(cluster) == {f"default/{first}": "kubelet-confirmed"}
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    cluster.history.check()


def test_a_kubelet_that_wrote_before_dispatch_saw_the_mark_leaves_the_shut_down_node_as_the_way_out(
        adapter: Adapter, cluster: FakeCluster) -> None:
    """A mark on a pod whose kubelet hears of it at once (no controller running, or its kubelet faster than the
    controller's watch): the kubelet stops the pod and writes nothing more, so no later write exists to order
    after dispatch's record. The word is refused for good, and status and the refusal say so and name the way
    out that needs no kubelet write: the node shut down, then its word."""
    first = started(adapter, cluster)
    adapter.hold(NAME)
    cluster.mark_failed(first, reason="KueueForcefullyDeleted")
    cluster.settle(honour_grace=False)  # its kubelet stops the pod at once (Error/137 under OnFailure: no proof)
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin:
        with pytest.raises(Refused) as err:
            admin.release_pod(first, process_gone=True)  # records the mark now: after the kubelet's last write
        assert err.value.reason == "KubeletNotReported"
        assert "if it came back before dispatch saw the mark and so writes nothing more, shut the node down" in str(
            err.value)
        cessation = adapter.ceased(NAME)
        assert not cessation.ceased
        assert (f"a kubelet that wrote it before writes nothing more: then shut node-0 down and run "
                f"`dispatch admin release-pod {first} --node-confirmed-down`") in cessation.reason
        cluster.settle()
        with pytest.raises(Refused):
            admin.release_pod(first, process_gone=True)  # still: the kubelet wrote nothing since
        cluster.shut_down("node-0")
        assert admin.release_pod(first, node_confirmed_down=True).proof == "operator-confirmed"
    assert adapter.release(NAME).admission == 2
    cluster.history.check()
