"""Issue 34, the final campaign's stalls in Kueue mode, on the fake: a deleted pod of an earlier TrainJob held only by
the Job controller's ``batch.kubernetes.io/job-tracking`` finalizer, its Job gone, keeps the re-opened object's
Workload waiting on dispatch's check. The check's message names the finalizer and the patch; the patch done, A=2 is
admitted and runs. The plain-mode story and the fake's Job controller: tests/fake/test_job_tracking.py. Every client
holds exactly a shipped role.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from dispatch import LABEL_JOB_ID, AsyncAdapter
from dispatch import _decision as d
from dispatch import _kube as k
from dispatch.controller.testing import FakeKueue
from dispatch.testing import FakeCluster

from .conftest import NAME, SPEC, quiet, running, until

JOB_TRACKING = "batch.kubernetes.io/job-tracking"
NOWHERE = replace(SPEC, node_selector={"kubernetes.io/hostname": "node-3"})


@pytest.fixture
def cluster() -> FakeCluster:
    """The shared fake, its Job controller keeping the job-tracking finalizer; node-3, which the spec selects, not
    there yet."""
    c = FakeCluster(job_tracking=True)
    c.add_runtime()
    for name in ("node-0", "node-1", "node-2"):
        c.add_node(name)
    return c


def submission_pods(cluster: FakeCluster) -> list[str]:
    names = [p["metadata"]["name"] for p in cluster.server.objects("", "pods")
             if (p["metadata"].get("labels") or {}).get(LABEL_JOB_ID) == "llama"]
    assert len(names) <= 1, names  # never two pods of the submission at once
    return names


async def test_a_deleted_pod_the_job_controller_missed_keeps_the_check_pending_naming_the_patch(
        adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube) -> None:
    async with running(kube):
        await adapter.open(NOWHERE)
        wl = kueue.workload_for(NAME)
        await until(lambda: kueue.entry(wl)["state"] == "Ready", what="A=1 admitted")
        kueue.sync()
        cluster.settle()
        [held] = submission_pods(cluster)

        cluster.job_controller_misses_orphans = True   # kube-apiserver restarts: the orphans' finalizer stays
        await adapter.close(NAME)
        kueue.reconcile_jobs()
        cluster.settle()
        # dispatch's controller frees its own finalizer (the pod's end is proven: never scheduled); the Job's stays
        await until(lambda: [p["metadata"].get("finalizers") for p in cluster.server.objects("", "pods")]
                    == [[JOB_TRACKING]], what="dispatch's finalizer freed")
        assert cluster.server.objects("batch", "jobs") == []

        await adapter.open(NOWHERE)
        [wl] = kueue.reconcile_jobs()
        await until(lambda: d.FOREIGN_FINALIZER in str(kueue.entry(wl).get("message")), what="the check names it")
        message = str(kueue.entry(wl)["message"])
        assert kueue.entry(wl)["state"] == "Pending" and f"kubectl patch pod {held} --type=json" in message, message
        await quiet()
        kueue.sync()
        cluster.settle()
        assert submission_pods(cluster) == [held] and cluster.running_processes(NAME) == []
        assert d.FOREIGN_FINALIZER in (await adapter.inspect(NAME)).cause.detail

        # the patch, as the shipped admin role may (the writer role may not patch pods); a merge patch here
        admin = k.Kube.connect(namespace="default", transport=cluster.transport(
            roles=("dispatch-admin", "dispatch-node-reader")))
        try:
            await admin.merge_patch(k.PODS, held, {"metadata": {"finalizers": None}})
        finally:
            await admin.aclose()
        assert submission_pods(cluster) == []
        cluster.add_node("node-3")
        await until(lambda: kueue.entry(wl)["state"] == "Ready", what="A=2 admitted")
        kueue.sync()
        cluster.settle()
    [proc] = cluster.running_processes(NAME)
    assert proc.admission == 2 and proc.node == "node-3", proc.describe()
    cluster.history.check()
