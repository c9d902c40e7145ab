"""The fake's kubelet ends pods as real kubelets do: each ending recorded on a real kubelet (data/
kubelet-endings.json, re-recorded by the testbed's real node on every run) is reproduced by the fake in
everything the rule reads, and the rule reads each one as the kubelet meant it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dispatch import POD_FINALIZER
from dispatch.testing import FakeCluster, ending_shape, proof_of

RECORDED: dict[str, Any] = {k: v for k, v in json.loads(
    (Path(__file__).parent / "data" / "kubelet-endings.json").read_text()).items() if not k.startswith("_")}


def bare_pod(cluster: FakeCluster, name: str, *, init: bool = False, finalizer: bool = True) -> None:
    """A pod bound to node-0 (as the scheduler binds it), with dispatch's finalizer as dispatch's pods have."""
    spec: dict[str, Any] = {"nodeName": "node-0", "restartPolicy": "Never",
                            "containers": [{"name": "main", "image": "example.invalid/train"}]}
    if init:
        spec["initContainers"] = [{"name": "init", "image": "example.invalid/init"}]
    cluster.server.create("", "pods", "default", {
        "metadata": {"name": name, "finalizers": [POD_FINALIZER] if finalizer else []},
        "spec": spec, "status": {"phase": "Pending"}})


def status_of(cluster: FakeCluster, name: str) -> dict[str, Any]:
    obj = cluster.server.get("", "pods", "default", name)
    assert obj is not None, f"pod {name} is gone"
    return dict(obj.get("status") or {})


@pytest.fixture
def fake() -> FakeCluster:
    c = FakeCluster()
    c.add_node("node-0")
    return c


def test_a_rejection_as_a_real_kubelet_writes_it(fake: FakeCluster) -> None:
    fake.kubelet_rejects("node-0")
    bare_pod(fake, "p")
    fake.kubelet_sync()
    assert ending_shape(status_of(fake, "p")) == ending_shape(RECORDED["rejected"]["status"])
    assert fake.running_processes() == []


def test_a_rejected_pod_deleted_while_a_finalizer_holds_it(fake: FakeCluster) -> None:
    fake.kubelet_rejects("node-0")
    bare_pod(fake, "p")
    fake.kubelet_sync()
    fake.server.delete("", "pods", "default", "p")
    fake.kubelet_sync()
    assert ending_shape(status_of(fake, "p")) == ending_shape(RECORDED["rejected-then-deleted-held"]["status"])


def test_a_rejected_pod_without_a_finalizer_goes_at_once_when_deleted(fake: FakeCluster) -> None:
    fake.kubelet_rejects("node-0")
    bare_pod(fake, "p", finalizer=False)
    fake.kubelet_sync()
    fake.server.delete("", "pods", "default", "p")
    assert fake.server.get("", "pods", "default", "p") is None


def test_a_pod_deleted_during_its_init_containers(fake: FakeCluster) -> None:
    fake.init_containers_hang("node-0")
    bare_pod(fake, "p", init=True)
    fake.kubelet_sync()
    assert fake.running_processes() == []
    fake.server.delete("", "pods", "default", "p", grace=0)
    fake.kubelet_sync()
    assert ending_shape(status_of(fake, "p")) == ending_shape(RECORDED["init-then-deleted-held"]["status"])


@pytest.mark.parametrize(("ending", "proof"), [
    ("rejected", False),  # no container status: only a delete makes its kubelet finish it
    ("rejected-then-deleted-held", True),
    ("init-then-deleted-held", True),  # the containers never left PodInitializing, and never will
    ("never-started-then-deleted", True),
])
def test_the_rule_reads_each_recorded_ending_as_its_kubelet_meant_it(ending: str, proof: bool) -> None:
    recorded = RECORDED[ending]
    status = recorded["status"]
    names = [c["name"] for c in status.get("containerStatuses") or []] or ["c"]
    inits = [c["name"] for c in status.get("initContainerStatuses") or []]
    for policy in ("Never", "OnFailure"):
        assert proof_of(status, policy, names, inits) is proof, (ending, policy)


def test_a_crash_under_on_failure_keeps_the_phase_and_the_kubelet_restarts_it(fake: FakeCluster) -> None:
    bare_pod(fake, "p")
    pod = fake.server.get("", "pods", "default", "p")
    assert pod is not None

    def on_failure(obj: dict[str, Any]) -> None:
        obj["spec"]["restartPolicy"] = "OnFailure"
    fake.server.update("", "pods", "default", "p", on_failure, status=None)
    fake.kubelet_sync()
    assert len(fake.running_processes()) == 1
    fake.crash("p", 1)
    shape = ending_shape(status_of(fake, "p"))
    assert shape["phase"] == "Running" and shape["containerStatuses"] == [("terminated", "Error", 1, "")]
    fake.kubelet_sync()
    assert len(fake.running_processes()) == 1, "restarted, as a real kubelet restarts it under OnFailure"


def _kubelet_owned(status: dict[str, Any]) -> dict[str, Any]:
    """What dispatch's ``MarkSeen`` digest reads of the kubelet's own conditions, and whether each
    container's end carries times (the recorded ``finishedAt: null`` of a container that never ran, or a time)."""
    conds = {c["type"]: c["status"] for c in status.get("conditions") or []
             if c["type"] in ("PodReadyToStartContainers", "Initialized", "ContainersReady")}
    times = [tuple(bool(((c.get("state") or {}).get("terminated") or {}).get(k)) for k in ("startedAt", "finishedAt"))
             for key in ("initContainerStatuses", "containerStatuses") for c in status.get(key) or []
             if "terminated" in (c.get("state") or {})]
    return {"conditions": conds, "times": times}


