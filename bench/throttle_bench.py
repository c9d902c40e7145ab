"""N releases at once against an API server that throttles, as API Priority and Fairness does.

The in-process fake sits behind a throttling transport: a server-side token bucket of ``--server-qps``
requests a second (burst ``--server-burst``) for dispatch's flow, and every request beyond it is refused as
APF refuses it (HTTP 429, ``Retry-After: 1``, nothing done). ``--objects`` held objects are then released
at once through one library connection (``AsyncAdapter.release``, gathered), in three runs of the same
shape on fresh clusters:

* ``unthrottled``: no server limit: the floor;
* ``throttled``: the server's limit; the client paces itself only by the 429s' ``Retry-After``;
* ``client_limited``: the same, with the client's own token bucket just under the server's rate
  (``qps = 0.9 * server-qps``), as a controller given ``--kube-api-qps`` would.

Each run reports the requests sent, the 429s seen, the seconds, and its ratios to the unthrottled run (and
its time to the least the server's rate allows: the unthrottled run's requests / server-qps); and
counts what each object holds: every release succeeded or failed retryably (``Unreachable``), and the
admission number each object carries (one each; a skipped number shows as A=2).

Run: ``python -m bench.throttle_bench [--objects 50] [--server-qps 100] [--server-burst 50]``; prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections import Counter
from typing import Any

import httpx2

from dispatch import AsyncAdapter, JobSpec
from dispatch import _kube as k
from dispatch import _names as n
from dispatch.errors import DispatchError, Unreachable
from dispatch.testing import FakeCluster

WRITER = ("dispatch-writer", "dispatch-node-reader")


class Throttling(httpx2.AsyncBaseTransport):
    """A token bucket in front of the fake API server, refusing beyond it with 429 and ``Retry-After``."""

    def __init__(self, inner: httpx2.MockTransport, qps: float | None, burst: int) -> None:
        self.inner = inner
        self.qps = qps
        self.burst = burst
        self.tokens = float(burst)
        self.last = time.monotonic()
        self.requests = 0
        self.refused = 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.requests += 1
        if self.qps is not None:
            now = time.monotonic()
            self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.qps)
            self.last = now
            if self.tokens < 1:
                self.refused += 1
                return httpx2.Response(429, headers={"Retry-After": "1"}, json={
                    "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429,
                    "reason": "TooManyRequests", "message": "Too many requests, please try again later.",
                    "details": {"retryAfterSeconds": 1}})
            self.tokens -= 1
        return await self.inner.handle_async_request(request)


def cluster_with(objects: int) -> tuple[FakeCluster, list[str]]:
    cluster = FakeCluster()
    cluster.add_runtime()
    for i in range(3):
        cluster.add_node(f"node-{i}")
    return cluster, [f"obj{i}-s1" for i in range(objects)]


async def run(objects: int, server_qps: float | None, server_burst: int, client_qps: float) -> dict[str, Any]:
    cluster, names = cluster_with(objects)
    setup = AsyncAdapter(k.Kube.connect(namespace="default", transport=cluster.transport(roles=WRITER)))
    for i in range(objects):
        await setup.open(JobSpec(job_id=f"obj{i}", submission="s1"), hold=True)
    await setup.aclose()

    throttle = Throttling(cluster.transport(roles=WRITER), server_qps, server_burst)
    adapter = AsyncAdapter.connect("default", transport=throttle, qps=client_qps)
    started = time.perf_counter()
    results = await asyncio.gather(*(adapter.release(name) for name in names), return_exceptions=True)
    seconds = time.perf_counter() - started
    await adapter.aclose()

    failed = [r for r in results if isinstance(r, BaseException)]
    unclear = [repr(r) for r in failed if not isinstance(r, Unreachable)]
    numbers: Counter[str] = Counter()
    for name in names:
        tj = cluster.server.get("trainer.kubeflow.org", "trainjobs", "default", name) or {}
        numbers[str(((tj.get("metadata") or {}).get("annotations") or {}).get(n.ANNOTATION_ADMISSION))] += 1
    # Each object holds one A (none: its release failed before the raise); A=2 is a skipped number (a record
    # issued 1 whose raise met a conflict, then 2 raised by the retry), which the promise allows: a number is
    # never reused, and may be skipped. No pod runs here, so no execution can overlap another.
    return {"seconds": round(seconds, 3), "requests": throttle.requests, "throttled_429": throttle.refused,
            "released": objects - len(failed), "failed_retryably": len(failed) - len(unclear),
            "failed_otherwise": unclear[:3], "admission_numbers": dict(sorted(numbers.items())),
            "example_failure": str(failed[0])[:300] if failed and isinstance(failed[0], DispatchError) else None}


async def main(objects: int, server_qps: float, server_burst: int) -> dict[str, Any]:
    floor = await run(objects, None, server_burst, 0.0)
    throttled = await run(objects, server_qps, server_burst, 0.0)
    limited = await run(objects, server_qps, server_burst, 0.9 * server_qps)
    out: dict[str, Any] = {"objects": objects, "server_qps": server_qps, "server_burst": server_burst,
                           "load_average_1m": round(os.getloadavg()[0], 2), "unthrottled": floor}
    for name, got in (("throttled", throttled), ("client_limited", limited)):
        got["requests_ratio"] = round(got["requests"] / floor["requests"], 3)
        got["time_ratio"] = round(got["seconds"] / floor["seconds"], 2)
        # the least time the server's rate allows for the unthrottled run's requests
        got["time_ratio_to_the_server_rate"] = round(got["seconds"] / (floor["requests"] / server_qps), 2)
        out[name] = got
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--objects", type=int, default=50)
    p.add_argument("--server-qps", type=float, default=100.0)
    p.add_argument("--server-burst", type=int, default=50)
    a = p.parse_args()
    print(json.dumps(asyncio.run(main(a.objects, a.server_qps, a.server_burst)), indent=1))
