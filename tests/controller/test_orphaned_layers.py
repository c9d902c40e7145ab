"""Issue 34: an earlier TrainJob's layers that the garbage collector left behind, found by the campaign.

On the real control plane (seed 20261203, k8s-1.37) a TrainJob was deleted (``close``) about a second before
a kube-apiserver restart and opened again under the same name 40 s later. The collector's informer, back after
the restart, saw that name with a new uid as an update, never learnt of the deletion, and left the old JobSet
(unsuspended, its Job re-creating pods) and Trainer's snapshot ConfigMap; Trainer refused the new TrainJob
("a snapshot configmap exists but is owned by another object") and dispatch said only "jobset ... is not
suspended yet". The fake's collector is given that fault (``FakeApiServer.miss_garbage``: only what the real
one did) and its Trainer refuses such a JobSet as the real one did. Every client holds exactly a shipped role.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dispatch import Adapter, JobSpec, PodsRemain
from dispatch import _decision as d
from dispatch.controller.testing import FakeGuard
from dispatch.testing import FakeCluster

NAME = "llama-s1"
SPEC = JobSpec(job_id="llama", submission="s1")
WRITER = ("dispatch-writer", "dispatch-node-reader")
ACTION = f"`kubectl delete jobset/{NAME} configmap/{NAME}-runtime-snapshot --ignore-not-found`"


@pytest.fixture
def writer(cluster: FakeCluster) -> Iterator[Adapter]:
    FakeGuard(cluster).install()
    with Adapter.connect("default", transport=cluster.transport(roles=WRITER)) as a:
        a.core.settle_seconds = 0
        yield a


def reopened_behind_an_orphan(writer: Adapter, cluster: FakeCluster) -> str:
    """Running as A=1, closed while the collector misses the deletion, opened again under the same name;
    returns the old JobSet's owner uid."""
    writer.open(SPEC)
    assert writer.release(NAME).admission == 1
    cluster.settle()
    assert cluster.running_processes(NAME)
    js = cluster.server.get("jobset.x-k8s.io", "jobsets", "default", NAME)
    assert js is not None
    old_uid = str(js["metadata"]["ownerReferences"][0]["uid"])
    cluster.server.gc_lag = True
    writer.close(NAME)
    assert cluster.server.miss_garbage() >= 1
    writer.open(SPEC)
    cluster.settle()
    js = cluster.server.get("jobset.x-k8s.io", "jobsets", "default", NAME)
    assert js is not None and js["metadata"]["ownerReferences"][0]["uid"] == old_uid, "Trainer left it alone"
    assert not js["spec"].get("suspend")
    return old_uid


def test_a_jobset_of_a_deleted_trainjob_of_the_same_name_names_the_delete_that_ends_the_wait(
        writer: Adapter, cluster: FakeCluster, keeper: Callable[[], dict[str, str]]) -> None:
    """On the code before, the release said only "jobset llama-s1 is not suspended yet", which nothing ends."""
    old_uid = reopened_behind_an_orphan(writer, cluster)
    with pytest.raises(PodsRemain) as refused:
        writer.release(NAME)
    text = str(refused.value)
    assert f"jobset {NAME} {d.ORPHANED} of this name (uid {old_uid})" in text, text
    assert "TrainJobResourcesCreationFailed" in text and ACTION in text, text
    assert "not suspended and could still start pods" in text, text
    status = writer.inspect(NAME)
    said = " ".join([status.cause.detail if status.cause else "", *status.warnings])
    assert f"jobset {NAME} {d.ORPHANED}" in said and ACTION in said, said
    ceased = writer.ceased(NAME)
    assert not ceased.ceased and f"jobset {NAME} {d.ORPHANED}" in ceased.reason, ceased.reason
    cluster.history.check()
    # the action named: the operator deletes the old JobSet and snapshot (the collector follows as usual)
    cluster.server.gc_lag = False
    cluster.server.delete("jobset.x-k8s.io", "jobsets", "default", NAME)
    cluster.server.delete("", "configmaps", "default", f"{NAME}-runtime-snapshot")
    for _ in range(6):
        cluster.advance(60)
        cluster.settle()
        keeper()
    assert writer.release(NAME).admission == 2
    cluster.settle()
    procs = cluster.running_processes(NAME)
    assert procs and all(p.admission == 2 for p in procs), [p.describe() for p in procs]
    cluster.history.check()


