"""The decision's API cost follows the object's pods, not the namespace (counted, not timed)."""

from __future__ import annotations

import asyncio

from bench.release_decision import crowded_cluster, held_with_pod, measure


def test_decision_requests_and_bytes_do_not_grow_with_unrelated_pods() -> None:
    async def run(count: int) -> tuple[float, float]:
        adapter = await held_with_pod(crowded_cluster(count))
        cost = await measure(adapter, 3, naive=False)
        await adapter.aclose()
        return cost.requests, cost.bytes

    empty = asyncio.run(run(0))
    crowded = asyncio.run(run(2000))
    assert crowded[0] == empty[0]
    assert crowded[1] <= 1.05 * empty[1]
