"""What the guard (the validating webhook) adds to a release and to a Kueue admission, on the testbed.

One controller process (``--guard-port``) runs throughout; the guard is switched on and off by pointing
its webhook configuration's namespaceSelector at the benchmark's namespace or away, in alternating blocks, so
both figures come from the same run, the same objects and the same API server:

* **release**: ``dispatch release`` of a held plain-mode TrainJob whose pods have gone (the call's whole
  duration: its reads, the record and the raise, and the unsuspend that the guard now checks with its
  own consistent read);
* **Kueue admission**: from ``dispatch release`` of a held Kueue-mode TrainJob (its Workload
  reactivated) to the TrainJob unsuspended by Kueue (through dispatch's check, then the guard).

Run with the testbed up: ``python -m bench.guard_bench [--rounds 10]``; prints one JSON object with
each figure's median and p90 with and without the guard, and their ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

from dispatch import AsyncAdapter, JobSpec
from dispatch import _api as api
from dispatch import _kube as k
from dispatch.testbed.harness import (
    controller_env,
    free_port,
    pods_of,
    probe_denied,
    running_testbed_kubeconfig,
    scoped,
    subprocess_controller,
    until,
)


async def _suspended(kube: k.Kube, name: str, want: bool) -> bool:
    return bool((await kube.get(k.TRAINJOBS, name))["spec"].get("suspend")) is want


async def _no_pods(kube: k.Kube, name: str) -> bool:
    return not await pods_of(kube, name)


async def _cycle(kube: k.Kube, adapter: AsyncAdapter, name: str, measure: Callable[[], Awaitable[float]]) -> float:
    """Hold, wait for the pods to go, then time one start."""
    await adapter.hold(name)
    await until(lambda: _suspended(kube, name, True), what="held")
    await until(lambda: _no_pods(kube, name), what="pods gone")
    await until(lambda: _settled(adapter, name), what="lower layers confirmed suspended")
    return await measure()


async def _settled(adapter: AsyncAdapter, name: str) -> bool:
    """Nothing but the hold stands in the way (plain: status says Held; Kueue: no pod or layer named)."""
    status = await adapter.inspect(name)
    return status.cause.reason in ("Held", "Queued") or (
        status.cause.reason == "AdmissionCheckPending" and "waiting for" not in status.cause.detail)


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 1), "p90_ms": round(p90 * 1000, 1), "n": len(ordered)}


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=10, help="starts measured per figure and per setting")
    p.add_argument("--blocks", type=int, default=2, help="alternating off/on blocks the rounds are split into")
    a = p.parse_args()
    path = running_testbed_kubeconfig()
    if path is None:
        raise SystemExit("the testbed is not up (python -m dispatch.testbed up)")
    per_block = max(1, a.rounds // a.blocks)
    samples: dict[str, dict[str, list[float]]] = {fig: {"off": [], "on": []} for fig in ("release", "kueue")}
    async with controller_env(path) as (kube, ns, _):
        port, name = free_port(), f"dispatch-guard-{ns}"
        hook, _policy, _binding = scoped(ns, port, name)
        adapter = AsyncAdapter(kube)
        with tempfile.TemporaryDirectory() as tmp:
            metrics_port = free_port()
            async with subprocess_controller(ns, "--guard-port", str(port), "--guard-cert-dir", str(Path(tmp) / "c"),
                                             "--guard-webhook", name, "--metrics-port", str(metrics_port)):
                await adapter.open(JobSpec(job_id="plain", submission="s1"))
                await until(lambda: _settled(adapter, "plain-s1"), what="plain opened")
                await adapter.release("plain-s1")
                await adapter.open(JobSpec(job_id="queued", submission="s1", queue="lq"))
                await until(lambda: _suspended(kube, "queued-s1", False), what="queued running")

                async def release() -> float:
                    start = time.perf_counter()
                    await adapter.release("plain-s1")
                    return time.perf_counter() - start

                async def kueue() -> float:
                    start = time.perf_counter()
                    await adapter.release("queued-s1")
                    await until(lambda: _suspended(kube, "queued-s1", False), what="Kueue started it", poll=0.01)
                    return time.perf_counter() - start

                await kube.create(api.VALIDATING_WEBHOOKS, hook)

                async def published() -> bool:
                    got = await kube.get(api.VALIDATING_WEBHOOKS, name)
                    return all(w["clientConfig"].get("caBundle") for w in got["webhooks"])
                await until(published, timeout=120, what="CA published")
                for _ in range(a.blocks):
                    for setting in ("off", "on"):
                        await _select(kube, name, ns if setting == "on" else "no-such-namespace")
                        await until(functools.partial(_probe_is, kube, ns, setting == "on"), what=f"guard {setting}")
                        for _ in range(per_block):
                            samples["release"][setting].append(await _cycle(kube, adapter, "plain-s1", release))
                            samples["kueue"][setting].append(await _cycle(kube, adapter, "queued-s1", kueue))
                await kube.delete(api.VALIDATING_WEBHOOKS, name)
                answered = _scrape(metrics_port)
    out: dict[str, object] = {"rounds_per_setting": per_block * a.blocks, "guard_answers": answered}
    for fig, by in samples.items():
        off, on = summary(by["off"]), summary(by["on"])
        out[fig] = {"without_guard": off, "with_guard": on,
                    "ratio_p50": round(on["p50_ms"] / off["p50_ms"], 2) if off["p50_ms"] else None,
                    "ratio_p90": round(on["p90_ms"] / off["p90_ms"], 2) if off["p90_ms"] else None}
    print(json.dumps(out, indent=2))


def _scrape(port: int) -> dict[str, float]:
    """The guard's own figures from the controller's /metrics: answers by kind, mean answer time."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("dispatch_guard_"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    count = values.get("dispatch_guard_review_seconds_count", 0.0)
    out = {k.split("answer=")[1].strip('"}'): v for k, v in values.items()
           if k.startswith("dispatch_guard_reviews_total{")}
    total = values.get("dispatch_guard_review_seconds_sum", 0.0)
    out["mean_answer_ms"] = round(total / count * 1000, 1) if count else 0.0
    return out


async def _probe_is(kube: k.Kube, ns: str, denied: bool) -> bool:
    return await probe_denied(kube, ns) is denied


async def _select(kube: k.Kube, name: str, ns: str) -> None:
    """Point the guard's namespaceSelector at ``ns`` (another name switches it off, caBundle kept)."""
    obj = await kube.get(api.VALIDATING_WEBHOOKS, name)
    for hook in obj["webhooks"]:
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": ns}}
    await kube.merge_patch(api.VALIDATING_WEBHOOKS, name, {
        "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}, "webhooks": obj["webhooks"]})


if __name__ == "__main__":
    asyncio.run(main())
