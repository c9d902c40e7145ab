"""The fake's Job controller held to the real one's ``batch.kubernetes.io/job-tracking`` finalizer (issue 34).

The real Job controller puts that finalizer on every pod it makes and takes it off once it has counted the pod:
when the pod is terminal or deleted while its Job exists, and at once from an orphan (a pod whose Job is gone or no
longer controls it). A campaign that restarted kube-apiserver 30 times left two deleted pods held 40 minutes by it,
their Job gone: the controller missed them. The fake keeps it only with ``FakeCluster(job_tracking=True)`` (and
misses orphans with ``job_controller_misses_orphans``: ``tests/fake/test_job_tracking.py``). The pods here are never
scheduled (their node selector matches no Node), as the campaign's two were, so no kubelet takes part: a deleted pod
that is not bound has no grace period and goes as soon as its last finalizer does.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from dispatch.testing import FakeCluster

Obj = dict[str, Any]
JOB_TRACKING = "batch.kubernetes.io/job-tracking"
NOWHERE = "dispatch-contract-no-such-node"


def job(name: str) -> Obj:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {
        "parallelism": 1, "completions": 1, "completionMode": "Indexed",
        "template": {"spec": {
            "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": NOWHERE},
            "containers": [{"name": "c", "image": "example.invalid/train"}]}}}}


def story(create: Callable[[Obj], Obj], pods: Callable[[], list[Obj]], jobs: Callable[[], list[str]],
          delete_job_orphaning: Callable[[str], object], delete_pod: Callable[[str], object],
          until: Callable[[str, Callable[[], bool]], None]) -> None:
    made = create(job("j"))

    def pod(uid: str) -> Obj | None:
        return next((p for p in pods() if p["metadata"]["uid"] == uid), None)

    until("the Job's pod", lambda: len(pods()) == 1)
    [first] = pods()
    assert JOB_TRACKING in (first["metadata"].get("finalizers") or []), first["metadata"]
    assert not first["spec"].get("nodeName")

    # deleted while its Job exists: the controller counts it, takes the finalizer off, and the pod goes
    delete_pod(first["metadata"]["name"])
    until("the deleted pod gone", lambda: pod(first["metadata"]["uid"]) is None)

    # its replacement, then the Job deleted leaving its pods: the orphan loses the finalizer, and goes when deleted
    until("the replacement pod", lambda: len(pods()) == 1)
    [second] = pods()
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    assert JOB_TRACKING in (second["metadata"].get("finalizers") or []), second["metadata"]
    delete_job_orphaning("j")
    until("the Job gone", lambda: "j" not in jobs())
    orphan = pod(second["metadata"]["uid"])
    assert orphan is not None and not orphan["metadata"].get("deletionTimestamp"), "an orphan is not deleted"
    assert not any(o.get("uid") == made["metadata"]["uid"] for o in orphan["metadata"].get("ownerReferences") or [])
    until("the orphan's finalizer taken off", lambda: JOB_TRACKING not in (
        (pod(second["metadata"]["uid"]) or {"metadata": {}})["metadata"].get("finalizers") or []))
    delete_pod(second["metadata"]["name"])
    until("the deleted orphan gone", lambda: pod(second["metadata"]["uid"]) is None)


def test_the_fakes_job_controller_keeps_and_removes_job_tracking_as_the_real_one() -> None:
    cluster = FakeCluster(job_tracking=True)
    cluster.add_node("node-0")
    srv = cluster.server

    def until(what: str, cond: Callable[[], bool]) -> None:
        for _ in range(10):
            if cond():
                return
            cluster.step()
        raise AssertionError(f"the fake never showed {what}")

    story(create=lambda obj: srv.create("batch", "jobs", "default", obj),
          pods=lambda: srv.objects("", "pods", "default"),
          jobs=lambda: [j["metadata"]["name"] for j in srv.objects("batch", "jobs", "default")],
          delete_job_orphaning=lambda name: srv.delete("batch", "jobs", "default", name, propagation="Orphan"),
          delete_pod=lambda name: srv.delete("", "pods", "default", name),
          until=until)


def test_without_job_tracking_the_fakes_pods_carry_no_such_finalizer() -> None:
    """The knob's default: the schedules written before it see pods without it."""
    cluster = FakeCluster()
    cluster.server.create("batch", "jobs", "default", job("j"))
    cluster.settle()
    [pod] = cluster.server.objects("", "pods", "default")
    assert JOB_TRACKING not in (pod["metadata"].get("finalizers") or [])


@pytest.mark.testbed
def test_the_real_job_controller_keeps_and_removes_job_tracking(testbed_kubeconfig: str) -> None:
    from dispatch import testbed

    ns = f"jobtrack-{uuid.uuid4().hex[:6]}"
    testbed.kubectl("create", "namespace", ns)

    def get_json(*args: str) -> Obj:
        out: Obj = json.loads(testbed.kubectl(*args, "-n", ns, "-o", "json").stdout)
        return out

    def until(what: str, cond: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 60
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"the real control plane never showed {what}")
            time.sleep(0.3)

    def pods() -> list[Obj]:
        return list(get_json("get", "pods")["items"])

    try:
        story(create=lambda obj: json.loads(testbed.kubectl("create", "-n", ns, "-o", "json", "-f", "-",
                                                            input=json.dumps(obj)).stdout),
              pods=pods,
              jobs=lambda: [j["metadata"]["name"] for j in get_json("get", "jobs")["items"]],
              delete_job_orphaning=lambda name: testbed.kubectl("delete", "job", name, "-n", ns,
                                                                "--cascade=orphan", "--wait=true"),
              delete_pod=lambda name: testbed.kubectl("delete", "pod", name, "-n", ns, "--wait=false"),
              until=until)
    finally:
        for p in pods():
            testbed.kubectl("patch", "pod", p["metadata"]["name"], "-n", ns, "--type=json",
                            "-p", '[{"op":"remove","path":"/metadata/finalizers"}]', check=False)
        testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)
