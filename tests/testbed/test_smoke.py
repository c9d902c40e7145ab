"""Smoke test of the local control plane: the chain TrainJob -> JobSet -> Jobs -> Pods really runs.

Checks what the rest of the test-suite relies on: real apiserver version, the Trainer/JobSet/Kueue
controllers and webhooks, KWOK pods that stay Running, suspension, Kueue admission, node freeze/thaw.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dispatch import CONTROLLER_NAME, testbed

pytestmark = pytest.mark.testbed

Obj = dict[str, Any]


@pytest.fixture
def ns(testbed_kubeconfig: str) -> Iterator[str]:
    """A fresh namespace per test (deleted afterwards without waiting)."""
    name = f"smoke-{uuid.uuid4().hex[:6]}"
    testbed.kubectl("create", "namespace", name)
    yield name
    testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)


def get(*args: str) -> Obj:
    out: Obj = json.loads(testbed.kubectl("get", *args, "-o", "json").stdout)
    return out


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def apply(obj: Obj) -> None:
    testbed.kubectl("apply", "-f", "-", input=json.dumps(obj))


def trainjob(name: str, namespace: str, num_nodes: int = 2, labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
                "name": "torch-distributed",
            },
            "trainer": {
                "numNodes": num_nodes,
                "resourcesPerNode": {"requests": {"cpu": "1", "memory": "1Gi"}},
            },
        },
    }


def pods(namespace: str, selector: str) -> list[Obj]:
    items: list[Obj] = get("pods", "-n", namespace, "-l", selector)["items"]
    return items


def running_pods(namespace: str, selector: str) -> list[Obj]:
    return [
        p
        for p in pods(namespace, selector)
        if p["status"].get("phase") == "Running" and "deletionTimestamp" not in p["metadata"]
    ]


def test_server_version_is_the_built_one(testbed_kubeconfig: str) -> None:
    v = json.loads(testbed.kubectl("version", "-o", "json").stdout)
    assert v["serverVersion"]["gitVersion"] == testbed.versions()["K8S_VERSION"]
    assert v["clientVersion"]["gitVersion"] == testbed.versions()["K8S_VERSION"]


def test_every_component_is_healthy(testbed_kubeconfig: str) -> None:
    bad = [s.name for s in testbed.status() if not s.healthy]
    assert bad == []


def test_training_runtime_and_kueue_fixtures_exist(testbed_kubeconfig: str) -> None:
    get("clustertrainingruntime", "torch-distributed")
    conds = get("clusterqueue", "cq")["status"].get("conditions", [])
    assert any(c["type"] == "Active" and c["status"] == "True" for c in conds)
    # cq-dispatch waits for the project's admission-check controller to mark AdmissionCheck `dispatch` Active.
    checks = get("clusterqueue", "cq-dispatch")["spec"]["admissionChecksStrategy"]["admissionChecks"]
    assert [c["name"] for c in checks] == ["dispatch"]
    get("localqueue", "-n", "default", "lq")
    get("localqueue", "-n", "default", "lq-dispatch")
    assert get("admissioncheck", "dispatch")["spec"]["controllerName"] == CONTROLLER_NAME


def test_trainjob_runs_then_suspends(ns: str) -> None:
    apply(trainjob("tj", ns))
    sel = "jobset.sigs.k8s.io/jobset-name=tj"
    wait_for("JobSet tj", lambda: bool(get("jobsets", "-n", ns)["items"]))
    wait_for("2 Running pods", lambda: len(running_pods(ns, sel)) == 2)
    nodes = {p["spec"]["nodeName"] for p in running_pods(ns, sel)}
    assert nodes <= set(testbed.regular_nodes() + testbed.freezable_nodes())
    jobs = get("jobs", "-n", ns, "-l", sel)["items"]
    assert len(jobs) == 1 and jobs[0]["status"].get("active") == 2
    time.sleep(3)  # pods must stay Running (no automatic completion)
    assert len(running_pods(ns, sel)) == 2

    testbed.kubectl("patch", "trainjob", "tj", "-n", ns, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for("JobSet suspended", lambda: get("jobset", "tj", "-n", ns)["spec"].get("suspend") is True)
    wait_for("pods gone after suspend", lambda: not pods(ns, sel), timeout=60)


def test_kueue_admits_trainjob(testbed_kubeconfig: str) -> None:
    name = f"tj-kueue-{uuid.uuid4().hex[:5]}"
    apply(trainjob(name, "default", labels={"kueue.x-k8s.io/queue-name": "lq"}))
    try:
        # Kueue's webhook suspends it at creation, then admits it and un-suspends it.
        def admitted() -> bool:
            for wl in get("workloads", "-n", "default")["items"]:
                owners = wl["metadata"].get("ownerReferences", [])
                if any(o["name"] == name for o in owners):
                    conds = wl.get("status", {}).get("conditions", [])
                    return any(c["type"] == "Admitted" and c["status"] == "True" for c in conds)
            return False

        wait_for("Workload admitted", admitted)
        wait_for("TrainJob un-suspended", lambda: not get("trainjob", name, "-n", "default")["spec"].get("suspend"))
        sel = f"jobset.sigs.k8s.io/jobset-name={name}"
        wait_for("Running pods", lambda: len(running_pods("default", sel)) == 2)
    finally:
        testbed.kubectl("delete", "trainjob", name, "-n", "default", "--wait=false", check=False)


def test_pod_annotations_drive_completion_and_deletion(ns: str) -> None:
    def pod(name: str, annotations: dict[str, str]) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations, "labels": {"app": name}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "nodeName": "node-0"},
        }

    apply(pod("done", {}))
    apply(pod("held", {testbed.ANN_HOLD_DELETE: "true"}))
    wait_for("pods Running", lambda: len(running_pods(ns, "app in (done,held)")) == 2)
    testbed.kubectl("annotate", "pod", "done", "-n", ns, f"{testbed.ANN_COMPLETE}=true")
    wait_for("pod Succeeded", lambda: get("pod", "done", "-n", ns)["status"]["phase"] == "Succeeded")

    apply(pod("slow", {testbed.ANN_DELETE_DELAY: "4"}))
    wait_for("slow Running", lambda: len(running_pods(ns, "app=slow")) == 1)
    testbed.kubectl("delete", "pod", "slow", "-n", ns, "--wait=false")
    time.sleep(2.5)
    assert pods(ns, "app=slow"), "delete-delay of 4 s was not honoured"
    wait_for("slow pod finalized", lambda: not pods(ns, "app=slow"), timeout=15)

    testbed.kubectl("delete", "pod", "held", "-n", ns, "--wait=false")
    time.sleep(3)
    assert "deletionTimestamp" in get("pod", "held", "-n", ns)["metadata"]  # held Terminating
    testbed.kubectl("annotate", "pod", "held", "-n", ns, f"{testbed.ANN_HOLD_DELETE}-")
    wait_for("held pod finalized", lambda: not pods(ns, "app=held"), timeout=20)


def test_freeze_makes_node_unknown_and_thaw_recovers(ns: str) -> None:
    node = testbed.freezable_nodes()[0]

    def ready(status: str) -> Callable[[], bool]:
        def check() -> bool:
            conds = get("node", node)["status"].get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == status for c in conds)

        return check

    apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "victim", "namespace": ns, "labels": {"app": "victim"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], "nodeName": node},
        }
    )
    wait_for("victim Running", lambda: len(running_pods(ns, "app=victim")) == 1)
    testbed.freeze(node)
    try:
        wait_for("node Ready=Unknown", ready("Unknown"), timeout=60)
        # Taint eviction (toleration 5 s) deletes the pod; with the node's kwok stopped it stays Terminating.
        wait_for(
            "victim Terminating",
            lambda: "deletionTimestamp" in get("pod", "victim", "-n", ns)["metadata"],
            timeout=60,
        )
        time.sleep(2)
        assert pods(ns, "app=victim"), "pod vanished although its node's kubelet is frozen"
    finally:
        testbed.thaw(node)
    wait_for("node Ready again", ready("True"), timeout=60)
    wait_for("victim finalized", lambda: not pods(ns, "app=victim"), timeout=60)


def test_trainer_webhook_refuses_runtime_patches_while_jobset_active(ns: str) -> None:
    """The real Trainer validating webhook is live: it reads the JobSet status kept by the real controllers."""
    apply(trainjob("rp", ns))
    sel = "jobset.sigs.k8s.io/jobset-name=rp"
    wait_for("2 Running pods", lambda: len(running_pods(ns, sel)) == 2)
    wait_for(
        "JobSet reports an active ReplicatedJob",
        lambda: any(
            r.get("active", 0) > 0 for r in get("jobset", "rp", "-n", ns)["status"].get("replicatedJobsStatus", [])
        ),
    )
    patch = {
        "spec": {
            "suspend": True,
            "runtimePatches": [
                {
                    "manager": "dispatch.test/smoke",
                    "trainingRuntimeSpec": {"template": {"metadata": {"labels": {"smoke": "1"}}}},
                }
            ],
        }
    }
    res = testbed.kubectl("patch", "trainjob", "rp", "-n", ns, "--type=merge", "-p", json.dumps(patch), check=False)
    assert res.returncode != 0
    assert "RuntimePatches cannot be modified when the JobSet's ReplicatedJob node is still active" in res.stderr
