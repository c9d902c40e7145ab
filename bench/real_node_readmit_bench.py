"""Re-admission after the last real process exits, on the testbed's real node, plain and Kueue mode.

Each round holds an object whose one pod runs the workload on the real node (a real kubelet, containerd,
runc): the process gets SIGTERM, writes on for ``--grace`` and exits, and the process oracle records its
EXIT (the host's wall clock, in ms). Then the next execution is admitted and its process writes START.
Per round, from the process oracle's EXIT of execution A:

* ``exit_to_admitted``: to the next execution admitted: plain mode, ``release --wait`` (the CLI's
  watch-driven loop, started before the exit, run as a ``dispatch-writer``) returning; Kueue mode, the
  controller's check turning ``Ready`` (seen by this process's own watch);
* ``exit_to_first_process``: to the START line of execution A+1's process (pod creation, scheduling,
  container start: reported, not held to the floor);
* ``floor``: measured in the same run, per round: the kubelet's status write after the container
  exited (PLEG, then the pod's terminal phase reaching this process's watch), plus one admitting step
  measured alone: plain mode one ``release`` that admits at once (its reads and writes), Kueue mode the
  two webhooked writes every admission makes (TrainJob and Workload, each a write's trip to its watch
  event).

Prints one JSON object with p50/p99 of each and the ratio ``exit_to_admitted / floor`` (the issue's
target is p99 <= 1.2). Run with the testbed up and its real node running:
``python -m bench.real_node_readmit_bench [--rounds 30] [--mode plain|kueue|both] [--grace 0.3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console

from dispatch import Adapter, AsyncAdapter, JobSpec
from dispatch import _kube as k
from dispatch.cli import CliState
from dispatch.cli._release import release_wait
from dispatch.testbed import harness, oracle, realnode

RUNTIME = "readmit"
JOB, SUB = "rb", "s1"


def pct(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "p50_ms": round(statistics.median(xs) * 1000, 1), "p99_ms": pct(xs, 0.99),
            "max_ms": pct(xs, 1.0)}


def scrape(port: int) -> str:
    """The controller's /metrics text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def api_series(text: str) -> dict[tuple[str, str], tuple[float, float]]:
    """(verb, resource) -> (count, seconds) of the controller's API requests, from its /metrics text."""
    out: dict[tuple[str, str], list[float]] = {}
    for line in text.splitlines():
        for suffix, at in (("_count{", 0), ("_sum{", 1)):
            head = "dispatch_api_request_duration_seconds" + suffix
            if line.startswith(head):
                labels, value = line[len(head):].rsplit("} ", 1)
                got = dict(part.split("=", 1) for part in labels.split(","))
                key = (got["verb"].strip('"'), got["resource"].strip('"'))
                out.setdefault(key, [0.0, 0.0])[at] = float(value)
    return {key: (v[0], v[1]) for key, v in out.items()}


def per_round(before: str, after: str, rounds: int) -> dict[str, dict[str, float]]:
    """The controller's requests in the rounds, by verb and resource: how many a round and their mean
    latency to the response's headers (a watch's GET counts once, when it opens). What dispatch's share is
    made of, trip by trip."""
    b, a = api_series(before), api_series(after)
    out: dict[str, dict[str, float]] = {}
    for key in sorted(a):
        n, secs = a[key][0] - b.get(key, (0.0, 0.0))[0], a[key][1] - b.get(key, (0.0, 0.0))[1]
        if n <= 0:
            continue
        out[f"{key[0]} {key[1]}"] = {"per_round": round(n / rounds, 2), "mean_ms": round(1000 * secs / n, 1)}
    return out


