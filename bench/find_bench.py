"""``find`` over many objects on the in-process fake: calls, bytes and time against the bare lists it needs.

``--objects`` (default 10,000) held dispatch TrainJobs, each with one Terminating pod (so every object
is decided: nothing is skipped as Running). ``find()`` is measured (requests, bytes received, seconds)
against the same run's baseline: the bare ``list`` calls it makes (TrainJobs by dispatch's label, pods
by both selections, JobSets, Jobs, Nodes, and AdmissionChecks and Workloads, since Kueue may manage an
object without its queue-name label), decoded but neither parsed nor decided. Target: time ratio
<= 2.

Run: ``python -m bench.find_bench [--objects 10000] [--repeat 3]``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from typing import Any

from bench.controller_memory_bench import accelerate_fake
from dispatch import AsyncAdapter
from dispatch import _kube as k
from dispatch import _names as n
from dispatch.errors import NotFound
from dispatch.testing import FakeCluster

NS = "default"


def trainjob(i: int) -> dict[str, Any]:
    labels = {n.LABEL_JOB_ID: f"obj{i}", n.LABEL_SUBMISSION: "s1"}
    return {"metadata": {"name": f"obj{i}-s1", "labels": labels, "annotations": {n.ANNOTATION_ADMISSION: "1"}},
            "spec": {"runtimeRef": {"name": "torch-distributed", "apiGroup": n.TRAINER_GROUP,
                                    "kind": "ClusterTrainingRuntime"}, "suspend": True}}


def pod(i: int) -> dict[str, Any]:
    labels = {n.LABEL_JOB_ID: f"obj{i}", n.LABEL_SUBMISSION: "s1", n.LABEL_ADMISSION: "1",
              n.JOBSET_NAME_LABEL: f"obj{i}-s1"}
    return {"metadata": {"name": f"obj{i}-s1-node-0-0", "labels": labels,
                         "deletionTimestamp": "2026-01-01T00:00:30Z", "deletionGracePeriodSeconds": 30},
            "spec": {"nodeName": f"node-{i % 3}"}, "status": {"phase": "Running"}}


async def bare(kube: k.Kube) -> None:
    await kube.list(k.TRAINJOBS, labels=n.LABEL_JOB_ID)
    first = await kube.list(k.PODS, labels=n.LABEL_JOB_ID)
    await kube.list(k.PODS, labels=n.JOBSET_NAME_LABEL, resource_version=first.resource_version, exact=True)
    await kube.list(k.JOBSETS)
    await kube.list(k.JOBS, labels=n.JOBSET_NAME_LABEL)
    await kube.list(k.NODES)
    for res in (k.ADMISSION_CHECKS, k.WORKLOADS):   # Kueue may manage an object without its queue label
        try:
            await kube.list(res)
        except NotFound:
            pass


async def measure(cluster: FakeCluster, which: str) -> dict[str, Any]:
    kube = k.Kube.connect(namespace=NS, transport=cluster.transport())
    adapter = AsyncAdapter(kube, read_only=True)
    gc.collect()
    t0 = time.perf_counter()
    if which == "find":
        found = await adapter.find()
        assert len(found) == cluster_objects(cluster)
    else:
        await bare(kube)
    elapsed = time.perf_counter() - t0
    out = {"seconds": elapsed, "requests": kube.requests, "bytes": kube.bytes_received}
    await kube.aclose()
    return out


def cluster_objects(cluster: FakeCluster) -> int:
    return int(getattr(cluster, "_bench_objects", 0))


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    accelerate_fake()
    cluster = FakeCluster()
    cluster.add_runtime()
    for i in range(3):
        cluster.add_node(f"node-{i}")
    gc.disable()
    for i in range(a.objects):
        cluster.server.create(n.TRAINER_GROUP, "trainjobs", NS, trainjob(i))
        cluster.server.create("", "pods", NS, pod(i))
    gc.enable()
    gc.freeze()
    cluster._bench_objects = a.objects  # type: ignore[attr-defined]
    runs: dict[str, list[dict[str, Any]]] = {"find": [], "bare": []}
    for _ in range(a.repeat):
        for which in ("bare", "find"):
            runs[which].append(await measure(cluster, which))
    med = {w: {key: statistics.median(r[key] for r in rs) for key in ("seconds", "requests", "bytes")}
           for w, rs in runs.items()}
    print(json.dumps({
        "objects": a.objects,
        "find": {**med["find"], "seconds": round(med["find"]["seconds"], 3)},
        "bare_lists": {**med["bare"], "seconds": round(med["bare"]["seconds"], 3)},
        "ratio_time": round(med["find"]["seconds"] / med["bare"]["seconds"], 2),
        "ratio_requests": round(med["find"]["requests"] / med["bare"]["requests"], 2),
        "ratio_bytes": round(med["find"]["bytes"] / med["bare"]["bytes"], 2),
        "target_ratio_time": 2.0,
    }, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
