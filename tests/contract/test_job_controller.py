"""The fake's Job controller held to the real one (issue 35): pods belong to a Job by its uid, not its name.

The real Job controller labels every pod it makes with ``batch.kubernetes.io/controller-uid`` (and the legacy
``controller-uid``) and selects by it. So a Job deleted with its pods left behind and re-created under the same
name does not count the old, still Terminating pod as its own: it starts a new pod beside it at once, whatever
its ``podReplacementPolicy`` (the hazard the guard's pod check refuses for dispatch objects). The fake selects as
the real one does (it once selected by name and, under ``Failed``, made no new pod beside the old one).
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
HOLD = "dispatch.test/hold-delete"  # the testbed's KWOK keeps a deleted pod Terminating while it is present


def job(name: str, node: str) -> Obj:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {
        "parallelism": 1, "completions": 1, "completionMode": "Indexed", "podReplacementPolicy": "Failed",
        "template": {"metadata": {"annotations": {HOLD: "true"}}, "spec": {
            "restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "example.invalid/train"}]}}}}


def story(create: Callable[[Obj], Obj], pods: Callable[[], list[Obj]], delete_job_orphaning: Callable[[str], object],
          delete_pod: Callable[[str], object], until: Callable[[str, Callable[[], bool]], None], node: str) -> None:
    first = create(job("j", node))
    until("the Job's pod", lambda: len(pods()) == 1)
    [old] = pods()
    labels = old["metadata"]["labels"]
    assert labels["batch.kubernetes.io/controller-uid"] == labels["controller-uid"] == first["metadata"]["uid"]
    delete_pod(old["metadata"]["name"])
    until("the old pod Terminating", lambda: bool(pods() and pods()[0]["metadata"].get("deletionTimestamp")))
    delete_job_orphaning("j")
    second = create(job("j", node))
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    until("a new pod beside the Terminating one", lambda: len(pods()) == 2)
    new = [p for p in pods() if p["metadata"]["name"] != old["metadata"]["name"]]
    assert [p["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] for p in new] == [second["metadata"]["uid"]]
    assert any(p["metadata"].get("deletionTimestamp") for p in pods()), "the old pod is still Terminating"


def test_the_fakes_job_controller_selects_by_uid() -> None:
    cluster = FakeCluster()
    cluster.add_node("node-0")
    srv = cluster.server

    def until(what: str, cond: Callable[[], bool]) -> None:
        for _ in range(10):
            cluster.job_sync()
            cluster.schedule()
            if cond():
                return
        raise AssertionError(f"the fake never showed {what}")

    story(create=lambda obj: srv.create("batch", "jobs", "default", obj),
          pods=lambda: srv.objects("", "pods", "default"),
          delete_job_orphaning=lambda name: srv.delete("batch", "jobs", "default", name),
          delete_pod=lambda name: srv.delete("", "pods", "default", name, grace=30),
          until=until, node="node-0")


@pytest.mark.testbed
def test_the_real_job_controller_selects_by_uid(testbed_kubeconfig: str) -> None:
    from dispatch import testbed

    ns = f"jobctl-{uuid.uuid4().hex[:6]}"
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
              delete_job_orphaning=lambda name: testbed.kubectl("delete", "job", name, "-n", ns,
                                                                "--cascade=orphan", "--wait=true"),
              delete_pod=lambda name: testbed.kubectl("delete", "pod", name, "-n", ns, "--wait=false"),
              until=until, node=testbed.regular_nodes()[0])
    finally:
        for p in pods():
            testbed.kubectl("annotate", "pod", p["metadata"]["name"], "-n", ns, f"{HOLD}-", check=False)
        testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)
