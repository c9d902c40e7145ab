"""The decision's API cost follows the object's pods, not the namespace (counted, not timed).

(``bench/release_decision.py`` measures the same with times; this test stays independent of it.)
"""

from __future__ import annotations

import asyncio

from dispatch import AsyncAdapter, JobSpec, PodsRemain
from dispatch.testing import FakeCluster

NAME = "llama-s1"
WRITER = ("dispatch-writer", "dispatch-node-reader")  # the shipped roles a user of the library holds


def crowded(unrelated: int) -> FakeCluster:
    """A namespace with ``unrelated`` pods of other JobSets beside the one object under test."""
    cluster = FakeCluster()
    cluster.add_runtime()
    cluster.add_node("node-0")
    for i in range(unrelated):
        cluster.server.create("", "pods", "default", {
            "metadata": {"name": f"other-{i:05d}", "labels": {
                "jobset.sigs.k8s.io/jobset-name": f"other-{i % 500}", "app": "unrelated"}},
            "spec": {"nodeName": "node-0", "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running"}})
    return cluster


async def refused_release_cost(cluster: FakeCluster) -> tuple[int, int]:
    """(requests, bytes received) of one release refused because the object's pod still terminates."""
    adapter = AsyncAdapter.connect("default", transport=cluster.transport(roles=WRITER))
    try:
        await adapter.open(JobSpec(job_id="llama", submission="s1"))
        await adapter.release(NAME)
        cluster.settle()
        await adapter.hold(NAME)
        cluster.settle()  # the pod is now Terminating: the decision reads it and refuses
        kube = adapter.kube
        r0, b0 = kube.requests, kube.bytes_received
        try:
            await adapter.release(NAME)
            raise AssertionError("release admitted while the pod terminates")
        except PodsRemain:
            pass
        return kube.requests - r0, kube.bytes_received - b0
    finally:
        await adapter.aclose()


def test_decision_requests_and_bytes_do_not_grow_with_unrelated_pods() -> None:
    empty = asyncio.run(refused_release_cost(crowded(0)))
    busy = asyncio.run(refused_release_cost(crowded(2000)))
    assert busy[0] == empty[0]
    assert busy[1] <= 1.05 * empty[1]
