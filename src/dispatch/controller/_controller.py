"""The long-running loop: list+watch, map events to Workloads, de-duplicate, reconcile.

Watches only *route* work: a pod's deletion, a Node's change or a Workload's update puts the affected
Workload's key on the queue. The decision itself always re-reads the API consistently (``_reconcile``),
so a stale or reordered watch cache can delay an admission but never cause a wrong one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from .. import _api as api
from .. import _kube as k
from .. import _names as n
from .._api import Obj
from .._controller_options import DEFAULTS as OPTION_DEFAULTS
from .._controller_options import ControllerOptions
from .._fleet import Connect, Fleet
from ..errors import DispatchError, Forbidden
from ._apimetrics import hooks as api_hooks
from ._checks import ACTIVE_MESSAGE, ACTIVE_REASON, CheckKeeper
from ._events import EventRecorder
from ._finalizers import POD_FINALIZERS, FinalizerKeeper
from ._guard import ClientAuth, Running, start
from ._http import MetricsServing, serve, serve_metrics
from ._informer import Informer, Pages, Sink, Tee, error_reason
from ._leader import LeaderElector
from ._metrics import Metrics
from ._queue import WorkQueue
from ._reconcile import ForeignPolicy, Outcome, Reconciler, now_text
from ._routing import RoutedWorkload, Router
from ._versions import TrainJobVersions

log = structlog.get_logger("dispatch.controller")


__all__ = ["ACTIVE_MESSAGE", "ACTIVE_REASON", "DEFAULTS", "LOG_LEVEL", "METRICS_PORT", "Config", "Controller",
           "default_identity"]


def default_identity() -> str:
    """Pod name (the hostname in Kubernetes) plus a random suffix, unique across restarts."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


_O = OPTION_DEFAULTS


DEFAULT_PAGE = 500
"""Objects a list page asks for (client-go's reflector's page)."""
LARGE_PAGE = 100
"""The page of the kinds whose objects are large (a pod or a Workload decodes to tens of KiB) and many: each page
is decoded whole before the sinks keep their slim views, and the two pod selections list at once, so pages of
500 made the controller's memory peak (and, freed in pieces, stay) ~2.5x what it keeps (issue 37: 33.6 against
12.7 MiB above the process at 10,000 pods)."""


@dataclass(frozen=True)
class Config:
    """How the controller runs. ``namespace=None`` serves Workloads in every namespace.

    The settings a person sets come from :class:`ControllerOptions` (:meth:`from_options`), which also
    holds their defaults; the rest are tuning for tests and embedding."""

    namespace: str | None = None
    workers: int = _O.workers
    batch: int = _O.batch
    """Up to this many queued Workloads of one namespace are decided from one shared read (1: one each)."""
    leader_elect: bool = False
    lease_name: str = _O.lease_name
    lease_namespace: str = _O.lease_namespace
    identity: str = ""
    lease_seconds: float = 15.0
    renew_deadline: float = 10.0
    retry_seconds: float = 2.0
    resync_seconds: float = _O.resync_seconds
    """Safety net only: every Pending Workload is re-checked this often even without an event."""
    watch_timeout_seconds: int = 300
    sync_wait_seconds: float = 30.0
    """Workers start once every informer has listed, or after this long regardless."""
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = None
    """None serves no HTTP; 0 picks a free port (tests)."""
    metrics_serving: MetricsServing | None = None
    """/metrics on a listener of its own (localhost, or HTTPS with TokenReview/SubjectAccessReview)."""
    foreign: ForeignPolicy = "ready" if _O.foreign == "ready" else "ignore"
    events: bool = True
    field_manager: str = n.FIELD_MANAGER
    controller_name: str = _O.controller_name
    """AdmissionChecks with this ``spec.controllerName`` are ours (another name isolates a canary or a test)."""
    guard_port: int | None = _O.guard_port
    """Serve the guard (the validating webhook, ``_guard``) over HTTPS on this port; None: no guard."""
    guard_host: str = "0.0.0.0"
    guard_cert_dir: str = _O.guard_cert_dir
    """``tls.crt``/``tls.key`` here are used (cert-manager); else a CA and certificate are made here ("": a
    private temporary directory)."""
    guard_webhook: str = _O.guard_webhook
    """The ValidatingWebhookConfiguration whose caBundle the controller keeps ("": someone else does)."""
    kueue_namespace: str = _O.kueue_namespace
    """Kueue's namespace, where the Secrets holding MultiKueue workers' kubeconfigs are."""
    multikueue_worker: bool = _O.multikueue_worker
    """This cluster is a MultiKueue worker: the guard judges MultiKueue's copies as copies (``_decision.guard``)."""
    guard_service: str = _O.guard_service
    """The guard's Service (in ``lease_namespace``), whose names a generated serving certificate carries."""
    guard_hosts: tuple[str, ...] = ()
    """The names a generated serving certificate is valid for (empty: ``guard_hosts_in(lease_namespace,
    guard_service)``, the guard Service in the controller's own namespace)."""
    guard_client_ca: str | None = _O.guard_client_ca
    """A PEM file of CAs: the guard answers only callers with a client certificate one of them signed
    (``_guard.ClientAuth``); None asks for none."""
    guard_client_names: str = _O.guard_client_names
    """Comma-separated names a caller's certificate must carry (with ``guard_client_ca``; "": any)."""

    def guard_clients(self) -> ClientAuth | None:
        """The guard's client verification, or None; a ValueError naming the option when it cannot be loaded
        (a file that holds no CA, names without a CA)."""
        if self.guard_client_ca is None:
            if self.guard_client_names.strip():
                raise ValueError("--guard-client-names needs --guard-client-ca: names are checked in a certificate "
                                 "the CA verified")
            return None
        return ClientAuth.load(self.guard_client_ca, self.guard_client_names)

    @classmethod
    def from_options(cls, o: ControllerOptions, *, metrics_serving: MetricsServing | None = None) -> Config:
        """The controller's configuration from its command-line settings (the identity made unique when
        none is given, metrics served next to the probes unless ``metrics_serving``)."""
        return cls(
            namespace=o.namespace, workers=o.workers, batch=o.batch, leader_elect=o.leader_elect,
            lease_name=o.lease_name, lease_namespace=o.lease_namespace, identity=o.identity or default_identity(),
            resync_seconds=o.resync_seconds, metrics_port=o.metrics_port,
            foreign="ready" if o.foreign == "ready" else "ignore", controller_name=o.controller_name,
            metrics_serving=metrics_serving, guard_port=o.guard_port, guard_cert_dir=o.guard_cert_dir,
            guard_webhook=o.guard_webhook, guard_service=o.guard_service, kueue_namespace=o.kueue_namespace,
            multikueue_worker=o.multikueue_worker, guard_client_ca=o.guard_client_ca,
            guard_client_names=o.guard_client_names,
        )


