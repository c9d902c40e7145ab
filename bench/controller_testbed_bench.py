"""Decisions/s of the admission-check controller against the testbed's real Kueue and API server.

N TrainJobs (default 1,000) are opened under a ClusterQueue of the benchmark's own, with quota for all
of them, while no controller runs: Kueue reserves quota for every Workload and leaves our check Pending.
Then ``python -m dispatch.controller`` starts, and the benchmark times how long until it has decided
every Workload (from the process start, and from the first decision to the last).

``--blocked`` gives every object a Running pod, so each decision is "wait" (one check write and one
Event) and no admission sets off Trainer, JobSet and KWOK work on the same two cores. In that mode
the Workloads are then reset to Pending and decided again one by one (``--batch 1``) as the baseline
of the same run, and the report gives the ratio. Everything is deleted afterwards.

Run with the testbed up: ``python bench/controller_testbed_bench.py --blocked [--workloads 1000]``.
"""

from __future__ import annotations

# ruff: noqa: ASYNC220, ASYNC230  (a benchmark harness: one subprocess, one file, one scrape)
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


def metric(text: str, name: str) -> float:
    """The sum of every sample of ``name`` in a Prometheus text exposition."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def scrape(port: int) -> str:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            return str(reply.read().decode())
    except OSError:
        return ""


def cpu_seconds(pid: int) -> float:
    """User plus system CPU of ``pid`` so far (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat: what the controller's
    figure shares the cores with."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(values) - idle) / hz, sum(values) / hz


def component_cpu() -> dict[str, float]:
    """CPU seconds so far of every testbed component that runs (API server, etcd, Kueue, ...)."""
    return {s.name: cpu_seconds(s.pid) for s in testbed.status() if s.pid is not None}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def reset(kube: k.Kube, check: str) -> None:
    """Our check back to Pending with no message on every Workload, so the next run decides all again."""
    sem = asyncio.Semaphore(16)

    async def one(w: dict[str, Any]) -> None:
        async with sem:
            await kube.apply(k.WORKLOADS, w["metadata"]["name"], {
                "apiVersion": k.WORKLOADS.api_version, "kind": "Workload",
                "metadata": {"name": w["metadata"]["name"], "namespace": w["metadata"]["namespace"]},
                "status": {"admissionChecks": [{"name": check, "state": "Pending", "message": "",
                                                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
                sub="status", field_manager="dispatch-bench-reset", force=True)
    await asyncio.gather(*(one(w) for w in (await kube.list(k.WORKLOADS)).items))


async def queue_of_its_own(kube: k.Kube, ns: str) -> str:
    """The namespace ``ns`` with a LocalQueue ``lq`` of a ClusterQueue ``ns`` (quota for thousands) whose one
    check, ``ns``, is Active under a controllerName of its own (returned): no other dispatch controller on the
    (shared) testbed decides these Workloads and blurs a figure, and Kueue reserves quota for every Workload
    before any controller starts (the check marked Active as the controller would)."""
    await kube.create(k.NAMESPACES, {"metadata": {"name": ns}})
    controller_name = f"dispatch.phpboyscout.uk/admission-bench-{ns}"
    await kube.create(k.ADMISSION_CHECKS, {"apiVersion": k.ADMISSION_CHECKS.api_version, "kind": "AdmissionCheck",
                                           "metadata": {"name": ns}, "spec": {"controllerName": controller_name}})
    await kube.apply(k.ADMISSION_CHECKS, ns, {
        "apiVersion": k.ADMISSION_CHECKS.api_version, "kind": "AdmissionCheck", "metadata": {"name": ns},
        "status": {"conditions": [{"type": "Active", "status": "True", "reason": ACTIVE_REASON,
                                   "message": ACTIVE_MESSAGE, "lastTransitionTime": "2026-01-01T00:00:00Z",
                                   "observedGeneration": 1}]}}, sub="status")
    await kube.create(CLUSTERQUEUES, {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": ns},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                 # `pods` covered, as a check-gated queue must be (Kueue v0.19 skips the checks of a
                 # Workload given no flavor); the controller warns about a queue that does not
                 "resourceGroups": [{"coveredResources": ["cpu", "memory", "pods"], "flavors": [{"name": "default",
                     "resources": [{"name": "cpu", "nominalQuota": "1000"},
                                   {"name": "memory", "nominalQuota": "1000Gi"},
                                   {"name": "pods", "nominalQuota": "100000"}]}]}],
                 "admissionChecksStrategy": {"admissionChecks": [{"name": ns}]}}})
    await kube.create(LOCALQUEUES, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                                    "metadata": {"name": "lq", "namespace": ns}, "spec": {"clusterQueue": ns}})
    return controller_name


async def remove_queue(kube: k.Kube, ns: str) -> None:
    """What ``queue_of_its_own`` made, and the namespace with all in it."""
    await kube.delete(k.NAMESPACES, ns)
    await kube.delete(CLUSTERQUEUES, ns)
    await kube.delete(k.ADMISSION_CHECKS, ns)


async def run_controller(a: argparse.Namespace, path: Any, ns: str, controller_name: str, batch: int,
                         kube: k.Kube) -> dict[str, Any]:
    """Start the controller with ``batch``, time until it has decided every Workload, stop it."""
    port = free_port()
    before = component_cpu()
    busy0, total0 = machine_ticks()
    started = time.monotonic()
    profile = ["-m", "cProfile", "-o", f"{a.profile}.batch{batch}"] if a.profile else []
    proc = subprocess.Popen([sys.executable, *profile, "-m", "dispatch.controller", "--kubeconfig", str(path),
                             "--namespace", ns, "--no-leader-elect", "--metrics-port", str(port),
                             "--workers", str(a.workers), "--batch", str(batch), "--log-level", a.log_level,
                             "--controller-name", controller_name],
                            stderr=open(a.log, "ab") if a.log else None)  # noqa: SIM115
    try:
        first: float | None = None
        text = ""
        while True:
            # Progress from the controller's own counter of check writes (one per Workload decided
            # here): polling lists of N Workloads would load the API server the controller is timed on.
            text = scrape(port)
            done = metric(text, 'dispatch_api_writes_total{kind="workload"}')
            now = time.monotonic()
            if done and first is None:
                first = now
            if done >= a.workloads:
                break
            if now - started > 900:
                raise SystemExit(f"only {done:.0f} of {a.workloads} decided after 900 s (batch {batch})")
            await asyncio.sleep(0.05)
        total = now - started
        cpu = cpu_seconds(proc.pid)
        after = component_cpu()
        busy1, total1 = machine_ticks()
    finally:
        proc.terminate()
        proc.wait(10)
    wls = (await kube.list(k.WORKLOADS)).items
    expected = sum((state(w) == "Pending" and message(w).startswith("waiting for pods")) if a.blocked
                   else state(w) == "Ready" for w in wls)
    if expected != a.workloads:
        raise SystemExit(f"batch {batch}: {expected} of {a.workloads} Workloads decided as expected")
    span = now - (first or started)
    decisions = metric(text, "dispatch_decisions_total")
    return {
        "batch": batch,
        "seconds_from_process_start": round(total, 2),
        "decisions_per_second_from_process_start": round(a.workloads / total, 1),
        "seconds_first_to_last": round(span, 2),
        "decisions_per_second_first_to_last": round((a.workloads - 1) / span, 1) if span else None,
        "controller_cpu_ms_per_workload": round(1000 * cpu / a.workloads, 1),
        # Where the machine's cores went while the controller decided: the controller's share beside the
        # API server, etcd and Kueue it talks to (cores busy = busy CPU seconds / wall seconds).
        "cpu_seconds": {"controller": round(cpu, 2), **{
            n: round(used, 2) for n in sorted(after) if (used := after[n] - before.get(n, 0.0)) >= 0.05}},
        "machine_cores": os.cpu_count(),
        "machine_cores_busy": round((busy1 - busy0) / total, 2),
        "machine_busy_fraction": round((busy1 - busy0) / (total1 - total0), 2) if total1 > total0 else None,
        "reconciles": decisions,
        "check_writes": metric(text, 'dispatch_api_writes_total{kind="workload"}'),
        "trainjob_writes": metric(text, 'dispatch_api_writes_total{kind="trainjob"}'),
        "errors": metric(text, "dispatch_reconcile_errors_total"),
    }


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workloads", type=int, default=1000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the one-by-one run (batch 1) the batched figure is compared with")
    p.add_argument("--blocked", action="store_true",
                   help="give every object a pod that may still run, so each decision is 'wait' (one write) and "
                        "no admission cascades into Kueue, Trainer and JobSet work on the same machine")
    p.add_argument("--log", default="")
    p.add_argument("--profile", default="", help="write the controller's cProfile data to PROFILE.batchN")
    p.add_argument("--log-level", default="warning")
    a = p.parse_args()
    if not testbed.is_up():
        raise SystemExit("the testbed is not up")
    if not a.blocked and not a.no_baseline:
        raise SystemExit("admissions cannot be undone between runs: use --blocked for the comparison, "
                         "or --no-baseline")
    path = testbed.kubeconfig_path()
    ns = f"ctl-bench-{uuid.uuid4().hex[:6]}"
    kube = k.Kube.connect(namespace=ns, kubeconfig=path)
    controller_name = await queue_of_its_own(kube, ns)
    adapter = AsyncAdapter(kube)
    try:
        sem = asyncio.Semaphore(16)

        async def open_one(i: int) -> None:
            async with sem:
                await adapter.open(JobSpec(job_id="bench", submission=f"s{i}", queue="lq",
                                           resources_per_node={"cpu": "10m"}))
        setup = time.monotonic()
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
            await asyncio.sleep(2)
        setup_seconds = time.monotonic() - setup
        runs = [await run_controller(a, path, ns, controller_name, a.batch, kube)]
        if not a.no_baseline:
            # The baseline runs second, on a warmer API server: any warm-up favours it, not the batch.
            await reset(kube, ns)
            await asyncio.sleep(2)
            runs.append(await run_controller(a, path, ns, controller_name, 1, kube))
        report: dict[str, Any] = {
            "workloads": a.workloads, "workers": a.workers, "outcome": "waiting" if a.blocked else "admitted",
            "setup_seconds": round(setup_seconds, 1), "runs": runs,
        }
        if len(runs) == 2 and runs[1]["decisions_per_second_first_to_last"]:
            report["ratio_decisions_per_second_batched_vs_one_by_one"] = round(
                runs[0]["decisions_per_second_first_to_last"] / runs[1]["decisions_per_second_first_to_last"], 2)
            report["ratio_controller_cpu_batched_vs_one_by_one"] = round(
                runs[0]["controller_cpu_ms_per_workload"] / runs[1]["controller_cpu_ms_per_workload"], 2)
        print(json.dumps(report, indent=2))
    finally:
        for tj in (await kube.list(k.TRAINJOBS)).items:
            await kube.delete(k.TRAINJOBS, tj["metadata"]["name"])
        for pod in (await kube.list(k.PODS, labels="jobset.sigs.k8s.io/jobset-name")).items:
            if pod["metadata"]["name"].startswith("decoy-"):
                await kube.delete(k.PODS, pod["metadata"]["name"], grace_seconds=0)
        await remove_queue(kube, ns)
        await kube.aclose()


if __name__ == "__main__":
    asyncio.run(main())
