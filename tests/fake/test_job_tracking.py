"""A deleted pod held only by the Job controller's finalizer, its Job gone (issue 34, a campaign's two stalls).

On the testbed a campaign that restarted kube-apiserver 30 times left two pods of an earlier TrainJob deleted,
never scheduled (their node selector matched no Node then), dispatch's finalizer already freed (their end proven:
``not-scheduled``), kept 40 minutes by the Job controller's ``batch.kubernetes.io/job-tracking``: it takes that
finalizer off a pod whose Job is gone, and missed these. dispatch counted them as remaining and waited, saying only
"on no node". Here the fake's Job controller keeps the finalizer (``FakeCluster(job_tracking=True)``, held to the
real one by ``tests/contract/test_job_tracking_finalizer.py``) and misses the orphans
(``job_controller_misses_orphans``): status and the refused release name the pod, the finalizer and the patch; the
patch done, A=2 runs, and no two pods of the submission are ever there at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from dispatch import LABEL_JOB_ID, POD_FINALIZER, Adapter, JobSpec, PodsRemain, State
from dispatch import _decision as d
from dispatch import _kube as k
from dispatch.controller.testing import keeper_pass
from dispatch.errors import Forbidden
from dispatch.testing import FakeCluster

NAME = "llama-s1"
SPEC = JobSpec(job_id="llama", submission="s1", node_selector={"kubernetes.io/hostname": "node-3"})
WRITER = ("dispatch-writer", "dispatch-node-reader")
ADMIN = ("dispatch-admin", "dispatch-node-reader")
JOB_TRACKING = "batch.kubernetes.io/job-tracking"
PATCH = """--type=json -p '[{"op":"remove","path":"/metadata/finalizers"}]'"""


@pytest.fixture
def tracking() -> FakeCluster:
    c = FakeCluster(job_tracking=True)
    c.add_runtime()
    for name in ("node-0", "node-1", "node-2"):  # node-3, which the spec selects, is not there yet
        c.add_node(name)
    return c


@pytest.fixture
def writer(tracking: FakeCluster) -> Iterator[Adapter]:
    with Adapter.connect("default", transport=tracking.transport(roles=WRITER)) as a:
        a.core.settle_seconds = 0
        yield a


def pods_of_the_submission(c: FakeCluster) -> list[dict[str, Any]]:
    """Every pod of the submission in the API, whatever TrainJob made it and whether or not it is being deleted."""
    pods = [p for p in c.server.objects("", "pods") if (p["metadata"].get("labels") or {}).get(LABEL_JOB_ID) == "llama"]
    assert len(pods) <= 1, [p["metadata"]["name"] for p in pods]  # never two pods of the submission at once
    return pods


def closed_never_scheduled(c: FakeCluster, writer: Adapter) -> str:
    """A=1 admitted; its pod never scheduled (node-3 is missing), closed: the TrainJob, its JobSet and its Job go,
    the pod is deleted, and dispatch's controller frees dispatch's finalizer (its end proven: ``not-scheduled``).
    Returns the pod's name."""
    writer.open(SPEC)
    assert writer.release(NAME).admission == 1
    c.settle()
    [pod] = pods_of_the_submission(c)
    assert pod["metadata"]["finalizers"] == [POD_FINALIZER, JOB_TRACKING]
    assert not pod["spec"].get("nodeName")
    writer.close(NAME)
    c.settle()
    name = str(pod["metadata"]["name"])
    assert keeper_pass(c) == {f"default/{name}": "not-scheduled"}
    assert c.server.objects("batch", "jobs") == []
    return name


