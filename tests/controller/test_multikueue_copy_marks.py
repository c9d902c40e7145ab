"""Issue 35 item 3: MultiKueue's two labels do not turn a dispatch TrainJob into a "copy" for the guard.

On the fake cluster with the shipped roles, the guard and the ``dispatch-identity`` policy installed: a user
holding the shipped ``dispatch-writer`` role adds ``kueue.x-k8s.io/multikueue-origin`` and
``kueue.x-k8s.io/prebuilt-workload-name`` to a running Kueue-mode object and suspends it; Kueue's job
reconciler then unsuspends it (its Workload is still admitted). Before the fix the guard took its copy check
(no record, no ``started`` mark, no generation rule) and the same A ran again.
"""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import AsyncAdapter, JobSpec, Refused
from dispatch import _kube as k
from dispatch import _names as n
from dispatch.controller.testing import FakeGuard, FakeKueue
from dispatch.testing import FakeCluster

from .conftest import running, until

NAME = "llama-s1"
WRITER = ("dispatch-writer", "dispatch-node-reader")
MARKS = {n.MULTIKUEUE_ORIGIN_LABEL: "multikueue", n.PREBUILT_WORKLOAD_LABEL: ""}


def trainjob(cluster: FakeCluster) -> dict[str, Any]:
    tj = cluster.server.get(n.TRAINER_GROUP, "trainjobs", "default", NAME)
    assert tj is not None
    return tj


async def _running_under_kueue(adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue,
                               kube: k.Kube) -> str:
    """A Kueue-mode object admitted by dispatch's check and started by Kueue: A=1 runs. Returns its Workload."""
    await adapter.open(JobSpec(job_id="llama", submission="s1", queue="lq-dispatch"))
    wl = kueue.workload_for(NAME)
    async with running(kube):
        await until(lambda: kueue.entry(wl)["state"] == "Ready")
    kueue.sync()
    cluster.settle()
    assert trainjob(cluster)["spec"]["suspend"] is False
    assert {p.admission for p in cluster.history.processes} == {1}
    return wl


async def test_a_writer_cannot_mark_an_object_a_multikueue_copy_so_kueue_restarts_the_same_a(
        adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube) -> None:
    """The writer's marks are refused (the guard and the CEL policy keep them as created); the writer's suspend
    goes through, and Kueue's restart of the same A is refused (the generation rule); A=1 ran once."""
    guard = FakeGuard(cluster)
    guard.install()
    wl = await _running_under_kueue(adapter, cluster, kueue, kube)
    marks = {**MARKS, n.PREBUILT_WORKLOAD_LABEL: wl}
    kubectl = k.Kube.connect(namespace="default", transport=cluster.transport(roles=WRITER))
    refused = ""
    try:
        try:
            await kubectl.merge_patch(k.TRAINJOBS, NAME, {"metadata": {"labels": marks}})
        except Refused as exc:
            refused = str(exc)
        await kubectl.merge_patch(k.TRAINJOBS, NAME, {"spec": {"suspend": True}})
    finally:
        await kubectl.aclose()
    for _ in range(3):                     # the pods end (their kubelet confirms), Kueue tries to start it again
        cluster.advance(31)
        cluster.settle()
        kueue.sync()
        cluster.settle()
    runs = {p.run for p in cluster.history.processes if p.admission == 1}
    assert len(runs) == 1, f"A=1 started {len(runs)} times (Kueue restarted it)"
    assert trainjob(cluster)["spec"]["suspend"] is True
    assert any("was not raised for this admission" in m for m in kueue.refused), kueue.refused
    assert ("MultiKueue marks kueue.x-k8s.io/multikueue-origin and kueue.x-k8s.io/prebuilt-workload-name of a "
            "dispatch TrainJob are kept") in refused, refused
    assert not set(MARKS) & set(trainjob(cluster)["metadata"].get("labels") or {})
    cluster.history.check()


async def test_a_marked_object_is_no_copy_where_dispatch_is_not_a_worker(
        adapter: AsyncAdapter, cluster: FakeCluster, kueue: FakeKueue, kube: k.Kube) -> None:
    """Marks an admin put on before the policy was installed (or a TrainJob created with them by a cluster
    admin) change nothing outside a worker: Kueue's restart after a suspend is judged as any other start, and
    refused."""
    guard = FakeGuard(cluster)
    guard.install()
    wl = await _running_under_kueue(adapter, cluster, kueue, kube)

    def mark(obj: dict[str, Any]) -> None:      # the API server's own write: no admission (as before the policy)
        obj["metadata"]["labels"].update({**MARKS, n.PREBUILT_WORKLOAD_LABEL: wl})
    cluster.server.update(n.TRAINER_GROUP, "trainjobs", "default", NAME, mark, status=None, admit=False)
    kubectl = k.Kube.connect(namespace="default", transport=cluster.transport(roles=WRITER))
    try:
        await kubectl.merge_patch(k.TRAINJOBS, NAME, {"spec": {"suspend": True}})
    finally:
        await kubectl.aclose()
    for _ in range(3):
        cluster.advance(31)
        cluster.settle()
        kueue.sync()
        cluster.settle()
    assert trainjob(cluster)["spec"]["suspend"] is True
    assert any("was not raised for this admission" in m for m in kueue.refused), kueue.refused
    cluster.history.check()


async def test_only_multikueue_creates_a_copy(cluster: FakeCluster) -> None:
    """The ``dispatch-identity`` policy: a dispatch TrainJob carrying the origin label is created only by whoever
    may ``create`` ``multikueuecopies`` (deploy/worker binds it to MultiKueue's identity); the writer may not."""
    FakeGuard(cluster, worker=True).install()
    body = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": NAME, "labels": {n.LABEL_JOB_ID: "llama", n.LABEL_SUBMISSION: "s1", **MARKS}},
            "spec": {"suspend": True, "runtimeRef": {"name": "torch-distributed"}}}
    kubectl = k.Kube.connect(namespace="default", transport=cluster.transport(roles=WRITER))
    try:
        with pytest.raises(Refused, match="only the identity MultiKueue writes this worker with creates one"):
            await kubectl.create(k.TRAINJOBS, body)
    finally:
        await kubectl.aclose()
    assert cluster.server.get(n.TRAINER_GROUP, "trainjobs", "default", NAME) is None
