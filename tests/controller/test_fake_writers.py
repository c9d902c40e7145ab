"""The writers the every-writer machine adds to the fake cluster, each shown doing what the real one does:
dispatch's guard refusing a bypassing unsuspend, Kueue's job reconciler under ``manageJobsWithoutQueueName``,
Kueue evicting a deactivated Workload, and Kueue retrying a start the API server refused."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import AsyncAdapter, JobSpec, Refused, Unreachable
from dispatch import _kube as k
from dispatch import _names as n
from dispatch.controller.testing import FakeGuard, FakeKueue
from dispatch.testing import FakeCluster

from .conftest import running, until

NAME = "llama-s1"


def trainjob(cluster: FakeCluster) -> dict[str, Any]:
    tj = cluster.server.get(n.TRAINER_GROUP, "trainjobs", "default", NAME)
    assert tj is not None
    return tj


async def test_the_guard_refuses_a_bare_unsuspend_while_a_pod_may_run_and_names_it(
    adapter: AsyncAdapter, cluster: FakeCluster
) -> None:
    """``kubectl patch trainjob --type=merge -p '{"spec":{"suspend":false}}'`` by a user holding the shipped
    writer role, on a held object whose pod is still Terminating: the API server refuses it with the guard's
    reason, and nothing starts."""
    guard = FakeGuard(cluster)
    guard.install()
    await adapter.open(JobSpec(job_id="llama", submission="s1"))
    await adapter.release(NAME)
    cluster.settle()
    pod = cluster.pods(NAME)[0]["metadata"]["name"]
    await adapter.hold(NAME)
    cluster.settle()                                     # the grace period is not over: Terminating
    kubectl = k.Kube.connect(namespace="default", transport=cluster.transport(
        roles=("dispatch-writer", "dispatch-node-reader")))
    try:
        with pytest.raises(Refused, match=f"trainjob {NAME} cannot start: remaining pods: {pod}"):
            await kubectl.merge_patch(k.TRAINJOBS, NAME, {"spec": {"suspend": False}})
    finally:
        await kubectl.aclose()
    assert trainjob(cluster)["spec"]["suspend"] is True
    assert len(guard.denied) == 1 and guard.unenforced == []
    cluster.advance(31)
    cluster.settle()
    await adapter.release(NAME)                          # dispatch's own start passes the guard once none remain
    assert guard.allowed_starts >= 1 and trainjob(cluster)["spec"]["suspend"] is False
    cluster.history.check()


async def test_kueue_without_queue_names_takes_a_plain_object_and_release_then_goes_through_kueue(
    adapter: AsyncAdapter, cluster: FakeCluster, kube: k.Kube
) -> None:
    """Under ``manageJobsWithoutQueueName`` Kueue makes a Workload for a TrainJob without the queue-name label,
    suspending it if it runs; dispatch then admits it only through that Workload and its check."""
    kueue = FakeKueue(cluster, manage_jobs_without_queue_name=True)
    kueue.install()
    await adapter.open(JobSpec(job_id="llama", submission="s1"), hold=False)   # plain: started at once
    cluster.settle()
    assert trainjob(cluster)["spec"]["suspend"] is False
    assert kueue.reconcile_jobs() == []                  # Kueue stops what it did not admit; its webhook's
    assert trainjob(cluster)["spec"]["suspend"] is True  # entry waits until the JobSet reports no active Job
    cluster.settle()
    [wl] = kueue.reconcile_jobs()
    assert (await adapter.inspect(NAME)).mode == "kueue"
    cluster.advance(31)
    cluster.settle()
    await adapter.release(NAME)
    assert trainjob(cluster)["spec"]["suspend"] is True   # only Kueue starts it now
    async with running(kube):
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
    kueue.sync()
    cluster.settle()
    assert trainjob(cluster)["spec"]["suspend"] is False
    assert {p.admission for p in cluster.history.processes} == {1, 2}
    cluster.history.check()


async def test_a_deactivated_admitted_workload_is_evicted_and_its_trainjob_suspended(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    await adapter.open(JobSpec(job_id="llama", submission="s1", queue="lq-dispatch"))
    wl = kueue.workload_for(NAME)
    async with running(kube):
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
    kueue.sync()
    assert trainjob(cluster)["spec"]["suspend"] is False
    await adapter.hold(NAME)                             # Kueue mode: deactivates the Workload
    kueue.sync()
    assert trainjob(cluster)["spec"]["suspend"] is True
    assert any(c["type"] == "Evicted" and c["status"] == "True" and c["reason"] == "InactiveWorkload"
               for c in kueue.workload(wl)["status"]["conditions"])


async def test_kueue_admits_before_it_starts_the_trainjob_and_retries_a_refused_start(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    """Kueue's workload controller writes Admitted, then its job reconciler starts the job (so the guard sees
    an admitted Workload); a start the API server refuses is made again on a later pass."""
    refuse = {"on": True}
    cluster.server.add_admission("trainjobs", lambda op, old, new: "not now" if refuse["on"] and old is not None
                                 and old["spec"].get("suspend") and not new["spec"].get("suspend") else None)
    await adapter.open(JobSpec(job_id="llama", submission="s1", queue="lq-dispatch"))
    wl = kueue.workload_for(NAME)
    async with running(kube):
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
    kueue.sync()
    assert any(c["type"] == "Admitted" and c["status"] == "True" for c in kueue.workload(wl)["status"]["conditions"])
    assert trainjob(cluster)["spec"]["suspend"] is True
    assert kueue.refused and "not now" in kueue.refused[0]
    refuse["on"] = False
    kueue.sync()
    assert trainjob(cluster)["spec"]["suspend"] is False


async def test_a_close_whose_record_reply_was_lost_leaves_a_ready_check_that_the_guard_refuses_to_start(
    adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube
) -> None:
    """Found by the every-writer machine (no overlap, a stall and a confusing reason). The check is Ready with
    A=1 raised but not started; ``close`` releases the submission's claim in its record, the reply is lost,
    and the TrainJob stays. Kueue then admits on the Ready it still holds: the guard refuses the start (the
    record no longer names the TrainJob), and nothing runs; a retried ``close`` finishes."""
    guard = FakeGuard(cluster)
    guard.install()
    await adapter.open(JobSpec(job_id="llama", submission="s1", queue="lq-dispatch"))
    wl = kueue.workload_for(NAME)
    async with running(kube):
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
    cluster.server.inject(method="PATCH", path=r"/submissionrecords", status="timeout", after=True)
    with pytest.raises(Unreachable, match="timed out"):
        await adapter.close(NAME)
    record = cluster.server.objects(n.DOMAIN, "submissionrecords", "default")[0]["spec"]
    assert record["admission"] == 1 and record["trainJob"] == {"name": "", "uid": ""}
    kueue.sync()
    assert trainjob(cluster)["spec"]["suspend"] is True
    assert guard.denied and guard.denied[0].endswith(
        "names no TrainJob: its submission was released (a `dispatch close` was begun), so nothing of it "
        "starts; `dispatch close` again finishes the close")
    assert cluster.history.processes == []
    await adapter.close(NAME)
    assert cluster.server.get(n.TRAINER_GROUP, "trainjobs", "default", NAME) is None
