"""The controller's Prometheus metrics, on a registry of its own so two controllers can share a process.

Besides dispatch's own ``dispatch_*`` series, the ones operators already dashboard for every controller,
under controller-runtime's (client-go's) names: ``rest_client_requests_total`` and
``rest_client_request_duration_seconds`` (API requests), ``workqueue_*`` (the work queues) and
``leader_election_master_status``. The ``*_created`` series are off: they double the series count and no
dashboard reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

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
    held_pods: Gauge
    held_longest: Gauge
    api_requests: Counter
    api_seconds: Histogram
    queue: QueueMetrics
    leader_status: Gauge

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> Metrics:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide: no *_created series
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
            held_pods=Gauge(
                "dispatch_pods_held_unproven",
                "Pods being deleted that dispatch's finalizer keeps because their end is not proven.",
                registry=reg,
            ),
            held_longest=Gauge(
                "dispatch_pods_held_unproven_longest_seconds",
                "Since when the longest-held of those pods has been deleted (0: none).", registry=reg,
            ),
            api_requests=Counter(
                "rest_client_requests", "API server requests, by status code, method and resource.",
                ["code", "method", "resource"], registry=reg,
            ),
            api_seconds=Histogram(
                "rest_client_request_duration_seconds",
                "API server request latency (to the response's headers), by verb and resource.",
                ["verb", "resource"], buckets=_LATENCY_BUCKETS, registry=reg,
            ),
            queue=QueueMetrics.create(reg),
            leader_status=Gauge(
                "leader_election_master_status", "1 while this replica holds the Lease `name`, else 0.",
                ["name"], registry=reg,
            ),
        )


@dataclass
class QueueMetrics:
    """client-go's work-queue series, labelled by queue ``name`` (``workloads``, ``pod-finalizers``)."""

    depth: Gauge
    adds: Counter
    queue_seconds: Histogram
    work_seconds: Histogram
    retries: Counter

    @classmethod
    def create(cls, reg: CollectorRegistry) -> QueueMetrics:
        buckets = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)
        return cls(
            depth=Gauge("workqueue_depth", "Keys waiting in the work queue.", ["name"], registry=reg),
            adds=Counter("workqueue_adds", "Keys added to the work queue.", ["name"], registry=reg),
            queue_seconds=Histogram("workqueue_queue_duration_seconds",
                                    "How long a key waits in the queue before a worker takes it.", ["name"],
                                    buckets=buckets, registry=reg),
            work_seconds=Histogram("workqueue_work_duration_seconds", "How long a worker holds a key.",
                                   ["name"], buckets=buckets, registry=reg),
            retries=Counter("workqueue_retries", "Keys re-queued after a failure (with backoff).", ["name"],
                            registry=reg),
        )


def _build_info(registry: CollectorRegistry) -> Gauge:
    """``dispatch_build_info{version} 1``: tells which release each replica runs (during a rollout, say)."""
    gauge = Gauge("dispatch_build_info", "The running dispatch release; always 1.", ["version"], registry=registry)
    gauge.labels(version=__version__).set(1)
    return gauge
