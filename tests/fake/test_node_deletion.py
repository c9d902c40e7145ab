"""Issue 40: a deleted Node is no proof while its kubelet lives. Measured on the testbed's real node (kubelet
v1.37.2): ``kubectl delete node`` of a running machine left its kubelet running its containers without
registering its Node again; ``ceased`` answered true and ``release-pod`` took ``node-deleted`` while the
process ran, and once PodGC deleted the orphaned pod (40 s on) the controller's keeper freed it and ``release``
admitted A=2 beside A=1. Here the same on the fake, whose Node deletion and PodGC follow the real ones
(tests/contract/test_kubelet_endings.py). On main each of these failed."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import LABEL_JOB_ID, LABEL_SUBMISSION, POD_FINALIZER, Adapter, JobSpec, PodsRemain, Refused
from dispatch.controller.testing import keeper_pass
from dispatch.testing import FakeCluster

NAME = "llama-s1"
ADMIN = ("dispatch-admin", "dispatch-node-reader")
TRAINER = "trainer.kubeflow.org"


def spec() -> JobSpec:
    return JobSpec(job_id="llama", submission="s1", node_selector={"kubernetes.io/hostname": "node-0"})


def grace(cluster: FakeCluster, seconds: int) -> None:
    def edit(obj: dict[str, Any]) -> None:
        pod = obj["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        pod["terminationGracePeriodSeconds"] = seconds
    cluster.server.update(TRAINER, "clustertrainingruntimes", "", "torch-distributed", edit, status=None)


def release_or_why(adapter: Adapter) -> int | str:
    try:
        return adapter.release(NAME).admission
    except PodsRemain as exc:
        return str(exc)


def test_a_node_deleted_while_its_kubelet_lives_proves_nothing_until_the_kubelet_registers_again(
        adapter: Adapter, cluster: FakeCluster) -> None:
    grace(cluster, 60)
    adapter.open(spec())
    assert adapter.release(NAME).admission == 1
    cluster.settle()
    (pod,) = cluster.pods(NAME)
    first = pod["metadata"]["name"]
    adapter.hold(NAME)
    cluster.settle()  # in its 60 s grace period: the process writes on
    assert [p.admission for p in cluster.running_processes()] == [1]

    cluster.delete_node("node-0")  # "remove a bad node": its machine and kubelet run on
    assert [p.admission for p in cluster.running_processes()] == [1]
    assert cluster.server.get("", "nodes", "", "node-0") is None
    cessation = adapter.ceased(NAME)
    assert not cessation.ceased
    assert "node-0 was deleted, which proves nothing by itself" in cessation.reason
    assert "restart its kubelet" in cessation.reason
    assert isinstance(release_or_why(adapter), str)
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin, \
            pytest.raises(Refused) as refused:
        admin.release_pod(first)
    assert refused.value.reason == "Unproven"
    # The controller's keeper saw the Node Ready=True when it was deleted: no proof.
    assert keeper_pass(cluster, settle=False) == {f"default/{first}": "unproven"}

    cluster.advance(20)
    cluster.settle()  # PodGC waits its 40 s quarantine
    during = cluster.server.get("", "pods", "default", first)
    assert during is not None and during["metadata"].get("deletionGracePeriodSeconds") != 0
    cluster.advance(25)
    cluster.settle()  # PodGC marks it Failed and deletes it for good; dispatch's finalizer keeps it visible
    left = cluster.server.get("", "pods", "default", first)
    assert left is not None and left["metadata"]["finalizers"] == [POD_FINALIZER]
    assert any(c.get("reason") == "DeletionByPodGC" for c in left["status"]["conditions"])
    keeper_pass(cluster, settle=False)
    got = release_or_why(adapter)
    assert isinstance(got, str) and "marked Failed by PodGC, not its kubelet" in got, got
    assert "restart its kubelet" in got
    assert not adapter.ceased(NAME).ceased
    cluster.history.check()

    # Its kubelet kills the process at the end of the 60 s grace it first saw (PodGC's grace 0 does not hurry
    # it, as on the real node) and writes the container's end, after dispatch recorded PodGC's mark.
    assert [p.admission for p in cluster.running_processes()] == [1]
    cluster.advance(16)
    cluster.settle()
    assert cluster.running_processes() == []
    # The runbook's way out of a mistaken delete: restart the kubelet; it registers its Node again (a new
    # object), and the operator's word that the process is gone is then taken.
    cluster.restart_kubelet("node-0")
    cluster.settle()
    assert cluster.running_processes() == []
    assert keeper_pass(cluster, settle=False) == {f"default/{first}": "unproven"}  # PodGC's mark, OnFailure
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin:
        assert admin.release_pod(first, process_gone=True).proof == "operator-confirmed"
    cluster.settle()
    assert release_or_why(adapter) == 2
    cluster.settle()
    cluster.history.check()


def test_a_node_deleted_by_mistake_ends_the_wait_by_itself_when_its_kubelet_ends_the_pod_within_the_quarantine(
        adapter: Adapter, cluster: FakeCluster) -> None:
    """Within PodGC's 40 s its live kubelet ends the held pod as on any node: its own Failed is the proof."""
    adapter.open(spec())
    assert adapter.release(NAME).admission == 1
    cluster.settle()
    adapter.hold(NAME)
    cluster.settle()
    cluster.delete_node("node-0")
    cluster.advance(31)  # the 30 s grace ends first
    cluster.settle()
    assert cluster.running_processes() == []
    keeper_pass(cluster)
    assert release_or_why(adapter) == 2
    cluster.history.check()


