"""The controller's Prometheus metrics, on a registry of its own so two controllers can share a process.

Besides dispatch's own ``dispatch_*`` series, the ones operators already dashboard for every controller,
under controller-runtime's (client-go's) names and labels, so stock dashboards and alerts read dispatch as
they read Kueue or JobSet: ``controller_runtime_reconcile_*`` and ``controller_runtime_active_workers``
(per reconciler: ``workloads``, ``pod-finalizers``), ``controller_runtime_webhook_*`` (the guard's paths,
:class:`WebhookMetrics`), ``rest_client_requests_total{code,host,method}`` and
``rest_client_request_duration_seconds{verb,host}`` (API requests; dispatch's own
``dispatch_api_requests_total`` keeps them by resource), ``workqueue_*`` (the work queues) and
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
    early_reads: Counter
    leader: Gauge
    queue_depth: Gauge
    batch_size: Histogram
    build_info: Gauge
    queue_gaps: Gauge
    held_pods: Gauge
    held_longest: Gauge
    api_requests: Counter
    api_seconds: Histogram
    rest_requests: Counter
    rest_seconds: Histogram
    queue: QueueMetrics
    leader_status: Gauge
    runtime: RuntimeMetrics

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
            early_reads=Counter(
                "dispatch_early_reads",
                "Lower layers read at once with a lone Workload's TrainJob, by outcome: used (the TrainJob was still "
                "at the version seen before), stale (read again after it) or failed.", ["outcome"], registry=reg,
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
                "dispatch_api_requests", "API server requests, by status code, method and resource.",
                ["code", "method", "resource"], registry=reg,
            ),
            api_seconds=Histogram(
                "dispatch_api_request_duration_seconds",
                "API server request latency (to the response's headers), by verb and resource.",
                ["verb", "resource"], buckets=_LATENCY_BUCKETS, registry=reg,
            ),
            rest_requests=Counter(
                "rest_client_requests", "API server requests, by status code, method and host (client-go's).",
                ["code", "host", "method"], registry=reg,
            ),
            rest_seconds=Histogram(
                "rest_client_request_duration_seconds",
                "API server request latency (to the response's headers), by verb and host (client-go's).",
                ["verb", "host"], buckets=_LATENCY_BUCKETS, registry=reg,
            ),
            queue=QueueMetrics.create(reg),
            leader_status=Gauge(
                "leader_election_master_status", "1 while this replica holds the Lease `name`, else 0.",
                ["name"], registry=reg,
            ),
            runtime=RuntimeMetrics.create(reg),
        )


RESULTS = ("success", "error", "requeue", "requeue_after")
"""controller-runtime's ``result`` label values."""


@dataclass
class RuntimeMetrics:
    """controller-runtime's reconciler series, labelled by ``controller`` (``workloads``, ``pod-finalizers``)."""

    total: Counter
    errors: Counter
    seconds: Histogram
    active: Gauge
    max_concurrent: Gauge

    @classmethod
    def create(cls, reg: CollectorRegistry) -> RuntimeMetrics:
        return cls(
            total=Counter("controller_runtime_reconcile", "Reconciles, by controller and result (success, error, "
                          "requeue, requeue_after).", ["controller", "result"], registry=reg),
            errors=Counter("controller_runtime_reconcile_errors", "Reconciles that ended in an error.",
                           ["controller"], registry=reg),
            seconds=Histogram("controller_runtime_reconcile_time_seconds", "Time of one reconcile.",
                              ["controller"], buckets=_LATENCY_BUCKETS, registry=reg),
            active=Gauge("controller_runtime_active_workers", "Workers reconciling now.", ["controller"],
                         registry=reg),
            max_concurrent=Gauge("controller_runtime_max_concurrent_reconciles", "Workers of the controller.",
                                 ["controller"], registry=reg),
        )

    def declare(self, controller: str, workers: int) -> None:
        """Every series of ``controller`` at zero (a dashboard's rate() needs the series before the first
        event), and its worker count."""
        for result in RESULTS:
            self.total.labels(controller, result)
        self.errors.labels(controller)
        self.seconds.labels(controller)
        self.active.labels(controller).set(0)
        self.max_concurrent.labels(controller).set(workers)

    def reconciled(self, controller: str, result: str, seconds: float | None = None) -> None:
        self.total.labels(controller, result).inc()
        if result == "error":
            self.errors.labels(controller).inc()
        if seconds is not None:
            self.seconds.labels(controller).observe(seconds)


@dataclass
class WebhookMetrics:
    """controller-runtime's webhook series, labelled by ``webhook`` (the path the API server calls)."""

    requests: Counter
    latency: Histogram
    in_flight: Gauge

    @classmethod
    def create(cls, reg: CollectorRegistry) -> WebhookMetrics:
        return cls(
            requests=Counter("controller_runtime_webhook_requests", "Admission requests, by webhook path and "
                             "HTTP status code.", ["webhook", "code"], registry=reg),
            latency=Histogram("controller_runtime_webhook_latency_seconds", "Time to answer one admission "
                              "request.", ["webhook"], buckets=_LATENCY_BUCKETS, registry=reg),
            in_flight=Gauge("controller_runtime_webhook_requests_in_flight", "Admission requests being answered.",
                            ["webhook"], registry=reg),
        )


@dataclass
class QueueMetrics:
    """client-go's work-queue series, labelled as controller-runtime labels them: ``name`` and ``controller``,
    both the queue's name (``workloads``, ``pod-finalizers``)."""

    depth: Gauge
    adds: Counter
    queue_seconds: Histogram
    work_seconds: Histogram
    retries: Counter
    unfinished: Gauge
    longest: Gauge

    @classmethod
    def create(cls, reg: CollectorRegistry) -> QueueMetrics:
        buckets = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)
        labels = ["name", "controller"]
        return cls(
            depth=Gauge("workqueue_depth", "Keys waiting in the work queue.", labels, registry=reg),
            adds=Counter("workqueue_adds", "Keys added to the work queue.", labels, registry=reg),
            queue_seconds=Histogram("workqueue_queue_duration_seconds",
                                    "How long a key waits in the queue before a worker takes it.", labels,
                                    buckets=buckets, registry=reg),
            work_seconds=Histogram("workqueue_work_duration_seconds", "How long a worker holds a key.",
                                   labels, buckets=buckets, registry=reg),
            retries=Counter("workqueue_retries", "Keys re-queued after a failure (with backoff).", labels,
                            registry=reg),
            unfinished=Gauge("workqueue_unfinished_work_seconds", "Seconds of work in progress not yet observed "
                             "by work_duration: a large value with no rise in it means a stuck worker.", labels,
                             registry=reg),
            longest=Gauge("workqueue_longest_running_processor_seconds", "How long the longest-running worker "
                          "of the queue has held its key.", labels, registry=reg),
        )


def _build_info(registry: CollectorRegistry) -> Gauge:
    """``dispatch_build_info{version} 1``: tells which release each replica runs (during a rollout, say)."""
    gauge = Gauge("dispatch_build_info", "The running dispatch release; always 1.", ["version"], registry=registry)
    gauge.labels(version=__version__).set(1)
    return gauge
