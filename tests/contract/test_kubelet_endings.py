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