def early_reads(before: str, after: str) -> dict[str, float]:
    """The controller's ``dispatch_early_reads_total`` by outcome over the rounds."""
    def series(text: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("dispatch_early_reads_total{"):
                outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
                out[outcome] = float(line.rsplit(" ", 1)[1])
        return out
    b, a = series(before), series(after)
    return {key: a[key] - b.get(key, 0.0) for key in sorted(a)}


def wall() -> float:
    return time.time()


class Clock:
    """The Recorder stamps events with ``time.monotonic()``; the oracle writes the host's wall clock in ms.
    One offset, taken once, puts both on the wall clock (same host, so no second clock is involved)."""

    def __init__(self) -> None:
        self.offset = time.time() - time.monotonic()

    def of(self, mono: float) -> float:
        return mono + self.offset


def process_of(oracle_dir: Path, admission: int) -> oracle.Process | None:
    procs = [p for p in oracle.processes(oracle.read(oracle_dir))
             if p.submission == SUB and p.admission == str(admission)]
    return procs[0] if procs else None


async def until(pred: Any, what: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def terminal_at(rec: harness.Recorder, pods: list[str], after: float) -> float | None:
    """When the last of ``pods`` first read terminal (its kubelet's status write) or went, seen by the watch."""
    return rec.gone_at(pods, after)


def quota_again(rec: harness.Recorder, workload: str, after: float) -> float | None:
    """When Kueue reserved quota again after the hold (the Workload's QuotaReserved turned True again)."""
    cleared = False
    for t, label, _, obj in rec.events:
        if label != "workload" or t < after or obj["metadata"]["name"] != workload:
            continue
        if not harness.cond(obj, "QuotaReserved"):
            cleared = True
        elif cleared:
            return t
    return None


def ready_again(rec: harness.Recorder, workload: str, after: float) -> float | None:
    """When the check turned Ready again after the hold: its first Ready after it was seen not Ready (the
    eviction resets it; until then the previous admission's Ready is still what the Workload says)."""
    reset = False
    for t, label, _, obj in rec.events:
        if label != "workload" or t < after or obj["metadata"]["name"] != workload:
            continue
        ready = harness.check_of(obj).get("state") == "Ready"
        if not ready:
            reset = True
        elif reset:
            return t
    return None


async def plain_rounds(admin: k.Kube, ns: str, oracle_dir: Path, rounds: int, clock: Clock) -> dict[str, Any]:
    rec = harness.Recorder(admin, ((k.PODS, "pod"),))
    rec.start()
    exit_to_admitted: list[float] = []
    exit_to_first: list[float] = []
    floor_status: list[float] = []
    floor_release: list[float] = []
    try:
        async with harness.role_kubeconfig(admin, ns) as text:
            with tempfile.TemporaryDirectory(prefix="readmit-roles-") as roles:
                writer_path = Path(roles) / "writer.kubeconfig"
                writer_path.write_text(text)
                await plain_loop(admin, writer_path, oracle_dir, rounds, clock, rec, exit_to_admitted,
                                 exit_to_first, floor_status, floor_release)
    finally:
        await rec.stop()
    return result("plain", exit_to_admitted, exit_to_first, floor_status, floor_release,
                  "one release that admits at once")


async def plain_loop(admin: k.Kube, writer_path: Path, oracle_dir: Path, rounds: int, clock: Clock,
                     rec: harness.Recorder, exit_to_admitted: list[float], exit_to_first: list[float],
                     floor_status: list[float], floor_release: list[float]) -> None:
    """The plain rounds, as a ``dispatch-writer`` (the synchronous library, as the CLI uses it)."""
    with Adapter.connect(admin.namespace, kubeconfig=str(writer_path)) as writer:
        name = writer.open(spec(queue=None), hold=True).name
        writer.release(name)
        await until(lambda: process_of(oracle_dir, 1), "A=1's process")
        for i in range(1, 2 * rounds + 1):
            measured = i <= rounds   # the first half waits; the second half measures one release alone
            pods = [p["metadata"]["name"] for p in await harness.pods_of(admin, name)
                    if not p["metadata"].get("deletionTimestamp")]
            mark = time.monotonic()
            done: dict[str, float] = {}
            if measured:
                def run(done: dict[str, float] = done) -> None:
                    release_wait(CliState(err=Console(quiet=True)), writer, name, timeout=300, interval=30)
                    done["admitted"] = wall()

                writer.hold(name)
                thread = threading.Thread(target=run)
                thread.start()
                proc = await until(lambda a=i: (p := process_of(oracle_dir, a)) and p.ended_ms and p,
                                   f"A={i}'s EXIT")
                await asyncio.to_thread(thread.join)
                start = await until(lambda a=i + 1: process_of(oracle_dir, a), f"A={i + 1}'s START")
                t_exit = proc.ended_ms / 1000
                exit_to_admitted.append(done["admitted"] - t_exit)
                exit_to_first.append(start.started_ms / 1000 - t_exit)
                seen = await until(lambda p=pods, m=mark: terminal_at(rec, p, m), "the old pod's terminal status")
                floor_status.append(clock.of(seen) - t_exit)
            else:
                writer.hold(name)
                await until(lambda p=pods, m=mark: terminal_at(rec, p, m), "the old pod's terminal status")
                t0 = time.perf_counter()
                writer.release(name)
                floor_release.append(time.perf_counter() - t0)
                await until(lambda a=i + 1: process_of(oracle_dir, a), f"A={i + 1}'s START")


async def kueue_rounds(admin: k.Kube, ns: str, oracle_dir: Path, rounds: int, clock: Clock) -> dict[str, Any]:
    rec = harness.Recorder(admin)
    rec.start()
    exit_to_admitted: list[float] = []
    exit_to_first: list[float] = []
    floor_status: list[float] = []
    dispatch_share: list[float] = []
    kueue_late: list[float] = []
    try:
        async with harness.as_role(admin, ns) as writer_kube, harness.subprocess_controller(ns) as launched:
            writer = AsyncAdapter(writer_kube)
            name = (await writer.open(spec(queue="lq"))).name
            await until(lambda: process_of(oracle_dir, 1), "A=1's process", timeout=180)
            metrics_before = scrape(launched.port)
            for i in range(1, rounds + 1):
                pods = [p["metadata"]["name"] for p in await harness.pods_of(admin, name)
                        if not p["metadata"].get("deletionTimestamp")]
                mark = time.monotonic()
                await writer.hold(name)
                await writer.release(name)
                proc = await until(lambda a=i: (p := process_of(oracle_dir, a)) and p.ended_ms and p, f"A={i}'s EXIT")
                wl = await harness.workload_of(admin, name)
                assert wl is not None
                ready = await until(lambda w=wl["metadata"]["name"], m=mark: ready_again(rec, w, m), "check Ready")
                start = await until(lambda a=i + 1: process_of(oracle_dir, a), f"A={i + 1}'s START", timeout=180)
                seen = await until(lambda p=pods, m=mark: terminal_at(rec, p, m), "the old pod's terminal status")
                reserved = quota_again(rec, wl["metadata"]["name"], mark)
                t_exit = proc.ended_ms / 1000
                exit_to_admitted.append(clock.of(ready) - t_exit)
                if reserved is not None:
                    # Kueue's own re-reservation is not dispatch's to shorten: from the later of the two
                    # (the old pod read ended, quota reserved again) to Ready is what the controller adds
                    dispatch_share.append(ready - max(seen, reserved))
                    kueue_late.append(max(0.0, clock.of(reserved) - t_exit))
                exit_to_first.append(start.started_ms / 1000 - t_exit)
                floor_status.append(clock.of(seen) - t_exit)
            metrics_after = scrape(launched.port)
            requests = per_round(metrics_before, metrics_after, rounds)
            early = early_reads(metrics_before, metrics_after)
            trips = await harness.webhooked_round_trips(admin, name, rounds)
            writes = [a + b for a, b in zip(trips["trainjob"], trips["workload"], strict=True)]
    finally:
        await rec.stop()
    out = result("kueue", exit_to_admitted, exit_to_first, floor_status, writes,
                 "the TrainJob and the Workload write, each to its watch event")
    out["controller_requests"] = requests
    # Lone decisions whose lower layers were read at once with the TrainJob: used (one trip less), stale
    # (the TrainJob had moved on: read again after it) or failed.
    out["early_reads"] = early
    if dispatch_share:
        share, late = summary(dispatch_share), summary(kueue_late)
        out["exit_to_quota_reserved_again"] = late
        out["ended_and_reserved_to_ready"] = share
        step = out["floor_admitting_step"]
        out["ratio_ended_and_reserved_to_ready_vs_writes"] = {
            "p50": round(share["p50_ms"] / step["p50_ms"], 2), "p99": round(share["p99_ms"] / step["p99_ms"], 2)}
    return out


def spec(queue: str | None) -> JobSpec:
    extra: dict[str, Any] = {"queue": queue} if queue else {}
    return JobSpec(job_id=JOB, submission=SUB, num_nodes=1, runtime=RUNTIME, runtime_kind="TrainingRuntime",
                   resources_per_node={"cpu": "100m", "memory": "64Mi"}, **extra)


def result(mode: str, admitted: list[float], first: list[float], status: list[float], step: list[float],
           step_is: str) -> dict[str, Any]:
    a, f, s, st = summary(admitted), summary(first), summary(status), summary(step)
    floor = {"p50_ms": round(s["p50_ms"] + st["p50_ms"], 1), "p99_ms": round(s["p99_ms"] + st["p99_ms"], 1)}
    return {
        "mode": mode,
        "exit_to_admitted": a,
        "exit_to_first_process": f,
        "floor_exit_to_terminal_status_event": s,
        "floor_admitting_step": {**st, "what": step_is},
        "floor": floor,
        "ratio_admitted_vs_floor": {"p50": round(a["p50_ms"] / floor["p50_ms"], 2),
                                    "p99": round(a["p99_ms"] / floor["p99_ms"], 2)},
    }


async def run(rounds: int, modes: list[str], grace: str) -> list[dict[str, Any]]:
    from dispatch import testbed

    node = realnode.node_name()
    kubeconfig = Path(testbed.kubeconfig_path())
    out = []
    for mode in modes:
        oracle_dir = Path(tempfile.mkdtemp(prefix="readmit-oracle-"))
        os.chmod(oracle_dir, 0o777)
        async with harness.controller_env(kubeconfig) as (admin, ns, _cq):
            await admin.create(k.RUNTIMES, realnode.training_runtime(
                RUNTIME, oracle_dir, namespace=ns, grace_period_seconds=30, grace=grace))
            clock = Clock()
            go = plain_rounds if mode == "plain" else kueue_rounds
            res = await go(admin, ns, oracle_dir, rounds, clock)
            found = oracle.overlaps(oracle.read(oracle_dir))
            res["node"] = node
            res["overlaps"] = [str(o) for o in found]
            out.append(res)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--mode", choices=["plain", "kueue", "both"], default="both")
    p.add_argument("--grace", default="0.3s", help="how long the process writes on after SIGTERM")
    a = p.parse_args()
    modes = ["plain", "kueue"] if a.mode == "both" else [a.mode]
    load = os.getloadavg()
    res = asyncio.run(run(a.rounds, modes, a.grace))
    print(json.dumps({"rounds": a.rounds, "load_before": [round(x, 2) for x in load],
                      "load_after": [round(x, 2) for x in os.getloadavg()], "results": res}, indent=2))


if __name__ == "__main__":
    main()
