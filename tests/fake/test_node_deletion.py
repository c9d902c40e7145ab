"""Issue 40: a deleted Node is no proof while its kubelet lives. Measured on the testbed's real node (kubelet
v1.37.2): ``kubectl delete node`` of a running machine left its kubelet running its containers without
registering its Node again; ``ceased`` answered true and ``release-pod`` took ``node-deleted`` while the
process ran, and once PodGC deleted the orphaned pod (40 s on) the controller's keeper freed it and ``release``
admitted A=2 beside A=1. Here the same on the fake, whose Node deletion and PodGC follow the real ones
(tests/contract/test_kubelet_endings.py). On main each of these failed."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import (
    LABEL_ADMISSION,
    LABEL_JOB_ID,
    LABEL_SUBMISSION,
    POD_FINALIZER,
    Adapter,
    JobSpec,
    PodsRemain,
    Refused,
)
from dispatch.controller.testing import FakeGuard, keeper_pass
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
    # freed, the pod stays in the API through its grace period until PodGC deletes it (grace 0) 40 s after it found
    # the Node missing, as on the real API server; a plain read still cannot prove it until then
    assert isinstance(release_or_why(adapter), str)
    cluster.advance(cluster.ORPHAN_QUARANTINE)
    cluster.settle()
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


@pytest.mark.parametrize("jobset_deleted", [True, False], ids=["jobset-deleted-first", "running-when-node-deleted"])
def test_a_rank_kept_from_starting_by_a_pod_of_a_node_deleted_and_registered_again_names_the_word_that_ends_it(
        adapter: Adapter, cluster: FakeCluster, jobset_deleted: bool) -> None:
    """Issue 34's campaign stall (seed 1049686256, k8s-1.37): the Node deleted under its live kubelet while a
    running object's pod was in its grace period (the operator had deleted the JobSet) or still running, dispatch's
    controller down (both replicas) while PodGC marked the pod Failed and deleted it for good and the kubelet
    killed the process and wrote the container's end, then the kubelet restarted (it registers its Node again: a
    new object). When the controller is back it first sees PodGC's mark on the kubelet's last write, which writes
    nothing more. The Job controller's new pod of the same rank is refused by the guard over and over, and the
    object stays Running with no process. On main, status named the pod but the words `release-pod
    --process-gone` were refused (``KubeletNotReported``) and `--node-confirmed-down` too (``NodeReady``): only a
    shut-down of the running node was left. A kubelet that registered its Node after the pod was deleted started
    after that deletion, so it tore the pod down without starting a container of it (its first view had the
    deletion): the operator's word that the process is gone is taken, and status names it as the one command
    that ends the wait."""
    guard = FakeGuard(cluster)
    guard.install()
    grace(cluster, 60)
    adapter.open(spec())
    assert adapter.release(NAME).admission == 1
    cluster.settle()
    (pod,) = cluster.pods(NAME)
    old = pod["metadata"]["name"]
    if jobset_deleted:
        cluster.server.delete("jobset.x-k8s.io", "jobsets", "default", NAME)  # the operator deletes the JobSet
        cluster.settle()
        assert cluster.refused_pods, "Trainer, JobSet and the Job controller make the rank's pod again at once"
    cluster.delete_node("node-0")  # its kubelet runs on, unregistered
    # dispatch's controller is down from here: no keeper pass until the kubelet has written its last
    cluster.advance(45)
    cluster.settle()  # PodGC: Failed (DisruptionTarget/DeletionByPodGC), deleted for good; the finalizer keeps it
    if jobset_deleted:
        cluster.advance(16)
        cluster.settle()  # the grace period's end: the kubelet kills the process and writes its end (Error 137)
    assert cluster.running_processes() == []
    assert cluster.refused_pods, "the Job controller replaces the deleted pod, and the guard refuses it"
    cluster.advance(10)
    cluster.restart_kubelet("node-0")  # the campaign's runner restarted it 30 s after the heal began
    cluster.settle()
    assert keeper_pass(cluster, settle=False) == {f"default/{old}": "unproven"}  # the controller back: records
    cluster.settle()
    assert keeper_pass(cluster, settle=False) == {f"default/{old}": "unproven"}  # ... and nothing more comes
    before = len(cluster.refused_pods)
    cluster.settle()
    assert len(cluster.refused_pods) > before, "the Job controller's new pod is refused over and over"
    assert [p["metadata"]["name"] for p in cluster.pods(NAME)] == [old]
    assert cluster.running_processes() == []

    status = adapter.inspect(NAME)
    assert status.state.value == "Running"
    word = f"`dispatch admin release-pod {old} --process-gone`"
    assert status.cause is not None and status.cause.detail.startswith(
        "execution 1 admitted; a rank of execution 1 waits to start again while the pod before may still run "
        f"(remaining pods: {old} on node-0 (Ready=True)): the guard refuses a rank's new pod until that pod's end "
        f"is proven; pod {old}: marked Failed by PodGC, not its kubelet, and under restartPolicy OnFailure its "
        "kubelet may still start container node; node node-0 was registered again after the pod was deleted: if it "
        "is the machine that ran the pod, its kubelet started since and never starts a container of it: once the "
        f"process is gone there, {word} ends the wait"), \
        status.cause
    assert "--node-confirmed-down" not in status.cause.detail  # refused while node-0 reports Ready=True
    assert adapter.find(job_id="llama")[0].cause == status.cause
    assert word in guard.pod_denied[-1]
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin:
        with pytest.raises(Refused) as refused:
            admin.release_pod(old, node_confirmed_down=True)
        assert refused.value.reason == "NodeReady"
        assert admin.release_pod(old, process_gone=True).proof == "operator-confirmed"
    cluster.settle()  # the Job controller's next try is allowed: the rank runs again, with the same A
    (new,) = cluster.pods(NAME)
    assert new["metadata"]["name"] != old and new["status"]["phase"] == "Running"
    assert new["metadata"]["labels"][LABEL_ADMISSION] == "1"
    assert adapter.inspect(NAME).cause.detail == "execution 1 admitted"
    cluster.history.check()