def test_a_pod_stopped_during_its_init_containers_carries_the_kubelet_s_times_and_conditions(fake: FakeCluster) -> None:
    """Issue 35, item 7: the fake's kubelet wrote the killed init container with no times and none of its own
    conditions, so nothing the kubelet wrote after a mark could be told; the real one writes both (recorded
    ``init-then-deleted-held``: init Error/137 with its start and end, the sandbox gone, not initialised)."""
    fake.init_containers_hang("node-0")
    bare_pod(fake, "p", init=True)
    fake.kubelet_sync()
    fake.server.delete("", "pods", "default", "p", grace=0)
    fake.kubelet_sync()
    assert _kubelet_owned(status_of(fake, "p")) == _kubelet_owned(RECORDED["init-then-deleted-held"]["status"])


@pytest.mark.parametrize("ending", ["rejected-then-deleted-held", "never-started-then-deleted",
                                    "init-then-deleted-held"])
def test_every_recorded_kubelet_ending_reports_the_sandbox_gone(ending: str) -> None:
    """dispatch reads a terminal phase beside a sandbox still reported ready as written by someone other than
    the kubelet (PodGC's out-of-service path adds no condition): every ending a real kubelet wrote has it False."""
    assert _kubelet_owned(RECORDED[ending]["status"])["conditions"]["PodReadyToStartContainers"] == "False"


