"""Admission-check controller benchmarks on the fake cluster.

* decisions/s: N Workloads (default 1,000) pending at once, each owned by a dispatch TrainJob, the
  controller started cold; time until every check is Ready. Also the same with every object still
  holding a Terminating pod (each decision is "wait", written once). Each is measured batched
  (``--batch``, default 64) and one by one (batch 1, the baseline of the same run), with the ratio.
* writes per admission: API writes the controller sends per Ready check, by kind, for an admission
  that found nothing remaining and for one that first waited for a Terminating pod.

Run: ``python -m bench.controller_bench [--workloads 1000] [--workers 8] [--kube-api-qps Q] [--http]``; prints one
JSON object (``--kube-api-qps 20`` shows what controller-runtime's former default limit would cost). The
scale figure is ``--workloads 10000 --repeat 1`` (10,000 pending Workloads at once).

Each decisions run also gives the CPU it took per Workload. In-process, that is the controller's and the fake API
server's together, and a request costs the controller only what its client does above the transport. With
``--http`` the fake cluster is served over loopback HTTP/1.1 by a process of its own (``--serve``), the controller
connects through a kubeconfig as a deployed one does, and the CPU is the controller's alone: a real client's
connection pool, HTTP parsing and sockets cost it about three times what the rest of a request does (issue 37).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import httpx2
import structlog

from dispatch import _kube as k
from dispatch import _kueue as kq
from dispatch import _names as n
from dispatch import _trainer as tr
from dispatch._identity import new_record
from dispatch.controller import Config, Controller
from dispatch.controller.testing import FakeKueue
from dispatch.testing import FakeCluster

TRAINER = n.TRAINER_GROUP


def trainjob(name: str, queue: str) -> dict[str, Any]:
    """What ``open`` creates for a queued submission (written directly: setup is not what is measured), with
    dispatch's runtime patch entry as ``open`` writes it (the identity labels on the JobSet too)."""
    labels = {n.LABEL_JOB_ID: name, n.LABEL_SUBMISSION: "s1"}
    return {
        "metadata": {"name": name, "labels": {**labels, n.KUEUE_QUEUE_LABEL: queue},
                     "annotations": {n.ANNOTATION_ADMISSION: "0"}},
        "spec": {
            "runtimeRef": {"name": "torch-distributed", "apiGroup": TRAINER, "kind": "ClusterTrainingRuntime"},
            "suspend": True,
            "runtimePatches": [tr.patch_entry(["node"], {**labels, n.LABEL_ADMISSION: "0"})],
        },
    }


def setup(count: int, *, terminating: bool) -> tuple[FakeCluster, FakeKueue, list[str]]:
    cluster = FakeCluster()
    cluster.add_runtime()
    for i in range(3):
        cluster.add_node(f"node-{i}")
    kueue = FakeKueue(cluster)
    kueue.install()
    names = [f"job{i:05d}" for i in range(count)]
    for name in names:
        cluster.server.create(TRAINER, "trainjobs", "default", trainjob(name, kueue.queue))
        # the identity record ``open`` claims before it creates the TrainJob
        cluster.server.create(n.DOMAIN, "submissionrecords", "default", new_record(name, "s1", name))
        if terminating:
            cluster.server.create("", "pods", "default", {
                "metadata": {"name": f"{name}-node-0-0", "labels": {n.JOBSET_NAME_LABEL: name},
                             "deletionTimestamp": "2026-01-01T00:00:30Z", "deletionGracePeriodSeconds": 30},
                "spec": {"nodeName": "node-0"}, "status": {"phase": "Running"}})
    cluster.trainer_sync()   # Trainer builds each suspended TrainJob's JobSet (suspended), as on a real cluster
    wls = [kueue.workload_for(name) for name in names]
    return cluster, kueue, wls


