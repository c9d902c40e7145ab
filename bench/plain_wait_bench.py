"""Plain-mode waiting on the in-process fake: last pod gone → admitted, for ``release --wait``.

For each of ``--rounds`` held objects with one Terminating pod, ``release --wait`` (the CLI's loop over
the synchronous adapter) runs in a thread and blocks after its first refused attempt; the kubelet then
confirms the pod's termination (the pod object goes, time t0) and the time until ``release_wait``
returns admitted (t1) is taken. Measured three ways in the same run:

* ``watched``: watch-driven waiting (the poll interval is 1,000 s: only an event can wake it);
* ``polled``: the previous behaviour, a re-attempt every ``--interval`` (default 1 s);
* ``baseline``: write → watch event, the time from a pod write to its event reaching a watching client;
* ``floor``: one ``release`` that admits at once (its reads and writes), so the watched figure can be
  read as baseline + floor + what waiting adds.

The waiter runs under the shipped ``dispatch-writer`` role, as a CLI user does.

Run: ``python -m bench.plain_wait_bench [--rounds 30] [--interval 1.0]``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from typing import Any

from rich.console import Console

from dispatch import Adapter, JobSpec
from dispatch import _kube as k
from dispatch import _names as n
from dispatch._adapter import Following
from dispatch.cli import CliState
from dispatch.cli._release import release_wait
from dispatch.testing import FakeCluster

LONG = 1000.0
WRITER = ("dispatch-writer", "dispatch-node-reader")


def pct(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


def summary(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(xs) * 1000, 2), "p99_ms": pct(xs, 0.99), "max_ms": pct(xs, 1.0)}


def held(adapter: Adapter, cluster: FakeCluster, i: int) -> tuple[str, str]:
    name = f"obj{i}-s1"
    adapter.open(JobSpec(job_id=f"obj{i}", submission="s1"), hold=False)
    cluster.settle()
    pod = str(cluster.pods(name)[0]["metadata"]["name"])
    adapter.hold(name)
    cluster.settle()
    return name, pod


def one_release(adapter: Adapter, cluster: FakeCluster, i: int, *, watched: bool, interval: float) -> float:
    name, pod = held(adapter, cluster, i)
    blocked = threading.Event()
    done: dict[str, float] = {}
    state = CliState(err=Console(quiet=True))

    def run() -> None:
        if watched:
            release_wait(state, adapter, name, timeout=2 * LONG, interval=LONG)
        else:
            def sleep(seconds: float) -> None:
                blocked.set()
                time.sleep(seconds)
            release_wait(state, adapter, name, timeout=2 * LONG, interval=interval, sleep=sleep)
        done["t1"] = time.perf_counter()

    thread = threading.Thread(target=run)
    thread.start()
    blocked.wait(60)
    time.sleep(0.02 + (interval * (i % 10) / 10 if not watched else 0.0))   # polled: spread over the period
    cluster.advance(31)
    t0 = time.perf_counter()
    cluster.confirm_termination(pod)
    thread.join()
    return done["t1"] - t0


def baseline(cluster: FakeCluster, rounds: int) -> list[float]:
    """Write → watch event on the same fake, through the same client stack (a watch of a pod selection)."""
    cluster.server.create("", "pods", "default", {"metadata": {"name": "probe", "labels": {
        n.JOBSET_NAME_LABEL: "probe"}}, "spec": {}, "status": {"phase": "Running"}})
    got = threading.Event()
    stamps: list[float] = []
    ready = threading.Event()

    async def watch() -> None:
        kube = k.Kube.connect(namespace="default", transport=cluster.transport())
        rv = (await kube.list(k.PODS, labels=f"{n.JOBSET_NAME_LABEL}=probe")).resource_version
        ready.set()
        async for etype, _obj in kube.watch(k.PODS, resource_version=rv, labels=f"{n.JOBSET_NAME_LABEL}=probe",
                                            timeout_seconds=600):
            if etype == "MODIFIED":
                stamps.append(time.perf_counter())
                got.set()
                if len(stamps) >= rounds:
                    break
        await kube.aclose()

    thread = threading.Thread(target=lambda: asyncio.run(watch()))
    thread.start()
    ready.wait(30)
    time.sleep(0.1)
    out = []
    for i in range(rounds):
        got.clear()

        def touch(obj: dict[str, Any], i: int = i) -> None:
            obj["metadata"].setdefault("annotations", {})["round"] = str(i)
        t0 = time.perf_counter()
        cluster.server.update("", "pods", "default", "probe", touch)
        got.wait(30)
        out.append(stamps[-1] - t0)
        time.sleep(0.01)
    thread.join()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--interval", type=float, default=1.0)
    a = p.parse_args()
    import logging

    import structlog
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    cluster = FakeCluster()
    cluster.add_runtime()
    cluster.add_node("node-0")
    original = Following.changed
    blocked_now: list[threading.Event] = []

    def changed(self: Following, timeout: float) -> bool:
        if blocked_now:
            blocked_now[-1].set()
        return original(self, timeout)

    Following.changed = changed  # type: ignore[method-assign]
    watched: list[float] = []
    polled: list[float] = []
    # the shipped roles a CLI user is bound to: what they allow (watching pods) is what waiting gets
    with Adapter.connect("default", transport=cluster.transport(roles=WRITER)) as adapter:
        for i in range(a.rounds):
            # the watched waiter signals "blocked" from its follower
            ev = threading.Event()
            blocked_now.append(ev)
            name, pod = held(adapter, cluster, 1000 + i)
            done: dict[str, float] = {}

            def run(name: str = name, done: dict[str, float] = done) -> None:
                release_wait(CliState(err=Console(quiet=True)), adapter, name, timeout=2 * LONG, interval=LONG)
                done["t1"] = time.perf_counter()

            thread = threading.Thread(target=run)
            thread.start()
            ev.wait(60)
            time.sleep(0.02)
            cluster.advance(31)
            t0 = time.perf_counter()
            cluster.confirm_termination(pod)
            thread.join()
            watched.append(done["t1"] - t0)
        release_call: list[float] = []
        for i in range(a.rounds):   # the floor: one release that admits at once, no waiting
            name, pod = held(adapter, cluster, 2000 + i)
            cluster.advance(31)
            cluster.confirm_termination(pod)
            t0 = time.perf_counter()
            adapter.release(name)
            release_call.append(time.perf_counter() - t0)
        for i in range(a.rounds):
            polled.append(one_release(adapter, cluster, i, watched=False, interval=a.interval))
    base = baseline(cluster, a.rounds)
    w, pl, b, rc = summary(watched), summary(polled), summary(base), summary(release_call)
    print(json.dumps({
        "rounds": a.rounds,
        "watched_pod_gone_to_admitted": w,
        "polled_pod_gone_to_admitted": {**pl, "interval_s": a.interval},
        "baseline_write_to_watch_event": b,
        "floor_one_admitting_release": rc,
        "ratio_watched_vs_event_plus_release": {"p50": round(w["p50_ms"] / (b["p50_ms"] + rc["p50_ms"]), 2),
                                                "p99": round(w["p99_ms"] / (b["p99_ms"] + rc["p99_ms"]), 2)},
        "ratio_watched_vs_baseline": {"p50": round(w["p50_ms"] / b["p50_ms"], 1),
                                      "p99": round(w["p99_ms"] / b["p99_ms"], 1)},
        "ratio_polled_vs_watched": {"p50": round(pl["p50_ms"] / w["p50_ms"], 1)},
        "note": "watched = one watch event + one release (its consistent read and three writes) on the fake",
    }, indent=2))


if __name__ == "__main__":
    main()