GUARD_SERVICE = "dispatch-guard"


def guard_hosts_in(namespace: str, service: str = GUARD_SERVICE) -> tuple[str, ...]:
    """The names the API server may call the guard by: its Service in ``namespace`` (where the controller
    runs, so a Helm release in another namespace, or under another name, still gets a certificate that
    matches), and loopback."""
    svc = f"{service}.{namespace}.svc"
    return svc, f"{svc}.cluster.local", "localhost", "127.0.0.1"


DEFAULTS = Config()
"""The controller's configuration with every default (those a person sets are ``ControllerOptions``')."""
METRICS_PORT = _O.metrics_port
"""The port a deployed controller serves probes and metrics on (``Config`` itself serves none)."""
LOG_LEVEL = _O.log_level


async def _cancel_all(tasks: list[asyncio.Task[None] | asyncio.Task[bool]]) -> None:
    """Cancel and reap ``tasks``, cancelling again any that swallowed the first cancellation.

    ``asyncio.wait_for`` in Python 3.11 can drop a cancellation that races with its inner future
    completing (a watch event arriving as we stop), so one ``cancel()`` is not always enough.
    """
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.2)
    for task in tasks:
        if not task.cancelled():
            with contextlib.suppress(Exception):
                task.exception()


WORKLOADS = "workloads"
"""The Workload reconciler's name in controller-runtime's series (its work queue's too)."""


def _result(result: Outcome | Exception) -> str:
    """controller-runtime's ``result`` of one Workload's reconcile: an error (raised, or a write that was
    refused), a requeue with backoff, a requeue after a set time, or success."""
    if isinstance(result, Exception) or result.error:
        return "error"
    if result.retry:
        return "requeue"
    return "requeue_after" if result.recheck is not None else "success"


