"""What one check write costs the cluster: the testbed's CPU per Workload status write, by kind of write.

The controller's decisions per second on a shared machine are bound by what each decision makes the other
processes do, not by the controller's own CPU (``controller_testbed_bench`` reports the split). A "wait"
decision writes one thing that cannot be dropped: the check's Pending message that explains the wait. This
benchmark measures that write's cost alone, with no controller running, and its alternatives, in the same run:

- ``ssa``: the controller's write (server-side apply of our one ``status.admissionChecks`` entry);
- ``json_patch``: the same change as a JSON patch at the entry's index (test of its name, replace of its
  message): what a cheaper encoding of the same write would save;
- ``event``: one Event create (the AdmissionDelayed Event of a waiting episode);
- ``get``: one GET of the Workload (a read, for scale).

N Workloads (default 400) get quota under a ClusterQueue of the benchmark's own whose check no controller
decides (``controller_testbed_bench.queue_of_its_own``); each kind of write is then made once to every
Workload, 16 at a time, twice (rounds). Reported per write: the CPU of each testbed process (from /proc) over
the round plus three seconds for the watchers' reactions, the wall time, and what the API server counted
(``apiserver_request_total``) by verb: among them the dry-run Workload creates Kueue's TrainJob integration
makes each time a TrainJob's Workload changes. Also reported: the rate at which the machine's cores could
decide if the controller itself cost nothing (cores / the cluster's CPU for one check write and one Event),
the ceiling of decisions per second here.

Run with the testbed up: ``python -m bench.workload_write_cost_bench [--workloads 400]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from dispatch import AsyncAdapter, JobSpec, testbed
from dispatch import _kube as k

from .controller_testbed_bench import component_cpu, queue_of_its_own, remove_queue, reserved, state

JSON_PATCH = "application/json-patch+json"
SETTLE_SECONDS = 3.0
"""After a round, how long the watchers (Kueue, JobSet, Trainer, ...) get to react inside the measured window."""


def request_counts(kubeconfig: str) -> dict[str, float]:
    """The API server's request counters for Workloads and Events, by verb, subresource and dry run."""
    text = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "get", "--raw", "/metrics"],
                          capture_output=True, text=True, check=True).stdout
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
        resource = labels.get("resource", "").strip('"')
        if resource not in ("workloads", "events"):
            continue
        key = " ".join(x for x in (labels["verb"].strip('"'), resource, labels.get("subresource", "").strip('"'),
                                   "dry-run" if labels.get("dry_run", "").strip('"') else "") if x)
        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workloads", type=int, default=400)
    p.add_argument("--rounds", type=int, default=2)
    a = p.parse_args()
    if not testbed.is_up():
        raise SystemExit("the testbed is not up")
    path = str(testbed.kubeconfig_path())
    ns = f"write-bench-{uuid.uuid4().hex[:6]}"
    kube = k.Kube.connect(namespace=ns, kubeconfig=path)
    await queue_of_its_own(kube, ns)
    adapter = AsyncAdapter(kube)
    sem = asyncio.Semaphore(16)
    try:
        async def open_one(i: int) -> None:
            async with sem:
                await adapter.open(JobSpec(job_id="bench", submission=f"s{i}", queue="lq",
                                           resources_per_node={"cpu": "10m"}))
        await asyncio.gather(*(open_one(i) for i in range(a.workloads)))
        deadline = time.monotonic() + 300 + a.workloads
        while True:
            wls = (await kube.list(k.WORKLOADS)).items
            if len(wls) == a.workloads and all(reserved(w) and state(w) == "Pending" for w in wls):
                break
            if time.monotonic() > deadline:
                raise SystemExit("Kueue did not reserve quota for every Workload in time")
            await asyncio.sleep(2)
        workload_bytes = len(json.dumps(wls[0]))
        await asyncio.sleep(10)  # JobSet, Trainer and the Job controller settle after the reservations

        def entry(message: str) -> dict[str, Any]:
            return {"name": ns, "state": "Pending", "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}

        # Unconditioned (no resourceVersion): Kueue writes the same Workloads, and a 409 here would make the
        # kinds unequal. The controller's write is conditioned; the condition costs the API server nothing.
        async def ssa(w: dict[str, Any], message: str) -> None:
            await kube.apply(k.WORKLOADS, w["metadata"]["name"], {
                "apiVersion": k.WORKLOADS.api_version, "kind": "Workload",
                "metadata": {"name": w["metadata"]["name"], "namespace": ns},
                "status": {"admissionChecks": [entry(message)]}},
                sub="status", field_manager="dispatch-write-bench", force=True, answer=False)

        async def json_patch(w: dict[str, Any], message: str) -> None:
            index = [c["name"] for c in w["status"]["admissionChecks"]].index(ns)
            await kube._send("PATCH", k.WORKLOADS.path(ns, w["metadata"]["name"], "status"), body=[
                {"op": "test", "path": f"/status/admissionChecks/{index}/name", "value": ns},
                {"op": "replace", "path": f"/status/admissionChecks/{index}/message", "value": message}],
                content_type=JSON_PATCH, retry=False)

        async def event(w: dict[str, Any], message: str) -> None:
            await kube.create(k.EVENTS, {
                "metadata": {"generateName": "write-bench-"}, "type": "Normal", "reason": "AdmissionDelayed",
                "message": message, "source": {"component": "write-bench"},
                "involvedObject": {"apiVersion": k.WORKLOADS.api_version, "kind": "Workload",
                                   "name": w["metadata"]["name"], "namespace": ns}})

        async def get(w: dict[str, Any], _message: str) -> None:
            await kube.get(k.WORKLOADS, w["metadata"]["name"])

        kinds: dict[str, Callable[[dict[str, Any], str], Awaitable[None]]] = {
            "ssa": ssa, "json_patch": json_patch, "event": event, "get": get}
        rounds: list[dict[str, Any]] = []
        # One unreported round of the controller's write first: the first writes after the setup meet JobSet,
        # Trainer and Kueue still settling the new objects, and would weigh on whichever kind came first.
        async def warm(w: dict[str, Any]) -> None:
            async with sem:
                await ssa(w, "warm-up")
        await asyncio.gather(*(warm(w) for w in (await kube.list(k.WORKLOADS)).items))
        await asyncio.sleep(2 * SETTLE_SECONDS)
        for r in range(a.rounds):
            for name, write in kinds.items():
                wls = (await kube.list(k.WORKLOADS)).items
                await asyncio.sleep(SETTLE_SECONDS)
                counts0, cpu0, started = request_counts(path), component_cpu(), time.monotonic()

                async def one(w: dict[str, Any], write: Callable[[dict[str, Any], str], Awaitable[None]] = write,
                              name: str = name, r: int = r) -> None:
                    async with sem:
                        await write(w, f"{name} {r}: waiting for pods of the previous execution: "
                                       f"trainjob-{w['metadata']['name']}-node-0-0 on node-0 (Running)")
                await asyncio.gather(*(one(w) for w in wls))
                wall = time.monotonic() - started
                await asyncio.sleep(SETTLE_SECONDS)
                cpu1, counts1 = component_cpu(), request_counts(path)
                n = len(wls)
                rounds.append({
                    "round": r, "kind": name, "writes": n, "wall_ms_per_write": round(1000 * wall / n, 2),
                    "cpu_ms_per_write": {c: round(1000 * (cpu1[c] - cpu0.get(c, 0.0)) / n, 2) for c in sorted(cpu1)
                                         if cpu1[c] - cpu0.get(c, 0.0) >= 0.02},
                    "requests_per_write": {key: round((counts1[key] - counts0.get(key, 0.0)) / n, 2)
                                           for key in sorted(counts1) if counts1[key] - counts0.get(key, 0.0) >= 1},
                })

        def mean(kind: str, component: str | None = None) -> float:
            rows: list[dict[str, float]] = [x["cpu_ms_per_write"] for x in rounds if x["kind"] == kind]
            total = [row.get(component, 0.0) if component else sum(row.values()) for row in rows]
            return sum(total) / len(total)

        api_ssa, api_patch = mean("ssa", "kube-apiserver"), mean("json_patch", "kube-apiserver")
        wait_decision = mean("ssa") + mean("event")
        cores = os.cpu_count() or 1
        report = {
            "workloads": a.workloads, "workload_json_bytes": workload_bytes, "machine_cores": cores,
            "load_average": os.getloadavg(), "rounds": rounds,
            "apiserver_cpu_ms_per_write": {kind: round(mean(kind, "kube-apiserver"), 2) for kind in kinds},
            "cluster_cpu_ms_per_write": {kind: round(mean(kind), 2) for kind in kinds},
            "ratio_apiserver_cpu_json_patch_vs_ssa": round(api_patch / api_ssa, 2) if api_ssa else None,
            # One check write and one Event: what the cluster spends on a first "wait" decision besides the
            # controller; the decisions/s the machine's cores could give if the controller cost nothing.
            "cluster_cpu_ms_per_wait_decision_without_controller": round(wait_decision, 2),
            "decisions_per_second_ceiling_on_these_cores": round(1000 * cores / wait_decision, 1)
            if wait_decision else None,
        }
        print(json.dumps(report, indent=2))
    finally:
        for tj in (await kube.list(k.TRAINJOBS)).items:
            await kube.delete(k.TRAINJOBS, tj["metadata"]["name"])
        await remove_queue(kube, ns)
        await kube.aclose()


if __name__ == "__main__":
    asyncio.run(main())