def test_a_lost_machine_s_node_deleted_once_seen_silent_is_proven_by_the_controller(
        adapter: Adapter, cluster: FakeCluster) -> None:
    adapter.open(spec())
    assert adapter.release(NAME).admission == 1
    cluster.settle()
    (pod,) = cluster.pods(NAME)
    cluster.freeze_node("node-0")  # Ready=Unknown: the node controller's word after its grace
    adapter.hold(NAME)
    cluster.settle()
    cluster.remove_machine("node-0")  # the machine is gone and its Node deleted
    assert not adapter.ceased(NAME).ceased  # a plain read cannot tell what it was when deleted
    assert keeper_pass(cluster) == {f"default/{pod['metadata']['name']}": "node-deleted"}
    assert release_or_why(adapter) == 2
    cluster.history.check()


def test_a_node_registered_again_under_the_name_proves_nothing_of_the_old_pods() -> None:
    """Node node-0 is deleted while Ready (its kubelet may run on); another Node object under the name (a new uid,
    created after the pod) is seen Ready=Unknown, tainted out-of-service, and deleted: none of it is about the
    machine that ran the pod."""
    cluster = FakeCluster()
    cluster.add_node("node-0")
    cluster.advance(1)
    cluster.server.create("", "pods", "default", {
        "metadata": {"name": "p", "finalizers": [POD_FINALIZER],
                     "labels": {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1"}},
        "spec": {"nodeName": "node-0", "restartPolicy": "Never", "containers": [{"name": "c", "image": "x.invalid"}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "c", "state": {"running": {}}}]}})
    cluster.advance(1)
    cluster.server.delete("", "nodes", "", "node-0")  # while Ready=True
    cluster.advance(1)
    cluster.server.create("", "nodes", "", {"metadata": {"name": "node-0"}, "status": {"conditions": [
        {"type": "Ready", "status": "Unknown"}]}, "spec": {"taints": [
            {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}]}})
    assert keeper_pass(cluster, settle=False) == {"default/p": "unproven"}
    cluster.server.delete("", "nodes", "", "node-0")  # the new one, last seen Ready=Unknown
    assert keeper_pass(cluster, settle=False) == {"default/p": "unproven"}