def writes(cluster: FakeCluster, since: int) -> Counter[str]:
    """Write requests since ``since``, as ``<verb> <plural>[/status]``."""
    out: Counter[str] = Counter()
    for method, path, _ in cluster.server.requests[since:]:
        if method not in ("POST", "PUT", "PATCH", "DELETE"):
            continue
        parts = [p for p in path.split("/") if p]
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if rest[:1] == ["namespaces"]:
            rest = rest[2:]
        kind = rest[0] + ("/status" if rest[-1] == "status" else "")
        out[f"{method} {kind}"] += 1
    return out


async def until(pred: Any, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError
        await asyncio.sleep(0.01)


def decided(entry: kq.CheckEntry | None, terminating: bool) -> bool:
    if entry is None:
        return False
    return entry.message.startswith("waiting for pods") if terminating else entry.state == "Ready"


async def serve(port: int, count: int, *, terminating: bool) -> None:
    """``--serve``: the cluster ``setup`` makes, over loopback HTTP/1.1 (a watch as a chunked answer), until killed."""
    cluster, _, _ = setup(count, terminating=terminating)

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                method, target, _ = head[0].split(" ", 2)
                fields = [line.split(":", 1) for line in head[1:] if ":" in line]
                headers = [(name.strip(), value.strip()) for name, value in fields]
                length = next((int(v) for name, v in headers if name.lower() == "content-length"), 0)
                body = await reader.readexactly(length) if length else b""
                answer = await cluster.server.handle(httpx2.Request(method, f"http://127.0.0.1:{port}{target}",
                                                                    headers=headers, content=body))
                kept = "".join(f"{name}: {value}\r\n" for name, value in answer.headers.items()
                               if name.lower() not in ("content-length", "transfer-encoding"))
                start = f"HTTP/1.1 {answer.status_code} {answer.reason_phrase}\r\n{kept}"
                if answer.headers.get("transfer-encoding") == "chunked":   # a watch: each event as it comes
                    writer.write(f"{start}Transfer-Encoding: chunked\r\n\r\n".encode())
                    async for chunk in answer.aiter_raw():
                        if chunk:
                            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            await writer.drain()
                    writer.write(b"0\r\n\r\n")
                else:
                    data = await answer.aread()
                    writer.write(f"{start}Content-Length: {len(data)}\r\n\r\n".encode() + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(connection, "127.0.0.1", port, limit=1 << 24)
    print("ready", flush=True)
    async with listener:
        await listener.serve_forever()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def decisions_per_second(count: int, workers: int, *, terminating: bool, batch: int,
                               qps: float = 0.0, burst: int = k.DEFAULT_BURST, http: bool = False) -> dict[str, Any]:
    server: asyncio.subprocess.Process | None = None
    if http:
        port = free_port()
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.controller_bench", "--serve", str(port), "--workloads", str(count),
            *(["--terminating"] if terminating else []), stdout=asyncio.subprocess.PIPE)
        assert server.stdout is not None
        if await server.stdout.readline() != b"ready\n":
            raise SystemExit("the fake cluster's HTTP server did not start")
        config = tempfile.NamedTemporaryFile("w", suffix=".kubeconfig")  # noqa: SIM115 - closed below
        json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "bench",
                   "clusters": [{"name": "bench", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                   "users": [{"name": "bench", "user": {}}],
                   "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}]}, config)
        config.flush()
        kube = k.Kube.connect(namespace="default", kubeconfig=config.name, qps=qps, burst=burst)
        config.close()
    else:
        cluster, kueue, wls = setup(count, terminating=terminating)
        kube = k.Kube.connect(namespace="default", transport=cluster.transport(), qps=qps, burst=burst)
    try:
        ctl = Controller(kube, Config(workers=workers, resync_seconds=3600, batch=batch))
        stop = asyncio.Event()
        want = "waiting" if terminating else "admitted"
        started, cpu = time.perf_counter(), time.process_time()
        task = asyncio.create_task(ctl.run(stop))
        await until(lambda: ctl.metrics.decisions.labels(want)._value.get() >= count, timeout=600)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        stop.set()
        await task
        if http:
            views = [kq.WorkloadView.from_obj(w) for w in (await kube.list(k.WORKLOADS)).items]
            assert len(views) == count and all(decided(v.entry(ctl.check_names), terminating) for v in views)
        await kube.aclose()
    finally:
        if server is not None:
            server.kill()
            await server.wait()
    if not http and not terminating:
        assert all(kueue.entry(w)["state"] == "Ready" for w in wls)
    elif not http:
        assert all(kueue.entry(w)["message"].startswith("waiting for pods") for w in wls)
    return {"workloads": count, "workers": workers, "batch": batch, "outcome": want, "seconds": round(elapsed, 3),
            "decisions_per_second": round(count / elapsed, 1), "kube_api_qps": qps, "requests": kube.pacing.sent,
            "cpu_ms_per_workload": round(1000 * cpu / count, 3),
            "cpu_of": "the controller" if http else "the controller and the in-process fake API server"}


async def writes_per_admission(count: int = 50) -> dict[str, Any]:
    """Fresh admissions, then a preemption of each, a wait on its Terminating pod, and the re-admission."""
    cluster, kueue, wls = setup(count, terminating=False)
    kube = k.Kube.connect(namespace="default", transport=cluster.transport())
    ctl = Controller(kube, Config(workers=4, resync_seconds=3600))
    stop = asyncio.Event()
    task = asyncio.create_task(ctl.run(stop))
    await ctl.wait_synced()
    await until(lambda: any(c["type"] == "Active" for c in (cluster.server.get(
        n.KUEUE_GROUP, "admissionchecks", "", "dispatch") or {}).get("status", {}).get("conditions", [])), 10)
    mark = len(cluster.server.requests)
    await until(lambda: all(kueue.entry(w)["state"] == "Ready" for w in wls), 60)
    await asyncio.sleep(0.2)
    fresh = writes(cluster, mark)
    kueue.sync()
    cluster.settle()
    mark2 = len(cluster.server.requests)   # the fake cluster's own steps write in-process, not over HTTP
    for w in wls:
        kueue.evict(w)
    cluster.settle()
    kueue.sync()
    await until(lambda: all(kueue.entry(w)["message"].startswith("waiting for pods") for w in wls), 60)
    cluster.advance(31)
    cluster.settle()
    await until(lambda: all(kueue.entry(w)["state"] == "Ready" for w in wls), 60)
    await asyncio.sleep(0.2)
    waited = writes(cluster, mark2)
    stop.set()
    await task
    await kube.aclose()
    kueue.sync()
    cluster.settle()
    cluster.history.check()
    return {
        "admissions": count,
        "fresh": {"per_admission": sum(fresh.values()) / count, "by_kind": dict(fresh)},
        "after_waiting": {"per_admission": sum(waited.values()) / count, "by_kind": dict(waited),
                          "note": "workloads/status counts the Pending message and the Ready write"},
    }


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workloads", type=int, default=1000)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--kube-api-qps", type=float, default=0.0,
                   help="the controller's client-side limit (0: none, the default); its burst is 30")
    p.add_argument("--http", action="store_true",
                   help="serve the fake cluster over loopback HTTP from a process of its own: a real client's costs, "
                        "and the controller's CPU alone")
    p.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--terminating", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        await serve(a.serve, a.workloads, terminating=a.terminating)
        return
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    result: dict[str, Any] = {}
    for outcome, terminating in (("admit", False), ("wait", True)):
        medians = {}
        for batch in (a.batch, 1):   # the one-by-one baseline, measured in the same run
            runs = []
            for _ in range(a.repeat):
                runs.append(await decisions_per_second(a.workloads, a.workers, terminating=terminating, batch=batch,
                                                       qps=a.kube_api_qps, http=a.http))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)   # each run as it ends (long at 10,000)
            medians[batch] = statistics.median(r["decisions_per_second"] for r in runs)
            result[f"{outcome}_batch{batch}"] = runs
            result[f"{outcome}_batch{batch}_median_decisions_per_second"] = medians[batch]
        result[f"{outcome}_ratio_batched_vs_one_by_one"] = round(medians[a.batch] / medians[1], 2)
    result["writes"] = await writes_per_admission()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
