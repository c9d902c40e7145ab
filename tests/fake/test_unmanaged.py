"""TrainJobs dispatch did not open (the Kubeflow SDK, kubectl, pipelines): status says so in words, `find`
can list them beside dispatch's own, and hold/release refuse naming the way to bring them under dispatch."""

from __future__ import annotations

import pytest

from dispatch import Adapter, JobSpec, Refused, State
from dispatch.testing import FakeCluster


def sdk_trainjob(cluster: FakeCluster, name: str = "uafe94fe6d9a", *, suspend: bool = False) -> None:
    """What TrainerClient().train() creates: no dispatch labels, no dispatch runtime patch."""
    cluster.server.create("trainer.kubeflow.org", "trainjobs", "default", {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name, "managedFields": [{"manager": "kubeflow-sdk", "operation": "Update"}]},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": suspend},
    })


def test_status_of_an_object_dispatch_does_not_manage_says_so(adapter: Adapter, cluster: FakeCluster) -> None:
    sdk_trainjob(cluster)
    status = adapter.inspect("uafe94fe6d9a")
    assert status.managed is False and status.created_by == "kubeflow-sdk"
    assert status.cause.reason == "NotManaged"
    assert status.cause.detail.startswith("not managed by dispatch (created by kubeflow-sdk, without dispatch's "
                                          "job-id/submission labels): it has no execution identity (no A)")


def test_find_lists_every_trainjob_only_when_asked(adapter: Adapter, cluster: FakeCluster) -> None:
    sdk_trainjob(cluster)
    adapter.open(JobSpec(job_id="llama", submission="s1"))
    assert [s.name for s in adapter.find()] == ["llama-s1"]
    every = {s.name: s.managed for s in adapter.find(unmanaged=True)}
    assert every == {"llama-s1": True, "uafe94fe6d9a": False}


@pytest.mark.parametrize("verb", ["release", "hold"])
def test_hold_and_release_refuse_naming_what_to_do(adapter: Adapter, cluster: FakeCluster, verb: str) -> None:
    sdk_trainjob(cluster, suspend=True)
    with pytest.raises(Refused) as err:
        getattr(adapter, verb)("uafe94fe6d9a")
    assert err.value.reason == "NotDispatchObject"
    assert "is not managed by dispatch (created by kubeflow-sdk" in str(err.value)
    assert adapter.inspect("uafe94fe6d9a").state is State.HELD
