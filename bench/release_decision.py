"""Cost of one release decision with 0 and with 10,000 unrelated pods in the namespace.

The rule's read is selected by label on the API server, so its cost should follow the object's own pods,
not the namespace. Measured on the in-process fake: requests, bytes received and wall time (median of
runs), each reported as the ratio of the crowded namespace to the empty one, beside the same ratios for a
naive decision that lists the whole namespace (the baseline, measured in the same run).

It also counts one admitting release's sequential round trips: every request is delayed by the same time on
the fake's transport, and a request sent while no other is in flight starts a round (requests sent together
share one), on a Trainer that takes A raised and the execution started in one write and on one before v2.2.1.

Run: python -m bench.release_decision [--unrelated 10000] [--runs 15]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from dataclasses import dataclass

import httpx2

from dispatch import AsyncAdapter, JobSpec, PodsRemain
from dispatch import _kube as k
from dispatch.testing import FakeCluster

NAME = "llama-s1"


@dataclass
class Cost:
    requests: float
    bytes: float
    seconds: float


class Rounds(httpx2.AsyncBaseTransport):
    """The fake's transport with a fixed delay on every request, counting sequential rounds while ``counting``."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, delay: float = 0.002) -> None:
        self.inner, self.delay = inner, delay
        self.in_flight = self.rounds = 0
        self.counting = False

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if self.counting and self.in_flight == 0:
            self.rounds += 1
        self.in_flight += 1
        try:
            await asyncio.sleep(self.delay)
            return await self.inner.handle_async_request(request)
        finally:
            self.in_flight -= 1


async def admitting_rounds(*, trainer_before_2_2_1: bool = False) -> tuple[int, int]:
    """(requests, sequential rounds) of an admitting release: the adapter's second (the first learned what the
    cluster's Trainer takes), after the first execution's pods are gone."""
    cluster = FakeCluster()
    cluster.trainer_before_2_2_1 = trainer_before_2_2_1
    cluster.add_runtime()
    cluster.add_node("node-0")
    transport = Rounds(cluster.transport(roles=("dispatch-writer", "dispatch-node-reader")))
    adapter = AsyncAdapter.connect("default", transport=transport)
    try:
        await adapter.open(JobSpec(job_id="llama", submission="s1"))
        await adapter.release(NAME)
        cluster.settle()
        await adapter.hold(NAME)
        cluster.settle()
        cluster.advance(120)
        cluster.settle(honour_grace=False)
        before = adapter.kube.requests
        transport.counting = True
        await adapter.release(NAME)
        transport.counting = False
        return adapter.kube.requests - before, transport.rounds
    finally:
        await adapter.aclose()


def crowded_cluster(unrelated: int) -> FakeCluster:
    cluster = FakeCluster()
    cluster.add_runtime()
    cluster.add_node("node-0")
    for i in range(unrelated):
        cluster.server.create("", "pods", "default", {
            "metadata": {"name": f"other-{i:05d}", "labels": {
                "jobset.sigs.k8s.io/jobset-name": f"other-{i % 500}", "app": "unrelated"}},
            "spec": {"nodeName": "node-0", "containers": [{"name": "c", "image": "x"}]},
            "status": {"phase": "Running"},
        })
    return cluster


async def held_with_pod(cluster: FakeCluster) -> AsyncAdapter:
    adapter = AsyncAdapter.connect("default", transport=cluster.transport())
    await adapter.open(JobSpec(job_id="llama", submission="s1"))
    await adapter.release(NAME)
    cluster.settle()
    await adapter.hold(NAME)
    cluster.settle()  # the pod is now Terminating: every decision reads it and refuses
    return adapter


async def measure(adapter: AsyncAdapter, runs: int, naive: bool) -> Cost:
    kube = adapter.kube
    reqs, sizes, times = [], [], []
    for _ in range(runs):
        r0, b0 = kube.requests, kube.bytes_received
        t0 = time.perf_counter()
        if naive:
            await kube.get(k.TRAINJOBS, NAME)
            await kube.list(k.PODS)  # the whole namespace, filtered client-side
        else:
            try:
                await adapter.release(NAME)
            except PodsRemain:
                pass
        times.append(time.perf_counter() - t0)
        reqs.append(kube.requests - r0)
        sizes.append(kube.bytes_received - b0)
    return Cost(statistics.median(reqs), statistics.median(sizes), statistics.median(times))


async def main_async(unrelated: int, runs: int) -> dict[str, Cost]:
    out: dict[str, Cost] = {}
    for label, count in (("empty", 0), ("crowded", unrelated)):
        cluster = crowded_cluster(count)
        adapter = await held_with_pod(cluster)
        gc.collect()
        gc.freeze()  # the fake's stored objects are long-lived: keep the collector from rescanning them
        await measure(adapter, 2, naive=False)  # warm up
        out[f"rule/{label}"] = await measure(adapter, runs, naive=False)
        out[f"naive/{label}"] = await measure(adapter, runs, naive=True)
        await adapter.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unrelated", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    costs = asyncio.run(main_async(args.unrelated, args.runs))
    print(f"one release decision, 0 vs {args.unrelated} unrelated pods (median of {args.runs} runs)")
    print(f"{'':18}{'requests':>10}{'bytes':>12}{'ms':>10}")
    for key, cost in costs.items():
        print(f"{key:18}{cost.requests:>10.0f}{cost.bytes:>12.0f}{cost.seconds * 1000:>10.2f}")
    for kind in ("rule", "naive"):
        empty, crowded = costs[f"{kind}/empty"], costs[f"{kind}/crowded"]
        print(f"ratio {kind:5} crowded/empty: requests {crowded.requests / empty.requests:.2f}  "
              f"bytes {crowded.bytes / empty.bytes:.2f}  time {crowded.seconds / empty.seconds:.2f}")
    worst = max(getattr(costs["rule/crowded"], f) / getattr(costs["rule/empty"], f)
                for f in ("requests", "bytes", "seconds"))
    print(f"target: every rule ratio <= 1.5 -> worst {worst:.2f}, {'met' if worst <= 1.5 else 'NOT met'}")
    for label, old in (("Trainer v2.2.1 and later", False), ("Trainer before v2.2.1", True)):
        requests, rounds = asyncio.run(admitting_rounds(trainer_before_2_2_1=old))
        print(f"one admitting release ({label}): {requests} requests in {rounds} sequential round trips")


if __name__ == "__main__":
    main()
