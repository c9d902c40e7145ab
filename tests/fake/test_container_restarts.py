"""Issue 41: a container's own ``restartPolicy`` and ``restartPolicyRules`` (ContainerRestartRules, 1.35+;
RestartAllContainers, 1.36+) make its kubelet restart it whatever the pod's ``restartPolicy`` says. Each case
measured on the testbed's real node (kubelet v1.37.2) is played here on the fake, whose kubelet follows them
(tests/contract/test_kubelet_endings.py): a Failed that Kueue's failure recovery writes over such a container
while its kubelet is cut off is no proof. On main each of these read the pod as ``kubelet-confirmed`` from
``spec.restartPolicy`` alone and admitted A=2."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import Adapter, JobSpec, PodsRemain, Refused
from dispatch.controller.testing import keeper_pass
from dispatch.testing import FakeCluster

NAME = "llama-s1"
ADMIN = ("dispatch-admin", "dispatch-node-reader")
TRAINER = "trainer.kubeflow.org"

CASES: dict[str, tuple[str, dict[str, Any], int]] = {
    # pod restartPolicy, the container's own fields, the exit code of its crash
    "own-on-failure": ("Never", {"restartPolicy": "OnFailure"}, 1),
    "restart-all-containers": ("Never", {"restartPolicy": "Never", "restartPolicyRules": [
        {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [1]}}]}, 1),
    "own-always-exit-0": ("OnFailure", {"restartPolicy": "Always"}, 0),
}


def spec() -> JobSpec:
    return JobSpec(job_id="llama", submission="s1", node_selector={"kubernetes.io/hostname": "node-0"})


def runtime_sets(cluster: FakeCluster, pod_policy: str, own: dict[str, Any]) -> None:
    """The runtime's pod template: the pod's restartPolicy, and the container's own fields."""
    def edit(obj: dict[str, Any]) -> None:
        pod = obj["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        pod["restartPolicy"] = pod_policy
        pod["containers"][0].update(own)
    cluster.server.update(TRAINER, "clustertrainingruntimes", "", "torch-distributed", edit, status=None)


@pytest.mark.parametrize("case", CASES)
def test_a_failed_written_over_a_container_its_own_rules_restart_is_no_proof(
        adapter: Adapter, cluster: FakeCluster, case: str) -> None:
    pod_policy, own, code = CASES[case]
    runtime_sets(cluster, pod_policy, own)
    opened = adapter.open(spec())
    assert any("sets its own restart policy or rules" in w for w in opened.warnings), opened.warnings
    assert adapter.release(NAME).admission == 1
    cluster.settle()
    (pod,) = cluster.pods(NAME)
    first = pod["metadata"]["name"]
    assert pod["spec"]["restartPolicy"] == pod_policy
    cluster.crash(first, code)
    assert (cluster.server.get("", "pods", "default", first) or {})["status"]["phase"] == "Running", "a restart is due"
    cluster.partition("node-0")  # cut off before the restart reaches the API
    adapter.hold(NAME)
    cluster.settle()
    cluster.mark_failed(first, reason="KueueForcefullyDeleted")  # Kueue's failure recovery
    cluster.server.delete("", "pods", "default", first, grace=0)
    cluster.settle()  # the cut-off kubelet restarts the container: A=1 runs again
    assert [p.admission for p in cluster.running_processes()] == [1]
    with pytest.raises(PodsRemain) as err:
        adapter.release(NAME)
    assert "marked Failed by Kueue's failure recovery, not its kubelet" in str(err.value)
    assert "container node (restartPolicy" in str(err.value)  # names the container's own policy
    assert not adapter.ceased(NAME).ceased
    assert keeper_pass(cluster, settle=False) == {f"default/{first}": "unproven"}
    with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin, \
            pytest.raises(Refused) as refused:
        admin.release_pod(first, process_gone=True)  # its kubelet is not back: it may start the container
    assert refused.value.reason == "NodeNotReady"
    cluster.history.check()
    # The partition heals: the kubelet learns the Failed and stops the container (137). Where its rules would
    # restart that exit too, the operator's word that the process is gone, taken once its kubelet has reported
    # since the mark, ends the wait; where they would not (the rule acts on exit 1 only), the end is proven.
    cluster.heal("node-0")
    cluster.settle()
    assert cluster.running_processes() == []
    if case == "restart-all-containers":
        assert keeper_pass(cluster, settle=False) == {f"default/{first}": "kubelet-confirmed"}
    else:
        with Adapter.connect("default", transport=cluster.transport(roles=ADMIN)) as admin:
            assert admin.release_pod(first, process_gone=True).proof == "operator-confirmed"
    cluster.settle()
    assert adapter.release(NAME).admission == 2
    cluster.settle()
    cluster.history.check()


def test_a_container_that_sets_no_policy_of_its_own_gets_no_warning(adapter: Adapter, cluster: FakeCluster) -> None:
    opened = adapter.open(spec())
    assert not any("restart policy or rules" in w for w in opened.warnings), opened.warnings


def test_a_container_whose_own_policy_never_restarts_it_under_a_pod_on_failure_is_proven_by_the_mark(
        adapter: Adapter, cluster: FakeCluster) -> None:
    """The other way round: the container's own Never wins over the pod's OnFailure (JobSet's default): its
    kubelet ends the pod at its exit 1 and never starts it again, and the end is proven."""
    runtime_sets(cluster, "OnFailure", {"restartPolicy": "Never"})
    adapter.open(spec())
    adapter.release(NAME)
    cluster.settle()
    (pod,) = cluster.pods(NAME)
    first = pod["metadata"]["name"]
    cluster.crash(first, 1)
    ended = cluster.server.get("", "pods", "default", first) or {}
    assert ended["status"]["phase"] == "Failed", "its kubelet ended it"
    assert cluster.running_processes() == []
    assert [e.proof for e in adapter.ceased(NAME).ends if e.name == first] == ["kubelet-confirmed"]
