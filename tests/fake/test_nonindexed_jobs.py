"""Issue 35 item 6: a NonIndexed Job with parallelism above 1 (JobSet allows one when a runtime says
``completionMode: NonIndexed``). Its pods carry no completion index, so the pod guard cannot tell a second pod of
the Job (made while active < parallelism) from a replacement of one that may still run (made once that pod is
deleting or failed), and refused every sibling while the first ran, while status said only "execution 1 admitted".
dispatch does not run such a Job: ``open`` refuses the runtime naming the replicatedJob and the fields, a start
over Jobs built NonIndexed (the runtime edited after ``open``) is refused by the admission and by the guard, and
the pod guard's refusal of such a pod says why."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch import Adapter, InvalidInput, JobSpec, Refused
from dispatch.controller.testing import FakeGuard
from dispatch.testing import FakeCluster

NAME = "llama-s1"
TRAINER = "trainer.kubeflow.org"
FIELDS = "replicatedJob node (completionMode: NonIndexed, parallelism 2)"


def nonindexed(obj: dict[str, Any]) -> None:
    for rj in obj["spec"]["template"]["spec"]["replicatedJobs"]:
        rj["template"]["spec"]["completionMode"] = "NonIndexed"


def test_open_refuses_a_runtime_whose_job_is_nonindexed_and_parallel(adapter: Adapter, cluster: FakeCluster) -> None:
    cluster.add_runtime("torch-bag", completion_mode="NonIndexed")
    with pytest.raises(InvalidInput) as refused:
        adapter.open(JobSpec(job_id="llama", submission="s1", num_nodes=2, runtime="torch-bag"))
    assert f"ClusterTrainingRuntime torch-bag: {FIELDS}" in str(refused.value), refused.value
    assert "set completionMode: Indexed" in str(refused.value)
    assert cluster.server.get(TRAINER, "trainjobs", "default", NAME) is None
    adapter.open(JobSpec(job_id="llama", submission="s1", num_nodes=1, runtime="torch-bag"))  # one pod: fine


def test_a_start_over_jobs_built_nonindexed_is_refused_and_says_why(adapter: Adapter, cluster: FakeCluster) -> None:
    """The runtime is edited to NonIndexed after ``open``, before Trainer builds the JobSet: ``release`` is refused
    naming the replicatedJob (no A is issued), and so is a bare unsuspend, by the guard; before the fix one pod ran
    and its sibling was refused for as long as it ran, with status saying only "execution 1 admitted"."""
    guard = FakeGuard(cluster)
    guard.install()
    adapter.open(JobSpec(job_id="llama", submission="s1", num_nodes=2))
    cluster.server.update(TRAINER, "clustertrainingruntimes", "", "torch-distributed", nonindexed, status=None)
    cluster.settle()                                    # Trainer builds the JobSet, JobSet the NonIndexed Job
    with pytest.raises(Refused) as refused:
        adapter.release(NAME)
    assert f"trainjob {NAME} cannot start: {FIELDS}" in str(refused.value), refused.value
    cluster.settle()
    assert cluster.pods(NAME) == [] and cluster.refused_pods == []
    status = adapter.inspect(NAME)
    assert any(f"trainjob {NAME} cannot start: {FIELDS}" in w for w in status.warnings), status.warnings
    tj = cluster.server.get(TRAINER, "trainjobs", "default", NAME)
    assert tj is not None
    denial = guard.decision("UPDATE", tj, {**tj, "spec": {**tj["spec"], "suspend": False}})
    assert denial is not None and f"{FIELDS}" in denial, denial