def test_a_deleted_pod_the_job_controller_missed_is_named_with_its_patch_and_the_patch_lets_a2_run(
        tracking: FakeCluster, writer: Adapter) -> None:
    c = tracking
    c.job_controller_misses_orphans = True  # kube-apiserver restarts: the orphans' finalizer stays
    held = closed_never_scheduled(c, writer)
    c.settle()
    [pod] = pods_of_the_submission(c)
    assert pod["metadata"]["name"] == held and pod["metadata"]["finalizers"] == [JOB_TRACKING]
    assert pod["metadata"].get("deletionTimestamp") and not pod["spec"].get("nodeName")

    writer.open(SPEC)
    c.settle()
    status = writer.inspect(NAME)
    assert status.state is State.HELD
    said = status.cause.detail
    assert d.FOREIGN_FINALIZER in said and JOB_TRACKING in said, said
    assert f"kubectl patch pod {held} {PATCH}" in said, said
    with pytest.raises(PodsRemain) as refused:
        writer.release(NAME)
    assert d.FOREIGN_FINALIZER in str(refused.value) and f"kubectl patch pod {held} {PATCH}" in str(refused.value)
    c.settle()
    assert [p["metadata"]["name"] for p in pods_of_the_submission(c)] == [held]  # it stays, whatever passes

    # The patch status names. dispatch's writer role may not patch pods (deploy/base/rbac.yaml); the shipped
    # admin role may, and that is what the operator uses. The fake serves JSON merge patches, not JSON patches:
    # finalizers set to null is the same write as the JSON patch's remove.
    async def patch(roles: tuple[str, ...]) -> None:
        kube = k.Kube.connect(namespace="default", transport=c.transport(roles=roles))
        try:
            await kube.merge_patch(k.PODS, held, {"metadata": {"finalizers": None}})
        finally:
            await kube.aclose()
    with pytest.raises(Forbidden, match='cannot patch resource "pods"'):
        asyncio.run(patch(WRITER))
    asyncio.run(patch(ADMIN))
    assert pods_of_the_submission(c) == []

    c.add_node("node-3")
    assert writer.release(NAME).admission == 2
    c.settle()
    [proc] = c.running_processes(NAME)
    assert proc.admission == 2 and proc.node == "node-3", proc.describe()
    assert len(pods_of_the_submission(c)) == 1
    assert writer.inspect(NAME).state is State.RUNNING
    c.history.check()


def test_the_job_controller_that_misses_nothing_frees_the_same_pod_by_itself(
        tracking: FakeCluster, writer: Adapter) -> None:
    """The same story without the miss, and with the miss healed later: the controller's next pass frees the pod,
    and A=2 is admitted with nobody's patch."""
    c = tracking
    c.job_controller_misses_orphans = True
    closed_never_scheduled(c, writer)
    c.settle()
    assert len(pods_of_the_submission(c)) == 1
    c.job_controller_misses_orphans = False
    c.job_sync()
    assert pods_of_the_submission(c) == []
    writer.open(SPEC)
    c.add_node("node-3")
    assert writer.release(NAME).admission == 2
    c.settle()
    assert [p.admission for p in c.running_processes(NAME)] == [2]
    c.history.check()


def test_a_pod_the_job_controller_counted_goes_once_dispatch_frees_it(tracking: FakeCluster, writer: Adapter) -> None:
    """Held, not closed: the Job stays, so the controller counts its deleted pod and takes its finalizer off; once
    dispatch's goes too the pod leaves the API and A=2 is admitted."""
    c = tracking
    c.job_controller_misses_orphans = True  # no orphan here: the Job exists
    writer.open(SPEC)
    assert writer.release(NAME).admission == 1
    c.settle()
    writer.hold(NAME)
    c.settle()
    [pod] = pods_of_the_submission(c)
    assert pod["metadata"].get("deletionTimestamp") and pod["metadata"]["finalizers"] == [POD_FINALIZER]
    keeper_pass(c)
    assert pods_of_the_submission(c) == []
    c.add_node("node-3")
    assert writer.release(NAME).admission == 2
    c.settle()
    assert [p.admission for p in c.running_processes(NAME)] == [2]
    c.history.check()


def test_a_running_pod_whose_finalizer_the_job_controller_took_off_stays_through_its_grace_period() -> None:
    """The controller counts a deleted pod at once, while its process still stops: the API server keeps the pod
    until its kubelet confirms the end (a grace period of 0), as the real one does, not when its last finalizer
    goes (``FakeApiServer.grace_outlasts_finalizers``)."""
    c = FakeCluster(job_tracking=True)
    c.add_node("node-0")
    c.server.create("batch", "jobs", "default", {"metadata": {"name": "j"}, "spec": {
        "parallelism": 1, "completions": 1, "completionMode": "Indexed",
        "template": {"spec": {"containers": [{"name": "c", "image": "example.invalid/train"}]}}}})
    c.settle()
    [pod] = c.server.objects("", "pods", "default")
    assert pod["metadata"]["finalizers"] == [JOB_TRACKING] and [p.pod for p in c.running_processes()] == [
        pod["metadata"]["name"]]
    c.server.delete("", "pods", "default", pod["metadata"]["name"], grace=30)
    c.job_sync()
    now = c.server.get("", "pods", "default", pod["metadata"]["name"])
    assert now is not None and not now["metadata"].get("finalizers"), now and now["metadata"]
    c.settle()  # within its 30 s: the process runs on, and so the pod stays
    assert c.server.get("", "pods", "default", pod["metadata"]["name"]) is not None
    assert any(p.pod == pod["metadata"]["name"] for p in c.running_processes())  # (its replacement runs beside it)
    c.advance(30)
    c.settle()
    assert c.server.get("", "pods", "default", pod["metadata"]["name"]) is None
    assert not any(p.pod == pod["metadata"]["name"] for p in c.running_processes())