def test_a_suspended_jobset_of_a_deleted_trainjob_is_named_in_status_though_it_blocks_nothing(
        writer: Adapter, cluster: FakeCluster) -> None:
    """Held before the close, the old JobSet is suspended: the rule has nothing to wait for, yet Trainer builds
    nothing for the new TrainJob; status names the orphan and the delete (on the code before, it said nothing)."""
    writer.open(SPEC)
    assert writer.release(NAME).admission == 1
    cluster.settle()
    writer.hold(NAME)
    cluster.settle()
    cluster.server.gc_lag = True
    writer.close(NAME)
    cluster.server.miss_garbage()
    writer.open(SPEC)
    cluster.settle()
    status = writer.inspect(NAME)
    said = " ".join([status.cause.detail if status.cause else "", *status.warnings])
    assert f"jobset {NAME} {d.ORPHANED}" in said and "is suspended" in said and ACTION in said, said


async def test_the_admission_check_names_an_earlier_trainjobs_jobset_and_the_delete_then_admits(
        cluster: FakeCluster, kueue: Any, kube: Any, adapter: Any) -> None:
    """Kueue mode, as the campaign met it: the controller's check said only "jobset k1-s1 is not suspended yet"
    for five minutes. Now its message and its Event name the earlier owner, Trainer's refusal and the delete;
    once the operator deletes the JobSet the check goes Ready and the submission runs as A=2."""
    from dispatch._trainer import labels_entry
    from dispatch.controller.testing import KUEUE_MANAGER

    from .conftest import SPEC as QUEUED
    from .conftest import running, until

    async with running(kube):
        await adapter.open(QUEUED)
        wl = kueue.workload_for(NAME)
        await until(lambda: kueue.entry(wl)["state"] == "Ready", what="first admission")
        kueue.sync()
        cluster.settle()
        assert cluster.running_processes(NAME)
        cluster.server.gc_lag = True
        await adapter.close(NAME)
        assert cluster.server.miss_garbage() >= 1
        kueue.reconcile_jobs()  # Kueue removes the old Workload itself (seen: "Deleted not matching Workload")
        await adapter.open(QUEUED)

        def kueues_webhook(obj: dict[str, Any]) -> None:
            # Kueue's mutating webhook adds its entry within the create (FakeKueue.workload_for adds it with an
            # update, which Trainer's webhook would refuse while the old JobSet of the name has an active job)
            obj["spec"].setdefault("runtimePatches", []).append(labels_entry(KUEUE_MANAGER, {}))
        cluster.server.update("trainer.kubeflow.org", "trainjobs", "default", NAME, kueues_webhook, status=False,
                              admit=False)
        wl = kueue.workload_for(NAME)
        cluster.settle()
        await until(lambda: d.ORPHANED in kueue.entry(wl)["message"], what="the orphan named")
        message = kueue.entry(wl)["message"]
        assert kueue.entry(wl)["state"] == "Pending"
        assert "TrainJobResourcesCreationFailed" in message and ACTION in message, message
        # the controller posts its Event after it wrote the message (one write after the other)
        await until(lambda: any(d.ORPHANED in e["message"] for e in cluster.server.objects("", "events")
                                if e.get("reason") == "AdmissionDelayed"), what="the AdmissionDelayed Event")
        cluster.history.check()
        cluster.server.gc_lag = False
        cluster.server.delete("jobset.x-k8s.io", "jobsets", "default", NAME)
        cluster.server.delete("", "configmaps", "default", f"{NAME}-runtime-snapshot")
        for _ in range(6):
            cluster.advance(60)
            cluster.settle()
        await until(lambda: kueue.entry(wl)["state"] == "Ready", what="admission after the delete")
        kueue.sync()
        cluster.settle()
        procs = cluster.running_processes(NAME)
        assert procs and all(p.admission == 2 for p in procs), [p.describe() for p in procs]
    cluster.history.check()
