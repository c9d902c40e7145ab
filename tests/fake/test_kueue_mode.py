"""Kueue mode through the adapter: status names dispatch's admission check; hold/release flip Workload.active."""

from __future__ import annotations

from typing import Any

from dispatch import CONTROLLER_NAME, Adapter, JobSpec, State
from dispatch.testing import FakeCluster

KUEUE = "kueue.x-k8s.io"


def queued(adapter: Adapter, cluster: FakeCluster, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """Open in Kueue mode and play Kueue: a Workload owned by the TrainJob, with the given checks."""
    for name, controller in (("dispatch", CONTROLLER_NAME), ("other", "example.com/other")):
        if cluster.server.get(KUEUE, "admissionchecks", "", name) is None:
            cluster.server.create(KUEUE, "admissionchecks", "", {
                "metadata": {"name": name}, "spec": {"controllerName": controller}})
    adapter.open(JobSpec(job_id="q", submission="s1", queue="lq"))
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", "q-s1")
    assert tj is not None
    wl = cluster.server.create(KUEUE, "workloads", "default", {
        "metadata": {"name": "trainjob-q-s1-abcde", "labels": {"kueue.x-k8s.io/job-uid": tj["metadata"]["uid"]},
                     "ownerReferences": [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                          "name": "q-s1", "uid": tj["metadata"]["uid"], "controller": True}]},
        "spec": {"queueName": "lq", "active": True},
    })
    cluster.server.update(KUEUE, "workloads", "default", wl["metadata"]["name"],
                          lambda o: o.setdefault("status", {}).update(admissionChecks=checks), status=True)
    return wl


def test_inspect_shows_dispatch_admission_check_and_its_message(adapter: Adapter, cluster: FakeCluster) -> None:
    msg = "waiting for pods of the previous execution to go: q-s1-node-0-0-1 on node-3"
    queued(adapter, cluster, [
        {"name": "other", "state": "Pending", "message": "someone else's",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"name": "dispatch", "state": "Pending", "message": msg, "lastTransitionTime": "2026-01-01T00:00:00Z"},
    ])
    status = adapter.inspect("q-s1")
    assert status.state is State.QUEUED and status.mode == "kueue" and status.queue == "lq"
    assert status.cause.reason == "AdmissionCheckPending"
    assert status.cause.detail == f"admission check dispatch Pending: {msg}"
    found = adapter.find(job_id="q")
    assert found[0].cause == status.cause


def test_hold_and_release_in_kueue_mode_flip_the_workload_active_flag(adapter: Adapter, cluster: FakeCluster) -> None:
    wl = queued(adapter, cluster, [])
    name = wl["metadata"]["name"]
    adapter.hold("q-s1")
    stored = cluster.server.get(KUEUE, "workloads", "default", name)
    assert stored is not None and stored["spec"]["active"] is False
    assert "workload deactivated (held)" in adapter.inspect("q-s1").cause.detail
    adapter.release("q-s1")
    stored = cluster.server.get(KUEUE, "workloads", "default", name)
    assert stored is not None and stored["spec"]["active"] is True
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", "q-s1")
    assert tj is not None and tj["spec"]["suspend"] is True  # Kueue, not release, unsuspends in Kueue mode
