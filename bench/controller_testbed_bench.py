"""Decisions/s of the admission-check controller against the testbed's real Kueue and API server.

N TrainJobs (default 200) are opened under a ClusterQueue of the benchmark's own, with quota for all of
them, while no controller runs: Kueue reserves quota for every Workload and leaves our check Pending.
Then ``python -m dispatch.controller`` starts, and the benchmark times how long until every check is
Ready (from the process start, and from the first Ready to the last). Everything is deleted afterwards.

Run with the testbed up: ``python bench/controller_testbed_bench.py [--workloads 200]``.
"""

from __future__ import annotations

# ruff: noqa: ASYNC210, ASYNC220, ASYNC230  (a benchmark harness: one subprocess, one file, one scrape)
import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

from dispatch import AsyncAdapter, JobSpec, testbed
from dispatch import _kube as k
from dispatch.controller import ACTIVE_MESSAGE, ACTIVE_REASON

LOCALQUEUES = k.Res("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")
CLUSTERQUEUES = k.Res("kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False)


def state(workload: dict[str, Any]) -> str:
    for c in (workload.get("status") or {}).get("admissionChecks") or []:
        if c.get("name") == workload["metadata"]["namespace"]:
            return str(c.get("state"))
    return ""


def message(workload: dict[str, Any]) -> str:
    for c in (workload.get("status") or {}).get("admissionChecks") or []:
        if c.get("name") == workload["metadata"]["namespace"]:
            return str(c.get("message") or "")
    return ""


def reserved(workload: dict[str, Any]) -> bool:
    return any(c.get("type") == "QuotaReserved" and c.get("status") == "True"
               for c in (workload.get("status") or {}).get("conditions") or [])


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workloads", type=int, default=200)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--metrics-port", type=int, default=0)
    p.add_argument("--blocked", action="store_true",
                   help="give every object a pod that may still run, so each decision is 'wait' (one write) and "
                        "no admission cascades into Kueue, Trainer and JobSet work on the same machine")
    p.add_argument("--log", default="")
    p.add_argument("--log-level", default="warning")
    a = p.parse_args()
    if not testbed.is_up():
        raise SystemExit("the testbed is not up")
    path = testbed.kubeconfig_path()
    ns = cq = f"ctl-bench-{uuid.uuid4().hex[:6]}"
    kube = k.Kube.connect(namespace=ns, kubeconfig=path)
    await kube.create(k.NAMESPACES, {"metadata": {"name": ns}})
    # A check of the benchmark's own under a controllerName of its own, so that no other dispatch
    # controller running on the (shared) testbed decides these Workloads and blurs the figure.
    controller_name = f"dispatch.phpboyscout.uk/admission-bench-{ns}"
    await kube.create(k.ADMISSION_CHECKS, {"apiVersion": k.ADMISSION_CHECKS.api_version, "kind": "AdmissionCheck",
                                           "metadata": {"name": ns}, "spec": {"controllerName": controller_name}})
    # The ClusterQueue is inactive until its check is Active; mark it as the controller would, so Kueue
    # reserves quota for every Workload before the controller starts (it then finds nothing to write here).
    await kube.apply(k.ADMISSION_CHECKS, ns, {
        "apiVersion": k.ADMISSION_CHECKS.api_version, "kind": "AdmissionCheck", "metadata": {"name": ns},
        "status": {"conditions": [{"type": "Active", "status": "True", "reason": ACTIVE_REASON,
                                   "message": ACTIVE_MESSAGE, "lastTransitionTime": "2026-01-01T00:00:00Z",
                                   "observedGeneration": 1}]}}, sub="status")
    await kube.create(CLUSTERQUEUES, {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": "default",
                     "resources": [{"name": "cpu", "nominalQuota": "1000"},
                                   {"name": "memory", "nominalQuota": "1000Gi"}]}]}],
                 "admissionChecksStrategy": {"admissionChecks": [{"name": ns}]}}})
    await kube.create(LOCALQUEUES, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                                    "metadata": {"name": "lq", "namespace": ns}, "spec": {"clusterQueue": cq}})
    adapter = AsyncAdapter(kube)
    proc: subprocess.Popen[bytes] | None = None
    try:
        sem = asyncio.Semaphore(16)

        async def open_one(i: int) -> None:
            async with sem:
                await adapter.open(JobSpec(job_id="bench", submission=f"s{i}", queue="lq",
                                           resources_per_node={"cpu": "10m"}))
        await asyncio.gather(*(open_one(i) for i in range(a.workloads)))
        if a.blocked:
            async def decoy(i: int) -> None:
                async with sem:
                    await kube.create(k.PODS, {"metadata": {"name": f"decoy-{i}", "labels": {
                        "jobset.sigs.k8s.io/jobset-name": f"bench-s{i}"}}, "spec": {
                        "nodeName": "node-0", "containers": [{"name": "c", "image": "example.invalid/x"}]}})
            await asyncio.gather(*(decoy(i) for i in range(a.workloads)))
        deadline = time.monotonic() + 300 + a.workloads
        while True:
            wls = (await kube.list(k.WORKLOADS)).items
            if len(wls) == a.workloads and all(reserved(w) and state(w) == "Pending" for w in wls):
                break
            if time.monotonic() > deadline:
                done = sum(reserved(w) and state(w) == "Pending" for w in wls)
                raise SystemExit(f"Kueue reserved quota for {done} of {a.workloads} Workloads in time")
            await asyncio.sleep(0.5)
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "dispatch.controller", "--kubeconfig", str(path),
                                 "--namespace", ns, "--no-leader-elect", "--metrics-port", str(a.metrics_port),
                                 "--workers", str(a.workers), "--log-level", a.log_level,
                                 "--controller-name", controller_name],
                                stderr=open(a.log, "wb") if a.log else None)  # noqa: SIM115
        first: float | None = None
        while True:
            wls = (await kube.list(k.WORKLOADS)).items
            ready = sum((state(w) == "Pending" and message(w).startswith("waiting for pods")) if a.blocked
                        else state(w) == "Ready" for w in wls)
            now = time.monotonic()
            if ready and first is None:
                first = now
            if ready == a.workloads:
                break
            if now - started > 600:
                raise SystemExit(f"only {ready} of {a.workloads} Ready after 600 s")
            await asyncio.sleep(0.1)
        total = now - started
        with open(f"/proc/{proc.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        if a.metrics_port:
            import urllib.request

            text = urllib.request.urlopen(f"http://127.0.0.1:{a.metrics_port}/metrics").read().decode()
            print("\n".join(line for line in text.splitlines() if line.startswith(
                ("dispatch_reconcile_seconds_sum", "dispatch_reconcile_seconds_count", "dispatch_reconcile_errors",
                 "dispatch_decisions_total", "dispatch_api_writes"))))
        span = now - (first or started)
        print(json.dumps({
            "workloads": a.workloads, "workers": a.workers, "outcome": "waiting" if a.blocked else "admitted",
            "seconds_from_process_start": round(total, 2),
            "controller_cpu_seconds": round(cpu, 2),
            "controller_cpu_ms_per_decision": round(1000 * cpu / a.workloads, 1),
            "decisions_per_second_from_process_start": round(a.workloads / total, 1),
            "seconds_first_to_last_ready": round(span, 2),
            "decisions_per_second_first_to_last": round((a.workloads - 1) / span, 1) if span else None,
        }, indent=2))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        for tj in (await kube.list(k.TRAINJOBS)).items:
            await kube.delete(k.TRAINJOBS, tj["metadata"]["name"])
        for pod in (await kube.list(k.PODS, labels="jobset.sigs.k8s.io/jobset-name")).items:
            if pod["metadata"]["name"].startswith("decoy-"):
                await kube.delete(k.PODS, pod["metadata"]["name"], grace_seconds=0)
        await kube.delete(k.NAMESPACES, ns)
        await kube.delete(CLUSTERQUEUES, cq)
        await kube.delete(k.ADMISSION_CHECKS, ns)
        await kube.aclose()


if __name__ == "__main__":
    asyncio.run(main())