class Controller:
    """The admission-check controller for dispatch's AdmissionChecks: wiring and the worker loop.

    Its parts each have one concern: informers (``_informer``) feed the router (``_routing``), which
    queues the Workloads an event may concern; workers hand batches to the Workload reconciler
    (``_reconcile``); the AdmissionCheck reconciler (``_checks``) keeps our checks Active.
    """

    def __init__(self, kube: k.Kube, config: Config | None = None, *, metrics: Metrics | None = None,
                 fleet_connect: Connect | None = None) -> None:
        """``fleet_connect`` builds a MultiKueue worker's client from its kubeconfig (tests: fake workers)."""
        self.kube = kube
        self.config = config or Config()
        self.identity = self.config.identity or default_identity()
        self.metrics = metrics or Metrics.create()
        self.queue = WorkQueue()
        self.queue.instrument(self.metrics.queue, WORKLOADS)
        self.metrics.runtime.declare(WORKLOADS, self.config.workers)
        kube.observe(*api_hooks(self.metrics))
        self.leading = asyncio.Event()
        self.http_port: int | None = None
        self.metrics_port: int | None = None
        self.guard: Running | None = None
        self.events = EventRecorder(kube, self.metrics, instance=self.identity)
        self.events.enabled = self.config.events
        self.router = Router(self.queue, on_change=self._gauges)
        self.trainjobs = TrainJobVersions()
        self.checks = CheckKeeper(kube, self.metrics, controller_name=self.config.controller_name,
                                  field_manager=self.config.field_manager, now=now_text,
                                  on_names=self.router.set_check_names, events=self.events)
        self.reconciler = Reconciler(
            kube, check_names=lambda: self.checks.names, events=self.events, metrics=self.metrics,
            foreign=self.config.foreign, field_manager=self.config.field_manager,
            last_gone=lambda ns, name: self.router.last_gone.get((ns, name)),
            fleet=Fleet(kube, kueue_namespace=self.config.kueue_namespace, connect=fleet_connect),
            seen_trainjob=self.trainjobs.seen,
        )
        self.reconciler.on_written = self.router.wrote
        self.finalizers = FinalizerKeeper(kube, self.metrics)
        self.finalizers.queue.instrument(self.metrics.queue, POD_FINALIZERS)
        ns = self.config.namespace
        timeout = self.config.watch_timeout_seconds
        r = self.router
        f = self.finalizers

        def both_events(first: Callable[[str, Obj], None], second: Callable[[str, Obj], None]
                        ) -> Callable[[str, Obj], None]:
            def call(etype: str, obj: Obj) -> None:
                first(etype, obj)
                second(etype, obj)
            return call

        def informer(res: k.Res, namespace: str | None, labels: str | None,
                     on_list: Sink | Callable[[list[Obj]], None], on_event: Callable[[str, Obj], None]) -> Informer:
            return Informer(kube, res, namespace=namespace, labels=labels, on_list=on_list, on_event=on_event,
                            timeout_seconds=timeout, metrics=self.metrics,
                            page_size=LARGE_PAGE if res in (api.PODS, api.WORKLOADS, api.TRAINJOBS) else DEFAULT_PAGE,
                            optional=res is api.TRAINJOBS)

        self.informers = {
            "admissionchecks": informer(api.ADMISSION_CHECKS, None, None, self.checks.on_list, self.checks.on_event),
            # ClusterQueues that name our check but let some Workloads skip it get a Warning Event.
            "clusterqueues": informer(api.CLUSTER_QUEUES, None, None, self.checks.on_queue_list,
                                      self.checks.on_queue_event),
            "workloads": informer(api.WORKLOADS, ns, None, r.workload_sink, r.on_workload),
            # Both selections of the rule: a pod found only by dispatch's labels wakes its Workload too.
            # Both also feed the finalizer keeper, which releases dispatch's pod finalizer in either mode;
            # each page goes to both as it arrives (the router keeps routing signatures, the keeper only
            # the pods that carry our finalizer).
            "pods": informer(api.PODS, ns, n.JOBSET_NAME_LABEL, Tee(r.pod_index("pods"), Pages(page=f.list_pods)),
                             both_events(r.pod_index("pods").on_event, f.on_pod)),
            "dispatch-pods": informer(api.PODS, ns, n.LABEL_JOB_ID,
                                      Tee(r.pod_index("dispatch-pods"), Pages(page=f.list_pods)),
                                      both_events(r.pod_index("dispatch-pods").on_event, f.on_pod)),
            "nodes": informer(api.NODES, None, None,
                              Tee(r.node_sink, f.node_sink),
                              both_events(r.on_node, f.on_node)),
            # A JobSet or Job that has not confirmed its suspension blocks like a pod; these make its
            # confirmation event-driven too.
            "jobsets": informer(api.JOBSETS, ns, None, r.lower_sink("jobsets"), r.on_lower),
            "jobs": informer(api.JOBS, ns, n.JOBSET_NAME_LABEL, r.lower_sink("jobs"), r.on_lower),
            # TrainJob versions only (routing nothing): a lone decision reads the lower layers at once with the
            # TrainJob when the TrainJob is still at the version seen here (``_versions``).
            "trainjobs": informer(api.TRAINJOBS, ns, None, self.trainjobs, self.trainjobs.on_event),
        }
        self.optional = frozenset(name for name, inf in self.informers.items() if inf.optional)
        """Informers nothing waits for: only a speed-up reads them, so one that cannot list (a role from before
        it, without ``watch`` on TrainJobs) neither delays decisions nor makes the replica unready."""
        self._stopping = False
        self.elector: LeaderElector | None = None

    # ------------------------------------------------------------------ compatibility views of the parts

    @property
    def check_names(self) -> frozenset[str]:
        return self.checks.names

    @property
    def pending(self) -> set[str]:
        return self.router.pending

    @property
    def waiting(self) -> dict[str, tuple[float, frozenset[str]]]:
        return self.router.waiting

    @property
    def workloads(self) -> dict[str, RoutedWorkload]:
        return self.router.workloads

    def _gauges(self) -> None:
        self.metrics.waiting.set(len(self.router.waiting))
        now = time.monotonic()
        self.metrics.longest_wait.set(self.router.longest_wait(now))
        self.metrics.queue_depth.set(len(self.queue))

    # ------------------------------------------------------------------ workers

    async def _worker(self) -> None:
        # Every informer's first list requeues all pending Workloads (pods may have gone while no watch
        # ran); deciding before they all synced would decide each Workload once per list. Decisions do
        # not read these caches, so an informer that cannot list (readyz names it) delays them only so long.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_synced(), self.config.sync_wait_seconds)
        active = self.metrics.runtime.active.labels(WORKLOADS)
        while True:
            await self.leading.wait()
            keys = await self.queue.get_batch(self.config.batch)
            active.inc()
            try:
                await self._process_many(keys)
            finally:
                active.dec()
                for key in keys:
                    self.queue.done(key)
                self._gauges()

    async def _process_many(self, keys: list[str]) -> None:
        self.metrics.batch_size.observe(len(keys))
        namespace = keys[0].split("/", 1)[0]
        known = self.router.known_in(namespace) if len(keys) > 1 else 0
        hints = {key.split("/", 1)[1]: self.router.workloads[key].hint for key in keys if key in self.router.workloads}
        names = self.checks.names
        decidable = {key.split("/", 1)[1] for key in keys
                     if key in self.router.workloads and self.router.workloads[key].decidable(names)}
        started = time.perf_counter()
        try:
            results = await self.reconciler.reconcile_many(namespace, [key.split("/", 1)[1] for key in keys],
                                                           known=known, hints=hints, decidable=decidable)
        except BaseException:
            for _ in keys:
                self.metrics.runtime.reconciled(WORKLOADS, "error")
            raise
        share = (time.perf_counter() - started) / len(keys)   # one shared read decided them all
        for key in keys:
            result = results[key.split("/", 1)[1]]
            self._settled(key, result)
            self.metrics.runtime.reconciled(WORKLOADS, _result(result), share)

    def _settled(self, key: str, result: Outcome | Exception) -> None:
        if isinstance(result, DispatchError):
            reason = error_reason(result)
            self.metrics.errors.labels(reason).inc()
            level = "error" if isinstance(result, Forbidden) else "warning"
            getattr(log, level)("reconcile failed", workload=key, reason=reason, error=str(result))
            self.queue.add_after(key, self.queue.backoff(key))
            return
        if isinstance(result, Exception):
            self.metrics.errors.labels("Unexpected").inc()
            log.error("reconcile crashed", workload=key, error=repr(result),
                      exc_info=(type(result), result, result.__traceback__))
            self.queue.add_after(key, self.queue.backoff(key))
            return
        outcome = result
        self.metrics.decisions.labels(outcome.outcome).inc()
        if outcome.error:
            self.metrics.errors.labels(outcome.error).inc()
        self.router.note(key, outcome.waiting, outcome.waiting_nodes)
        self._gauges()
        if outcome.retry:
            self.queue.add_after(key, self.queue.backoff(key))
        else:
            self.queue.forget(key)
            if outcome.recheck is not None:
                self.queue.add_after(key, outcome.recheck)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            if self.leading.is_set():
                self.router.requeue_all()
                self.finalizers.requeue_all()

    # ------------------------------------------------------------------ leadership and probes

    def _leadership(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        self.metrics.leader_status.labels(self.config.lease_name).set(1 if leading else 0)
        if leading:
            self.leading.set()
            self.router.requeue_all()
            self.checks.dirty.set()
        else:
            self.leading.clear()

    def healthz(self) -> tuple[bool, str]:
        return (not self._stopping, "ok" if not self._stopping else "stopping")

    def readyz(self) -> tuple[bool, str]:
        """Ready only while this replica can serve: not stopping, its guard's certificate loaded and trusted,
        its informers synced (the Service sends webhook calls to ready replicas only)."""
        if self._stopping:
            return False, "stopping"
        if self.config.guard_port is not None:
            ok, why = self.guard.ready() if self.guard is not None else (False, "guard not started")
            if not ok:
                return False, why
        unsynced = [name for name, inf in self.informers.items()
                    if not inf.synced.is_set() and name not in self.optional]
        if unsynced:
            errors = "; ".join(f"{n_}: {self.informers[n_].last_error}" for n_ in unsynced
                               if self.informers[n_].last_error)
            return False, "not synced: " + ", ".join(unsynced) + (f" ({errors})" if errors else "")
        return True, "ok (leader)" if self.leading.is_set() else "ok (standby)"

    @property
    def synced(self) -> bool:
        return all(inf.synced.is_set() for name, inf in self.informers.items() if name not in self.optional)

    async def wait_synced(self, timeout: float = 10.0) -> None:
        await asyncio.wait_for(self._all_synced(), timeout)

    async def _all_synced(self) -> None:
        """Every informer has listed. One wait after another, not a gather: a gather cancelled from outside
        (a stop during an API outage, while nothing has synced) leaves a future whose CancelledError nobody
        retrieves, and asyncio prints it with a traceback at exit."""
        for name, inf in self.informers.items():
            if name not in self.optional:
                await inf.synced.wait()

    # ------------------------------------------------------------------ run

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Run until ``stop`` is set (or the task is cancelled); a crashed component ends the run."""
        stop = stop or asyncio.Event()
        server: asyncio.Server | None = None
        if self.config.metrics_port is not None:
            server = await serve(self.config.metrics_host, self.config.metrics_port, healthz=self.healthz,
                                 readyz=self.readyz, registry=self.metrics.registry,
                                 metrics=self.config.metrics_serving is None)
            sock = server.sockets[0] if server.sockets else None
            self.http_port = int(sock.getsockname()[1]) if sock is not None else None
        metrics_server: asyncio.Server | None = None
        if self.config.metrics_serving is not None:
            metrics_server = await serve_metrics(self.config.metrics_serving, registry=self.metrics.registry,
                                                 kube=self.kube)
            self.metrics_port = int(metrics_server.sockets[0].getsockname()[1]) if metrics_server.sockets else None
        c = self.config
        if c.guard_port is not None:
            self.guard = await start(self.kube, host=c.guard_host, port=c.guard_port, cert_dir=c.guard_cert_dir,
                                     hosts=c.guard_hosts or guard_hosts_in(c.lease_namespace, c.guard_service),
                                     webhook=c.guard_webhook, registry=self.metrics.registry,
                                     worker=c.multikueue_worker, clients=c.guard_clients())
        log.info("controller starting", identity=self.identity, namespace=self.config.namespace or "*",
                 leader_elect=self.config.leader_elect, workers=self.config.workers, pid=os.getpid())
        jobs: list[Coroutine[Any, Any, None]] = [inf.run() for inf in self.informers.values()]
        jobs += [self._worker() for _ in range(max(1, self.config.workers))]
        jobs += [self._resync(), self.checks.run(self.leading), self.finalizers.run(self.leading)]
        if self.config.leader_elect:
            self.elector = LeaderElector(
                self.kube, name=self.config.lease_name, namespace=self.config.lease_namespace,
                identity=self.identity, lease_seconds=self.config.lease_seconds,
                renew_deadline=self.config.renew_deadline, retry_seconds=self.config.retry_seconds,
                on_change=self._leadership,
            )
            jobs.append(self.elector.run())
        else:
            self._leadership(True)
        tasks = [asyncio.create_task(job) for job in jobs]
        stopper = asyncio.create_task(stop.wait())
        try:
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                failure = None if task is stopper or task.cancelled() else task.exception()
                if failure is not None:
                    raise failure
        finally:
            self._stopping = True
            self.queue.close()
            await _cancel_all([*tasks, stopper])
            await self.events.drain()
            if self.elector is not None:
                await self.elector.release()
            self._leadership(False)
            for srv in (server, metrics_server):
                if srv is not None:
                    srv.close()
                    await srv.wait_closed()
            if server is not None:
                server.close()
                await server.wait_closed()
            if self.guard is not None:
                await self.guard.close()
            await self.reconciler.fleet.aclose()
            log.info("controller stopped", identity=self.identity)