def test_podgc_s_out_of_service_path_writes_failed_and_no_condition(fake: FakeCluster) -> None:
    """PodGC's ``gcTerminating`` (``markFailedAndDeletePod``, Kubernetes v1.37.2, read from its source) writes
    phase Failed with no condition and deletes with grace 0; its orphan path (``gcOrphaned``) adds
    ``DisruptionTarget``/``DeletionByPodGC``. The fake added the condition on both."""
    bare_pod(fake, "p")
    fake.kubelet_sync()

    def down(obj: dict[str, Any]) -> None:
        obj.setdefault("spec", {})["taints"] = [{"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}]
        for c in obj["status"]["conditions"]:
            c["status"] = "Unknown"
    fake.server.update("", "nodes", "", "node-0", down, status=None)
    fake.server.delete("", "pods", "default", "p")
    fake.pod_gc()
    status = status_of(fake, "p")
    assert status["phase"] == "Failed"
    assert ending_shape(status)["foreignMarks"] == []
    assert {c["type"] for c in status.get("conditions") or []} <= {"PodReadyToStartContainers", "Initialized",
                                                                   "ContainersReady"}


# ---------------------------------------------------------------- issue 41: a container's own restart policy

OWN_RESTARTS: dict[str, tuple[str, dict[str, Any], int]] = {
    # pod restartPolicy, the container's own fields, exit code: what a real kubelet v1.37.2 did between two runs
    # is recorded in data/kubelet-endings.json as "<case>-between-runs" (tests/testbed/test_real_node_endings.py
    # records it again on every run)
    "own-on-failure": ("Never", {"restartPolicy": "OnFailure"}, 1),
    "restart-all-containers": ("Never", {"restartPolicy": "Never", "restartPolicyRules": [
        {"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [1]}}]}, 1),
    "own-always-exit-0": ("OnFailure", {"restartPolicy": "Always"}, 0),
}


def own_pod(cluster: FakeCluster, name: str, pod_policy: str, own: dict[str, Any]) -> None:
    cluster.server.create("", "pods", "default", {
        "metadata": {"name": name, "finalizers": [POD_FINALIZER]},
        "spec": {"nodeName": "node-0", "restartPolicy": pod_policy,
                 "containers": [{"name": "main", "image": "example.invalid/train", **own}]},
        "status": {"phase": "Pending"}})


@pytest.mark.parametrize("case", OWN_RESTARTS)
def test_a_container_s_own_policy_or_rule_restarts_it_whatever_the_pod_s_policy(fake: FakeCluster, case: str) -> None:
    """Between runs the phase stays Running and the container reads terminated with its exit code; the kubelet
    then starts it again (restartCount 0, 1, 2, ...), as the real one did for each case."""
    pod_policy, own, code = OWN_RESTARTS[case]
    own_pod(fake, "p", pod_policy, own)
    fake.kubelet_sync()
    for restarts in (1, 2):
        assert len(fake.running_processes()) == 1
        fake.crash("p", code)
        assert ending_shape(status_of(fake, "p")) == ending_shape(RECORDED[f"{case}-between-runs"]["status"])
        fake.kubelet_sync()
        assert len(fake.running_processes()) == 1, "started again"
        assert status_of(fake, "p")["containerStatuses"][0]["restartCount"] == restarts


def test_a_container_s_own_never_ends_the_pod_under_on_failure(fake: FakeCluster) -> None:
    own_pod(fake, "p", "OnFailure", {"restartPolicy": "Never"})
    fake.kubelet_sync()
    fake.crash("p", 1)
    assert ending_shape(status_of(fake, "p"))["phase"] == "Failed"
    fake.kubelet_sync()
    assert fake.running_processes() == []


def test_a_rule_that_does_not_match_the_exit_leaves_the_container_s_own_policy(fake: FakeCluster) -> None:
    own_pod(fake, "p", "Never", {"restartPolicy": "Never", "restartPolicyRules": [
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]})
    fake.kubelet_sync()
    fake.crash("p", 1)
    assert ending_shape(status_of(fake, "p"))["phase"] == "Failed"
    fake.kubelet_sync()
    assert fake.running_processes() == []


# ---------------------------------------------------------------- issue 40: a Node deleted under a live kubelet


def test_a_deleted_node_s_kubelet_runs_on_unregistered_and_podgc_takes_its_pods_40_s_on(fake: FakeCluster) -> None:
    """What the testbed's real node showed (kubelet v1.37.2, issue 40): after ``kubectl delete node`` its
    kubelet went on running its containers and did not register its Node again (for minutes, until it was
    restarted); about 40 s after the delete PodGC marked the pod Failed (``DisruptionTarget``/
    ``DeletionByPodGC``) and deleted it for good, which dispatch's finalizer turns into Terminating."""
    bare_pod(fake, "p")
    fake.kubelet_sync()
    fake.delete_node("node-0")
    for _ in range(3):
        fake.advance(10)
        fake.step()
        assert fake.server.get("", "nodes", "", "node-0") is None, "it does not register again"
        assert len(fake.running_processes()) == 1, "its containers run on"
        assert ending_shape(status_of(fake, "p"))["foreignMarks"] == [], "PodGC waits its quarantine"
    fake.advance(11)
    fake.pod_gc()
    pod = fake.server.get("", "pods", "default", "p")
    assert pod is not None and pod["metadata"]["deletionGracePeriodSeconds"] == 0
    assert ending_shape(pod["status"])["foreignMarks"] == [("DisruptionTarget", "DeletionByPodGC")]
    assert pod["status"]["phase"] == "Failed"
    fake.step()  # its live kubelet ends the pod deleted for good, and writes the container's end
    assert fake.running_processes() == []
    assert ending_shape(status_of(fake, "p")) == ending_shape(RECORDED["node-deleted-podgc-then-grace-end"]["status"])
    fake.restart_kubelet("node-0")
    node = fake.server.get("", "nodes", "", "node-0")
    assert node is not None, "a restarted kubelet registers its Node again"
