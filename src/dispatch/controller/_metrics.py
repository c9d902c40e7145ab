"""The controller's Prometheus metrics, on a registry of its own so two controllers can share a process."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .. import __version__

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_WAIT_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)


@dataclass
class Metrics:
    registry: CollectorRegistry
    admissions: Counter
    decisions: Counter
    waiting: Gauge
    longest_wait: Gauge
    wait_seconds: Histogram
    pod_gone_to_ready: Histogram
    reconcile_seconds: Histogram
    errors: Counter
    writes: Counter
    leader: Gauge
    queue_depth: Gauge
    batch_size: Histogram
    build_info: Gauge
    queue_gaps: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> Metrics:
        reg = registry if registry is not None else CollectorRegistry()
        return cls(
            registry=reg,
            admissions=Counter(
                "dispatch_admissions", "Admission checks set Ready (one per admission).", registry=reg
            ),
            decisions=Counter(
                "dispatch_decisions", "Reconciles of a Workload, by outcome.", ["outcome"], registry=reg
            ),
            waiting=Gauge(
                "dispatch_workloads_waiting",
                "Workloads whose check stays Pending because pods of the previous execution remain.",
                registry=reg,
            ),
            longest_wait=Gauge(
                "dispatch_workloads_longest_wait_seconds",
                "How long the longest-waiting Workload has waited so far.", registry=reg,
            ),
            wait_seconds=Histogram(
                "dispatch_workload_wait_seconds",
                "From the check's turning Pending to Ready, for admissions that waited for pods.",
                buckets=_WAIT_BUCKETS, registry=reg,
            ),
            pod_gone_to_ready=Histogram(
                "dispatch_last_pod_gone_to_ready_seconds",
                "From the watch event of the last blocking pod's disappearance to the check set Ready.",
                buckets=_LATENCY_BUCKETS, registry=reg,
            ),
            reconcile_seconds=Histogram(
                "dispatch_reconcile_seconds", "Duration of one reconcile.", buckets=_LATENCY_BUCKETS,
                registry=reg,
            ),
            errors=Counter(
                "dispatch_reconcile_errors", "Failed reconciles, by reason.", ["reason"], registry=reg
            ),
            writes=Counter(
                "dispatch_api_writes", "Writes the controller sent, by kind.", ["kind"], registry=reg
            ),
            leader=Gauge("dispatch_leader", "1 while this replica leads, else 0.", registry=reg),
            queue_depth=Gauge("dispatch_queue_depth", "Workloads waiting in the work queue.", registry=reg),
            batch_size=Histogram(
                "dispatch_batch_size", "Workloads decided from one shared read.",
                buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=reg,
            ),
            build_info=_build_info(reg),
            queue_gaps=Gauge(
                "dispatch_clusterqueues_skipping_check",
                "ClusterQueues naming dispatch's check that let some Workloads be admitted without it.",
                registry=reg,
            ),
        )


def _build_info(registry: CollectorRegistry) -> Gauge:
    """``dispatch_build_info{version} 1``: tells which release each replica runs (during a rollout, say)."""
    gauge = Gauge("dispatch_build_info", "The running dispatch release; always 1.", ["version"], registry=registry)
    gauge.labels(version=__version__).set(1)
    return gauge
