"""Last blocking pod gone -> check Ready, on the testbed's real Kueue, Trainer, JobSet and API server.

One TrainJob under a ClusterQueue of the benchmark's own is held and released N times (default 30):
each time Kueue evicts it, its pod stays Terminating (the testbed's hold-delete annotation), Kueue
re-reserves quota at once, and the controller keeps the check Pending; then the pod is let go and the
benchmark's own watch times the pod's disappearance and the check's turn to Ready. Every round also
checks that the new execution's first pod appeared only after the old one went.

Baselines, measured in the same run, each a write's trip to its own watch event in this process:

* **pod write**: the API server's own floor (no webhook), the issue's baseline;
* **TrainJob write** and **Workload write**: the two writes every admission must make, through the
  webhooks that judge them on the testbed (Trainer's two and Kueue's on TrainJobs, Kueue's on Workloads
  and ``workloads/status``).

The controller's figure is one watch hop (the pod's end reaching its watch), its reads (the Workload, the
TrainJob and, once the controller's TrainJob watch has shown that TrainJob, its lower layers and identity
record, all at once; else those after the TrainJob), the floor's and the record's writes, the two writes
above, and the benchmark's own hop to see the check turn Ready. ``floor`` adds
the pod hop and the two webhooked writes: what no reading strategy can remove.

It also prints what the figure is made of: the controller's decisions by outcome, its early reads, each kind of
request it sent (count and mean latency), and its own account of each admission that waited (the "admitted" log
line's steps: the last pod's end to the decision's start, the reads, the raise, the Ready write).

Run with the testbed up: ``python -m bench.controller_latency_bench [--rounds 30]``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

from dispatch.testbed.harness import (
    controller_env,
    readmission_latencies,
    running_testbed_kubeconfig,
    watch_round_trips,
    webhooked_round_trips,
)


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 1), "p99_ms": round(p99 * 1000, 1),
            "max_ms": round(ordered[-1] * 1000, 1)}


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--log", default="", help="the controller's JSON log goes here")
    a = p.parse_args()
    path = running_testbed_kubeconfig()
    if path is None:
        raise SystemExit("the testbed is not up (python -m dispatch.testbed up)")
    log = Path(a.log) if a.log else Path(tempfile.mkdtemp(prefix="latency-bench-")) / "controller.log"
    async with controller_env(path) as (kube, ns, _):
        floor = await watch_round_trips(kube, a.rounds)
        scraped: dict[str, str] = {}
        latencies = await readmission_latencies(kube, ns, a.rounds, log=log, metrics=scraped)
        writes = await webhooked_round_trips(kube, "lat-s1", a.rounds)
    got, base = summary(latencies), summary(floor)
    tj, wl = summary(writes["trainjob"]), summary(writes["workload"])
    least = {q: round(base[q] + tj[q] + wl[q], 1) for q in ("p50_ms", "p99_ms")}
    print(json.dumps({
        "admissions": len(latencies),
        "pod_gone_to_ready": got,
        "baseline_write_to_watch_event": base,
        "ratio_p50_vs_baseline": round(got["p50_ms"] / base["p50_ms"], 1) if base["p50_ms"] else None,
        "ratio_p99_vs_baseline": round(got["p99_ms"] / base["p99_ms"], 1) if base["p99_ms"] else None,
        "target_ratio_p99_vs_baseline": 4,
        "trainjob_write_to_watch_event": tj,
        "workload_write_to_watch_event": wl,
        "floor_pod_hop_plus_both_writes": least,
        "ratio_p50_vs_floor": round(got["p50_ms"] / least["p50_ms"], 2) if least["p50_ms"] else None,
        "ratio_p99_vs_floor": round(got["p99_ms"] / least["p99_ms"], 2) if least["p99_ms"] else None,
        # The controller's decisions over the rounds by outcome, and its early reads (a lone decision's lower
        # layers read at once with the TrainJob) by outcome: what the figure is made of.
        "decisions": series(scraped.get("text", ""), "dispatch_decisions_total", "outcome"),
        "early_reads": series(scraped.get("text", ""), "dispatch_early_reads_total", "outcome"),
        # Where a decision's time goes: each kind of request the controller sent, its count and mean latency
        # to the response's headers, and the work queue's mean wait and work per key.
        "requests": request_means(scraped.get("text", "")),
        # The controller's own account of each admission that waited ("admitted" log lines): from the last pod's
        # end reaching its watch to the decision's start, its reads, the raise, the Ready write.
        "steps": steps(log),
        "queue_mean_ms": {k: mean_ms(scraped.get("text", ""), f"workqueue_{k}_duration_seconds")
                          for k in ("queue", "work")},
        "samples_ms": [round(x * 1000, 1) for x in latencies],
    }, indent=2))


def series(text: str, name: str, label: str) -> dict[str, float]:
    """``name``'s samples in a Prometheus text exposition, by the value of ``label``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and f'{label}="' in line:
            out[line.split(f'{label}="', 1)[1].split('"', 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


def steps(log: Path) -> dict[str, dict[str, float]]:
    """p50 and p99 of each step the controller's "admitted" lines time, over the admissions that waited."""
    seen: dict[str, list[float]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("msg") == "admitted" and entry.get("waited"):
            for key, value in entry.items():
                if key.endswith("_ms"):
                    seen.setdefault(key, []).append(float(value) / 1000)
    return {key: summary(values) for key, values in seen.items()}


def _samples(text: str, name: str) -> list[tuple[str, float]]:
    """(labels, value) of each sample of ``name`` (a histogram's ``_sum`` or ``_count``)."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, value = line.rsplit(" ", 1)
            out.append((head[len(name):], float(value)))
    return out


def mean_ms(text: str, name: str) -> float | None:
    """A histogram's mean over every label set, in ms."""
    total = sum(v for _, v in _samples(text, name + "_sum"))
    count = sum(v for _, v in _samples(text, name + "_count"))
    return round(total / count * 1000, 1) if count else None


def request_means(text: str) -> dict[str, dict[str, float]]:
    """``dispatch_api_request_duration_seconds`` by "VERB resource": count and mean latency (ms)."""
    sums = dict(_samples(text, "dispatch_api_request_duration_seconds_sum"))
    out: dict[str, dict[str, float]] = {}
    for labels, count in _samples(text, "dispatch_api_request_duration_seconds_count"):
        if not count:
            continue
        verb = labels.split('verb="', 1)[1].split('"', 1)[0]
        resource = labels.split('resource="', 1)[1].split('"', 1)[0]
        out[f"{verb} {resource}"] = {"count": count, "mean_ms": round(sums.get(labels, 0.0) / count * 1000, 1)}
    return dict(sorted(out.items()))


if __name__ == "__main__":
    asyncio.run(main())
