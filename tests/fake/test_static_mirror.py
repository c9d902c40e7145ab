"""A static pod's mirror carrying dispatch's labels (issue 34, question 2c). A kubelet runs a static pod from
its file whatever the API says (its file source feeds the pod workers directly; the mirror is only the API's
copy), so a webhook that refuses the mirror's create hides the process, never stops it
(``tests/testbed/test_real_node_questions.py`` watches it on the real node). So
dispatch's guard admits every mirror, whatever else of the submission runs, and the rule counts it among the
object's pods: the next release is refused while it may run."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dispatch import LABEL_ADMISSION, LABEL_JOB_ID, LABEL_SUBMISSION, POD_FINALIZER, Adapter, JobSpec, PodsRemain
from dispatch.controller.testing import FakeGuard
from dispatch.testing import FakeCluster

NAME = "llama-s1"


@pytest.fixture
def guard(cluster: FakeCluster) -> FakeGuard:
    installed = FakeGuard(cluster)
    installed.install()
    return installed


def mirror(node: str, *, finalizer: bool) -> dict[str, object]:
    """What a kubelet creates for a static pod (its file's pod, bound to it, with the mirror annotation)."""
    return {"metadata": {"name": f"static-{node}", "namespace": "default",
                         "labels": {LABEL_JOB_ID: "llama", LABEL_SUBMISSION: "s1", LABEL_ADMISSION: "1"},
                         "annotations": {"kubernetes.io/config.mirror": "5d2c1b0a"},
                         "finalizers": [POD_FINALIZER] if finalizer else []},
            "spec": {"nodeName": node, "restartPolicy": "Always",
                     "containers": [{"name": "static", "image": "example.invalid/static"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "static", "state": {"running": {}}}]}}


@pytest.mark.parametrize("finalizer", [True, False])
def test_a_static_pods_mirror_beside_a_running_execution_is_admitted_and_holds_the_next_release(
        adapter: Adapter, cluster: FakeCluster, guard: FakeGuard, keeper: Callable[[], dict[str, str]],
        finalizer: bool) -> None:
    adapter.open(JobSpec(job_id="llama", submission="s1"))
    adapter.release(NAME)
    cluster.settle()
    [own] = cluster.pods(NAME)
    node = own["spec"]["nodeName"]
    cluster.server.create("", "pods", "default", mirror(node, finalizer=finalizer))
    assert guard.pod_denied == []
    adapter.hold(NAME)
    cluster.settle()  # JobSet's suspension deletes A=1's pod
    cluster.advance(60)
    cluster.settle()
    keeper()
    cluster.settle()
    assert [p["metadata"]["name"] for p in cluster.server.objects("", "pods", "default")] == [f"static-{node}"]
    with pytest.raises(PodsRemain) as refused:
        adapter.release(NAME)
    assert f"static-{node}" in str(refused.value)
