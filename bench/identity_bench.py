"""Cost of execution identity on the in-process fake.

* release cost with 0 and with ``--past`` (default 100,000) earlier submissions in the namespace, each with
  its identity record: requests and bytes received by one release, as the ratio crowded/empty (target
  <= 1.1: a release reads and writes only its own record);
* the same for the pre-record design, measured in the same run as the baseline: a namespace ledger
  ConfigMap with one key per past submission, read whole on every release (its bytes grow with history);
* conflicts: ``--concurrent`` (default 50) releases of different objects in one namespace at once, and
  how many 409s dispatch's own records caused (target 0: no shared object);
* writes per admission, by kind, for a plain-mode release.

Run: ``python -m bench.identity_bench [--past 100000] [--concurrent 50]``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from typing import Any

from dispatch import AsyncAdapter, JobSpec
from dispatch import _names as n
from dispatch._api import CONFIGMAPS
from dispatch._identity import legacy_key, new_record
from dispatch.testing import FakeCluster

NS = "default"
LEDGER_CAP = 10_000
"""The old ledger filled its 1 MiB ConfigMap between ~11,000 and ~75,000 submissions: baseline at 10,000."""


def cluster_with_past(past: int, *, ledger: bool) -> FakeCluster:
    cluster = FakeCluster()
    cluster.add_runtime()
    cluster.add_node("node-0")
    if ledger:
        data = {legacy_key("past", f"s{i}"): "3" for i in range(past)}
        cluster.server.create("", "configmaps", NS, {"apiVersion": "v1", "kind": "ConfigMap",
                                                     "metadata": {"name": "dispatch-admissions"}, "data": data})
    else:
        for i in range(past):
            cluster.server.create(n.DOMAIN, "submissionrecords", NS, new_record("past", f"s{i}", "", admission=3))
    return cluster


async def one_release(cluster: FakeCluster, submission: str) -> tuple[int, int, Counter[str]]:
    adapter = AsyncAdapter.connect(NS, transport=cluster.transport())
    await adapter.open(JobSpec(job_id="llama", submission=submission))
    start = len(cluster.server.requests)
    kube = adapter.kube
    requests, received = kube.requests, kube.bytes_received
    await adapter.release(f"llama-{submission}")
    writes = Counter(p.split("/")[-2] if m == "PATCH" else m
                     for m, p, _ in cluster.server.requests[start:] if m in ("POST", "PATCH", "PUT", "DELETE"))
    out = (kube.requests - requests, kube.bytes_received - received, writes)
    await adapter.aclose()
    return out


async def ledger_release_cost(cluster: FakeCluster) -> tuple[int, int]:
    """What the pre-record design paid per release: the ledger read twice (floor, then record)."""
    adapter = AsyncAdapter.connect(NS, transport=cluster.transport())
    kube = adapter.kube
    requests, received = kube.requests, kube.bytes_received
    for _ in range(2):
        await kube.get_or_none(CONFIGMAPS, "dispatch-admissions")
    out = (kube.requests - requests, kube.bytes_received - received)
    await adapter.aclose()
    return out


async def concurrent_conflicts(count: int) -> dict[str, Any]:
    cluster = cluster_with_past(0, ledger=False)
    setup = AsyncAdapter.connect(NS, transport=cluster.transport())
    for i in range(count):
        await setup.open(JobSpec(job_id="many", submission=f"s{i}"))
    await setup.aclose()
    adapters = [AsyncAdapter.connect(NS, transport=cluster.transport()) for _ in range(count)]
    start = len(cluster.server.requests)
    t0 = time.perf_counter()
    results = await asyncio.gather(*(a.release(f"many-s{i}") for i, a in enumerate(adapters)),
                                   return_exceptions=True)
    seconds = time.perf_counter() - t0
    for a in adapters:
        await a.aclose()
    record_patches = [p for m, p, _ in cluster.server.requests[start:] if m == "PATCH" and "/submissionrecords/" in p]
    return {
        "releases": count,
        "admitted_with_a_1": sum(1 for r in results if not isinstance(r, BaseException) and r.admission == 1),
        "failed": sum(1 for r in results if isinstance(r, BaseException)),
        "record_writes": len(record_patches),
        "record_conflicts": len(record_patches) - len(set(record_patches)),
        "seconds": round(seconds, 3),
    }


async def main(past: int, concurrent: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    empty = cluster_with_past(0, ledger=False)
    crowded = cluster_with_past(past, ledger=False)
    setup_seconds = time.perf_counter() - t0
    e_req, e_bytes, writes = await one_release(empty, "s1")
    c_req, c_bytes, _ = await one_release(crowded, "s1")
    old_empty = cluster_with_past(1, ledger=True)
    old_crowded = cluster_with_past(LEDGER_CAP, ledger=True)  # a larger ledger no longer fits in one ConfigMap
    o_e = await ledger_release_cost(old_empty)
    o_c = await ledger_release_cost(old_crowded)
    return {
        "past_submissions": past,
        "release_requests": {"empty": e_req, "crowded": c_req, "ratio": round(c_req / e_req, 3)},
        "release_bytes": {"empty": e_bytes, "crowded": c_bytes, "ratio": round(c_bytes / e_bytes, 3)},
        "baseline_ledger_bytes_per_release": {"past": LEDGER_CAP, "empty": o_e[1], "crowded": o_c[1],
                                              "ratio": round(o_c[1] / max(1, o_e[1]), 1)},
        "writes_per_admission": dict(writes),
        "concurrent": await concurrent_conflicts(concurrent),
        "setup_seconds": round(setup_seconds, 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--past", type=int, default=100_000)
    parser.add_argument("--concurrent", type=int, default=50)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.past, args.concurrent)), indent=2))
