"""What the controller's API request metrics (``rest_client_*`` and ``dispatch_api_*``, hooks on the HTTP
client) cost per request.

The same requests (GETs of one pod, and lists of one label-selected pod) go through two ``Kube``s over
one in-process fake, one with the controller's hooks installed and one without, in alternating rounds
so both see the same machine load; the median of the rounds' time ratios (with hooks / without) is the
figure. The fake answers in-process, so this is the worst case: against a real API server each request
costs far more and the hooks' share is smaller still.

Run: python -m bench.api_metrics_bench [--requests 500] [--rounds 9]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from prometheus_client import CollectorRegistry

from dispatch import _kube as k
from dispatch.controller._apimetrics import hooks
from dispatch.controller._metrics import Metrics
from dispatch.testing import FakeCluster


async def timed(kube: k.Kube, requests: int) -> float:
    start = time.perf_counter()
    for i in range(requests):
        if i % 2:
            await kube.get(k.PODS, "p-0")
        else:
            await kube.list(k.PODS, labels="app=bench")
    return time.perf_counter() - start


async def main(requests: int, rounds: int) -> dict[str, object]:
    cluster = FakeCluster()
    cluster.server.create("", "pods", "default", {"metadata": {"name": "p-0", "labels": {"app": "bench"}},
                                                  "spec": {"containers": [{"name": "c", "image": "x"}]}})
    plain = k.Kube.connect(namespace="default", transport=cluster.transport())
    hooked = k.Kube.connect(namespace="default", transport=cluster.transport())
    metrics = Metrics.create(CollectorRegistry())
    hooked.observe(*hooks(metrics))
    try:
        await timed(plain, 50)
        await timed(hooked, 50)                               # warm both
        ratios, with_s, without_s = [], [], []
        for r in range(rounds):
            first, second = (plain, hooked) if r % 2 else (hooked, plain)
            a = await timed(first, requests)
            b = await timed(second, requests)
            t_hooked, t_plain = (b, a) if first is plain else (a, b)
            with_s.append(t_hooked / requests)
            without_s.append(t_plain / requests)
            ratios.append(t_hooked / t_plain)
        counted = metrics.registry.get_sample_value(
            "dispatch_api_requests_total", {"code": "200", "method": "GET", "resource": "pods"}) or 0
    finally:
        await plain.aclose()
        await hooked.aclose()
    return {"requests_per_round": requests, "rounds": rounds,
            "ratio_with_hooks_median": round(statistics.median(ratios), 3),
            "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
            "us_per_request_with_hooks": round(statistics.median(with_s) * 1e6, 1),
            "us_per_request_without": round(statistics.median(without_s) * 1e6, 1),
            "requests_counted": int(counted)}


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--rounds", type=int, default=9)
    a = p.parse_args()
    print(json.dumps(asyncio.run(main(a.requests, a.rounds))))
