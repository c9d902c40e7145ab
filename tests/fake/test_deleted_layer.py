"""A running object's child Job or JobSet deleted by someone other than dispatch (Kubernetes' ``edit`` role may
delete Jobs; dispatch's roles may not): the real JobSet controller re-creates a missing child Job at once
(``reconcileReplicatedJobs`` creates every Job of the template not among the ones it owns), the real Trainer a
missing JobSet (its JobSet plugin builds one whenever none exists), and the real garbage collector deletes the
old pods gracefully. On the testbed the new pod ran, with the same A, 0.3 s after the delete, while the old one
stayed Running with a deletionTimestamp for its whole grace period (``tests/testbed/test_deleted_layer_testbed.py``).

dispatch's guard judges the pod's create (``_decision.pod_start_problem``): the re-created Job's pod is refused
while the old pod of its rank may still run, and created by the Job controller's next try once the old pod's
end is proven; it then runs with the same A. Nobody acts in between."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dispatch import LABEL_ADMISSION, Adapter, JobSpec
from dispatch.controller.testing import FakeGuard
from dispatch.testing import FakeCluster

NAME = "llama-s1"
JOBSET = "jobset.x-k8s.io"
GRACE = 30
"""The pods' grace period (the API's default terminationGracePeriodSeconds)."""


@pytest.fixture
def guard(cluster: FakeCluster) -> FakeGuard:
    installed = FakeGuard(cluster)
    installed.install()
    return installed


def running(adapter: Adapter, cluster: FakeCluster) -> str:
    """Open, release and settle: one pod of A=1 Running. Returns its name."""
    adapter.open(JobSpec(job_id="llama", submission="s1"))
    adapter.release(NAME)
    cluster.settle()
    pods = cluster.pods(NAME)
    assert len(pods) == 1 and pods[0]["status"]["phase"] == "Running", [p["metadata"]["name"] for p in pods]
    return str(pods[0]["metadata"]["name"])


def refused_until_proven(adapter: Adapter, cluster: FakeCluster, guard: FakeGuard,
                         keeper: Callable[[], dict[str, str]], old: str) -> None:
    """Within the old pod's grace period no new pod is created (each try refused, naming the old pod); once its
    kubelet confirmed its end, the next try creates the rank again, with the same A, and it runs."""
    cluster.settle()  # the grace period is not over: the old pod stays Running with a deletionTimestamp
    pods = {p["metadata"]["name"]: p for p in cluster.pods(NAME)}
    assert list(pods) == [old] and pods[old]["metadata"].get("deletionTimestamp"), sorted(pods)
    assert cluster.refused_pods, "the re-created Job's pod was never tried"
    denial = guard.pod_denied[-1]
    assert (f"cannot start while a pod of the same rank of the same execution may still run: remaining pods: {old} "
            f"on {pods[old]['spec']['nodeName']} (Ready=True)") in denial, denial
    # status says why the rank does not run, not only the Job's FailedCreate Event
    status = adapter.inspect(NAME)
    assert status.cause is not None and status.cause.detail == (
        f"execution 1 admitted; a rank of execution 1 waits to start again while the pod before may still run "
        f"(remaining pods: {old} on {pods[old]['spec']['nodeName']} (Ready=True)): the guard refuses a rank's "
        "new pod until that pod's end is proven"), status.cause
    # find (`dispatch list`) says the same, from one pod list for every running object
    [found] = adapter.find(job_id="llama")
    assert found.cause == status.cause, found.cause
    # and ceased, whose caller acts on its reason
    assert adapter.ceased(NAME).reason == f"{NAME} is admitted and running; " + status.cause.detail.split("; ", 1)[1]

    cluster.advance(GRACE + 1)
    cluster.settle()   # its kubelet confirms the end; the Job controller's next try is allowed
    keeper()           # dispatch's controller releases the old pod's finalizer
    cluster.settle()
    pods = {p["metadata"]["name"]: p for p in cluster.pods(NAME)}
    assert old not in pods, sorted(pods)
    assert len(pods) == 1, sorted(pods)
    (new,) = pods.values()
    assert new["status"]["phase"] == "Running" and new["metadata"]["labels"][LABEL_ADMISSION] == "1"
    status = adapter.inspect(NAME)
    assert status.cause is not None and status.cause.detail == "execution 1 admitted", status.cause
    assert adapter.find(job_id="llama")[0].cause == status.cause
    cluster.history.check()  # no two executions of the submission at once, ever


def test_a_deleted_child_job_starts_its_rank_again_only_once_the_old_pod_has_ended(
        adapter: Adapter, cluster: FakeCluster, guard: FakeGuard, keeper: Callable[[], dict[str, str]]) -> None:
    old = running(adapter, cluster)
    cluster.server.delete("batch", "jobs", "default", f"{NAME}-node-0")  # kubectl delete job (background)
    refused_until_proven(adapter, cluster, guard, keeper, old)


def test_a_deleted_jobset_starts_its_ranks_again_only_once_the_old_pod_has_ended(
        adapter: Adapter, cluster: FakeCluster, guard: FakeGuard, keeper: Callable[[], dict[str, str]]) -> None:
    old = running(adapter, cluster)
    cluster.server.delete(JOBSET, "jobsets", "default", NAME)  # kubectl delete jobset (background)
    refused_until_proven(adapter, cluster, guard, keeper, old)


def test_the_ranks_of_one_execution_start_side_by_side(adapter: Adapter, cluster: FakeCluster,
                                                       guard: FakeGuard) -> None:
    """The guard on pod creates refuses no rank of a fresh execution because of its sibling ranks."""
    adapter.open(JobSpec(job_id="llama", submission="s1", num_nodes=3))
    adapter.release(NAME)
    cluster.settle()
    assert [p["status"]["phase"] for p in cluster.pods(NAME)] == ["Running"] * 3
    assert not cluster.refused_pods and not guard.pod_denied and not guard.denied
