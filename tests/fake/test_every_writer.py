"""The rule against every writer and every lagging layer: regression tests for what adversarial schedules
found (issue: the rule against every writer), each failing on the code before its fix."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import ANNOTATION_ADMISSION, Adapter, JobSpec, PodsRemain
from dispatch.controller.testing import FakeKueue
from dispatch.testing import FakeCluster

NS = "default"
NAME = "llama-s1"


def test_a_kueue_managed_trainjob_without_the_queue_label_is_released_through_kueue_not_unsuspended(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    """Kueue can manage a TrainJob without its queue-name label (manageJobsWithoutQueueName, or the label
    removed while suspended). Mode follows the Workload that owns it, not the label: release reactivates
    the Workload and never unsuspends the TrainJob behind Kueue's back; hold deactivates the Workload."""
    kueue = FakeKueue(cluster)
    kueue.install()
    adapter.open(JobSpec(job_id="llama", submission="s1", queue="lq-dispatch"))
    wl = kueue.workload_for(NAME)

    def strip(obj: dict[str, Any]) -> None:
        obj["metadata"]["labels"].pop("kueue.x-k8s.io/queue-name", None)

    cluster.server.update("trainer.kubeflow.org", "trainjobs", NS, NAME, strip, status=False)
    adapter.hold(NAME)
    assert kueue.workload(wl)["spec"]["active"] is False
    adapter.release(NAME)
    tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", NS, NAME)
    assert tj is not None and tj["spec"]["suspend"] is True          # only Kueue (through the check) admits
    assert tj["metadata"]["annotations"][ANNOTATION_ADMISSION] == "0"
    assert kueue.workload(wl)["spec"]["active"] is True
    assert adapter.inspect(NAME).mode == "kueue"        # status says who admits it


def test_a_child_job_that_has_not_confirmed_its_suspension_blocks_even_if_it_never_started(
    adapter: Adapter, cluster: FakeCluster
) -> None:
    """A Job with suspend: true, never started and without a Suspended condition is exactly a Job that was
    unsuspended and suspended again before the Job controller synced it: that controller may still create
    pods from its cached copy after dispatch's read. Admission waits for the Job controller's own word."""
    adapter.open(JobSpec(job_id="llama", submission="s1"))
    cluster.settle()
    jobs = cluster.server.objects("batch", "jobs", NS)
    assert jobs, "the fake JobSet created the child Jobs"
    job = jobs[0]["metadata"]["name"]

    def lagging(obj: dict[str, Any]) -> None:
        obj.setdefault("status", {})["conditions"] = [
            c for c in obj.get("status", {}).get("conditions", []) if c.get("type") != "Suspended"]

    cluster.server.update("batch", "jobs", NS, job, lagging, status=True)
    adapter.core.settle_seconds = 0.3  # the Job controller is not stepped here: it will never confirm
    with pytest.raises(PodsRemain, match=f"job {job} has not confirmed its suspension yet"):
        adapter.release(NAME)
    assert adapter.inspect(NAME).cause.detail.endswith(f"job {job} has not confirmed its suspension yet")
