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
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

import structlog

from .. import _decision as d
from .. import _kube as k
from .. import _names as n
from ..errors import DispatchError, Forbidden, Refused, Unreachable
from ._events import EventRecorder
from ._http import MetricsServing, serve, serve_metrics
from ._leader import LeaderElector
from ._metrics import Metrics
from ._queue import WorkQueue
from ._reconcile import (
    ForeignPolicy,
    Outcome,
    Reconciler,
    controller_owner,
    error_reason,
    now_text,
    our_entry,
    pending_ours,
)

log = structlog.get_logger("dispatch.controller")

Obj = dict[str, Any]

OURS = object()
ACTIVE_REASON = "ControllerRunning"
ACTIVE_MESSAGE = ("dispatch admission controller is running: a check stays Pending while pods of the "
                  "previous execution may still run")


def default_identity() -> str:
    """Pod name (the hostname in Kubernetes) plus a random suffix, unique across restarts."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Config:
    """How the controller runs. ``namespace=None`` serves Workloads in every namespace."""

    namespace: str | None = None
    workers: int = 4
    batch: int = 64
    """Up to this many queued Workloads of one namespace are decided from one shared read (1: one each)."""
    leader_elect: bool = False
    lease_name: str = "dispatch-admission-controller"
    lease_namespace: str = "dispatch-system"
    identity: str = ""
    lease_seconds: float = 15.0
    renew_deadline: float = 10.0
    retry_seconds: float = 2.0
    resync_seconds: float = 60.0
    """Safety net only: every Pending Workload is re-checked this often even without an event."""
    watch_timeout_seconds: int = 300
    sync_wait_seconds: float = 30.0
    """Workers start once every informer has listed, or after this long regardless."""
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = None
    """None serves no HTTP; 0 picks a free port (tests)."""
    metrics_serving: MetricsServing | None = None
    """/metrics on a listener of its own (localhost, or HTTPS with TokenReview/SubjectAccessReview)."""
    foreign: ForeignPolicy = "ready"
    events: bool = True
    field_manager: str = n.FIELD_MANAGER
    controller_name: str = n.CONTROLLER_NAME
    """AdmissionChecks with this ``spec.controllerName`` are ours (another name isolates a canary or a test)."""


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


class Informer:
    """List, then watch from the list's resourceVersion; relist on 410; back off on errors."""

    def __init__(
        self,
        kube: k.Kube,
        res: k.Res,
        *,
        namespace: str | None,
        labels: str | None,
        on_list: Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
        timeout_seconds: int,
        metrics: Metrics,
    ) -> None:
        self._kube = kube
        self.res = res
        self.namespace = namespace
        self.labels = labels
        self._on_list = on_list
        self._on_event = on_event
        self.timeout_seconds = timeout_seconds
        self._metrics = metrics
        self.synced = asyncio.Event()
        self.last_error = ""

    async def run(self) -> None:
        every = self.namespace is None and self.res.namespaced
        delay = 0.2
        while True:
            try:
                listed = await self._kube.list(self.res, self.namespace, labels=self.labels, all_namespaces=every)
                self._on_list(listed.items)
                rv = listed.resource_version
                self.synced.set()
                self.last_error = ""
                delay = 0.2
                while True:
                    async for etype, obj in self._kube.watch(
                        self.res, self.namespace, resource_version=rv, labels=self.labels,
                        timeout_seconds=self.timeout_seconds, all_namespaces=every,
                    ):
                        rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                        if etype in ("ADDED", "MODIFIED", "DELETED"):
                            self._on_event(etype, obj)
            except Unreachable as exc:
                if exc.code == 410:
                    log.info("watch expired; relisting", resource=self.res.describe())
                    continue
                self._failed(exc, "warning")
            except Refused as exc:
                self._failed(exc, "error")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    def _failed(self, exc: DispatchError, level: str) -> None:
        self.last_error = str(exc)
        self._metrics.errors.labels(f"Watch{error_reason(exc)}").inc()
        getattr(log, level)("list/watch failed", resource=self.res.describe(), error=str(exc))


class Controller:
    """The admission-check controller for dispatch's AdmissionChecks."""

    def __init__(self, kube: k.Kube, config: Config | None = None, *, metrics: Metrics | None = None) -> None:
        self.kube = kube
        self.config = config or Config()
        self.identity = self.config.identity or default_identity()
        self.metrics = metrics or Metrics.create()
        self.queue = WorkQueue()
        self.checks: dict[str, Obj] = {}
        self.check_names: frozenset[str] = frozenset()
        self.pending: set[str] = set()
        self.owner_of: dict[str, tuple[str, str]] = {}
        self.by_owner: dict[tuple[str, str], set[str]] = {}
        self.nodes: dict[str, d.NodeView] = {}
        self.node_waiters: dict[str, set[str]] = {}
        self.waiting: dict[str, tuple[float, frozenset[str]]] = {}
        self.last_gone: dict[tuple[str, str], float] = {}
        self.signatures: dict[str, tuple[object, ...]] = {}
        self.workloads: dict[str, Obj] = {}
        """Last seen Workloads: kept so a change of our check names can re-sort them without a relist."""
        self.pod_signatures: dict[str, tuple[str, bool]] = {}
        self.leading = asyncio.Event()
        self._checks_dirty = asyncio.Event()
        self.http_port: int | None = None
        self.metrics_port: int | None = None
        self.events = EventRecorder(kube, self.metrics, instance=self.identity)
        self.events.enabled = self.config.events
        self.reconciler = Reconciler(
            kube, check_names=lambda: self.check_names, events=self.events, metrics=self.metrics,
            foreign=self.config.foreign, field_manager=self.config.field_manager,
            last_gone=lambda ns, name: self.last_gone.get((ns, name)),
        )
        self.reconciler.on_written = self._written
        ns = self.config.namespace
        timeout = self.config.watch_timeout_seconds
        self.informers = {
            "admissionchecks": Informer(kube, k.ADMISSION_CHECKS, namespace=None, labels=None,
                                        on_list=self._list_checks, on_event=self._on_check,
                                        timeout_seconds=timeout, metrics=self.metrics),
            "workloads": Informer(kube, k.WORKLOADS, namespace=ns, labels=None, on_list=self._list_workloads,
                                  on_event=self._on_workload, timeout_seconds=timeout, metrics=self.metrics),
            "pods": Informer(kube, k.PODS, namespace=ns, labels=n.JOBSET_NAME_LABEL, on_list=self._list_pods,
                             on_event=self._on_pod, timeout_seconds=timeout, metrics=self.metrics),
            "nodes": Informer(kube, k.NODES, namespace=None, labels=None, on_list=self._list_nodes,
                              on_event=self._on_node, timeout_seconds=timeout, metrics=self.metrics),
            # A JobSet or Job that has not confirmed its suspension blocks like a pod; these make its
            # confirmation event-driven too.
            "jobsets": Informer(kube, k.JOBSETS, namespace=ns, labels=None, on_list=self._list_lower,
                                on_event=self._on_lower, timeout_seconds=timeout, metrics=self.metrics),
            "jobs": Informer(kube, k.JOBS, namespace=ns, labels=n.JOBSET_NAME_LABEL, on_list=self._list_lower,
                             on_event=self._on_lower, timeout_seconds=timeout, metrics=self.metrics),
        }
        self._stopping = False
        self.elector: LeaderElector | None = None

    # ------------------------------------------------------------------ AdmissionChecks

    def _ours(self, check: Obj) -> bool:
        return (check.get("spec") or {}).get("controllerName") == self.config.controller_name

    def _set_checks(self, checks: dict[str, Obj]) -> None:
        before = self.check_names
        self.checks = checks
        self.check_names = frozenset(checks)
        self._checks_dirty.set()
        if self.check_names != before:
            log.info("admission checks of ours", checks=sorted(self.check_names))
            # Which Workloads are ours depends on the check names: index every known Workload again.
            for obj in list(self.workloads.values()):
                self._index_workload(obj, force=True)
            self._gauges()

    def _list_checks(self, items: list[Obj]) -> None:
        self._set_checks({d.name_of(c): c for c in items if self._ours(c)})

    def _on_check(self, etype: str, obj: Obj) -> None:
        checks = dict(self.checks)
        name = d.name_of(obj)
        if etype == "DELETED" or not self._ours(obj):
            checks.pop(name, None)
        else:
            checks[name] = obj
        self._set_checks(checks)

    async def _keep_checks_active(self) -> None:
        """Keep ``Active=True`` on each of our AdmissionChecks (leader only), writing only on a change."""
        while True:
            await self._checks_dirty.wait()
            self._checks_dirty.clear()
            await self.leading.wait()
            for name, check in list(self.checks.items()):
                try:
                    await self._activate(name, check)
                except DispatchError as exc:
                    self.metrics.errors.labels(f"AdmissionCheck{error_reason(exc)}").inc()
                    log.warning("cannot mark admission check active", check=name, error=str(exc))
                    asyncio.get_running_loop().call_later(2.0, self._checks_dirty.set)

    async def _activate(self, name: str, check: Obj) -> None:
        conds = (check.get("status") or {}).get("conditions") or []
        active = next((c for c in conds if c.get("type") == "Active"), None)
        generation = (check.get("metadata") or {}).get("generation")
        if (active and active.get("status") == "True" and active.get("reason") == ACTIVE_REASON
                and active.get("message") == ACTIVE_MESSAGE and active.get("observedGeneration") == generation):
            return
        since = active.get("lastTransitionTime") if active and active.get("status") == "True" else None
        cond: Obj = {"type": "Active", "status": "True", "reason": ACTIVE_REASON, "message": ACTIVE_MESSAGE,
                     "lastTransitionTime": since or now_text()}
        if generation is not None:
            cond["observedGeneration"] = generation
        body = {"apiVersion": k.ADMISSION_CHECKS.api_version, "kind": "AdmissionCheck",
                "metadata": {"name": name}, "status": {"conditions": [cond]}}
        await self.kube.apply(k.ADMISSION_CHECKS, name, body, sub="status",
                              field_manager=self.config.field_manager, force=True)
        self.metrics.writes.labels("admissioncheck").inc()
        log.info("admission check active", check=name)

    # ------------------------------------------------------------------ Workloads

    @staticmethod
    def _key(obj: Obj) -> str:
        meta = obj.get("metadata") or {}
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

    def _forget_owner(self, key: str) -> None:
        owner = self.owner_of.pop(key, None)
        if owner is not None:
            keys = self.by_owner.get(owner)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.by_owner[owner]
                    self.last_gone.pop(owner, None)

    def _index_workload(self, obj: Obj, *, force: bool = False) -> None:
        key = self._key(obj)
        self.workloads[key] = obj
        owner = controller_owner(obj)
        ns = str((obj.get("metadata") or {}).get("namespace", ""))
        pair = (ns, owner.name) if owner is not None and owner.is_trainjob else None
        if self.owner_of.get(key) != pair:
            self._forget_owner(key)
            if pair is not None:
                self.owner_of[key] = pair
                self.by_owner.setdefault(pair, set()).add(key)
        if pending_ours(obj, self.check_names):
            self.pending.add(key)
            signature = self._signature(key, obj)
            if force or self.signatures.get(key) != signature:
                self.queue.add(key)
            self.signatures[key] = signature
        else:
            self.pending.discard(key)
            self.signatures.pop(key, None)
            self.reconciler.written.pop(key, None)
            self._drop_waiting(key)

    def _written(self, key: str) -> None:
        """Our write's echo (same state, our message) must not look like a change."""
        stored = self.signatures.get(key)
        written = self.reconciler.written.get(key)
        if stored is not None and written is not None and stored[0] == written[0]:
            self.signatures[key] = (*stored[:-1], OURS)

    def _signature(self, key: str, obj: Obj) -> tuple[object, ...]:
        """What of a Workload the decision reads. Kueue rewrites Workloads often (conditions' times,
        requeue state), and our own write echoes back: neither needs a reconcile. Our own message is
        folded to a marker so its echo matches what was stored before the write."""
        entry = our_entry(obj, self.check_names)
        state, text = (entry.state, entry.message) if entry else ("", "")
        message: object = OURS if self.reconciler.written.get(key) == (state, text) else text
        conds = tuple(d.condition_true(obj, c) for c in ("QuotaReserved", "Evicted", "Finished", "Admitted"))
        owner = controller_owner(obj)
        return (state, conds, (obj.get("spec") or {}).get("active"), d.is_deleting(obj),
                owner.uid if owner else "", message)

    def _list_workloads(self, items: list[Obj]) -> None:
        keys = {self._key(o) for o in items}
        for stale in set(self.owner_of) | self.pending | set(self.workloads):
            if stale not in keys:
                self._remove_workload(stale)
        for obj in items:
            self._index_workload(obj, force=True)
        self._gauges()

    def _remove_workload(self, key: str) -> None:
        self.workloads.pop(key, None)
        self._forget_owner(key)
        self.pending.discard(key)
        self.signatures.pop(key, None)
        self.reconciler.written.pop(key, None)
        self._drop_waiting(key)

    def _on_workload(self, etype: str, obj: Obj) -> None:
        if etype == "DELETED":
            self._remove_workload(self._key(obj))
        else:
            self._index_workload(obj)
        self._gauges()

    def _requeue_all(self) -> None:
        for key in sorted(self.pending):
            self.queue.add(key)

    # ------------------------------------------------------------------ pods and nodes

    @staticmethod
    def _pod_signature(obj: Obj) -> tuple[str, bool]:
        """What of a pod the decision and its message read: where it runs and whether it may run."""
        phase = str((obj.get("status") or {}).get("phase") or "")
        return str((obj.get("spec") or {}).get("nodeName") or ""), phase not in d.TERMINAL_PHASES

    def _list_pods(self, items: list[Obj]) -> None:
        self.pod_signatures = {str((o.get("metadata") or {}).get("uid")): self._pod_signature(o) for o in items}
        # Pods may have gone while the watch was down: re-check every Workload that waits.
        self._requeue_all()

    def _on_pod(self, etype: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid"))
        if etype == "DELETED":
            self.pod_signatures.pop(uid, None)
        else:
            signature = self._pod_signature(obj)
            if etype == "MODIFIED" and self.pod_signatures.get(uid) == signature:
                return  # status heartbeats, conditions, deletionTimestamp: the verdict cannot change
            self.pod_signatures[uid] = signature
        owner = (str(meta.get("namespace", "")), str(d.labels_of(obj).get(n.JOBSET_NAME_LABEL, "")))
        keys = self.by_owner.get(owner)
        if not keys:
            return
        if etype == "DELETED" or not self._pod_signature(obj)[1]:
            self.last_gone[owner] = time.monotonic()
        for key in keys:
            if key in self.pending:
                self.queue.add(key)

    def _list_lower(self, items: list[Obj]) -> None:
        self._requeue_all()

    def _on_lower(self, etype: str, obj: Obj) -> None:
        """A JobSet (named as its TrainJob) or a Job (labelled with it) changed: re-check the waiters."""
        meta = obj.get("metadata") or {}
        name = d.labels_of(obj).get(n.JOBSET_NAME_LABEL) if obj.get("kind") == "Job" else meta.get("name")
        for key in self.by_owner.get((str(meta.get("namespace", "")), str(name or "")), ()):
            if key in self.waiting:
                self.queue.add(key)

    def _list_nodes(self, items: list[Obj]) -> None:
        seen = {d.name_of(o): d.NodeView.from_obj(o) for o in items}
        changed = {name for name in set(seen) | set(self.nodes) if seen.get(name) != self.nodes.get(name)}
        self.nodes = seen
        self._nodes_changed(changed)

    def _on_node(self, etype: str, obj: Obj) -> None:
        name = d.name_of(obj)
        view = d.NodeView.gone(name) if etype == "DELETED" else d.NodeView.from_obj(obj)
        if self.nodes.get(name) == view:
            return  # heartbeats and other changes the decision does not read
        if etype == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = view
        self._nodes_changed([name])

    def _nodes_changed(self, names: Iterable[str]) -> None:
        for name in names:
            for key in self.node_waiters.get(name, ()):
                self.queue.add(key)

    # ------------------------------------------------------------------ waiting bookkeeping

    def _drop_waiting(self, key: str) -> None:
        found = self.waiting.pop(key, None)
        if found is not None:
            for node in found[1]:
                waiters = self.node_waiters.get(node)
                if waiters is not None:
                    waiters.discard(key)
                    if not waiters:
                        del self.node_waiters[node]

    def _note(self, key: str, outcome: Outcome) -> None:
        if not outcome.waiting:
            self._drop_waiting(key)
        else:
            since = self.waiting.get(key, (time.monotonic(), frozenset()))[0]
            self._drop_waiting(key)
            self.waiting[key] = (since, outcome.waiting_nodes)
            for node in outcome.waiting_nodes:
                self.node_waiters.setdefault(node, set()).add(key)
        self._gauges()

    def _gauges(self) -> None:
        self.metrics.waiting.set(len(self.waiting))
        now = time.monotonic()
        self.metrics.longest_wait.set(max((now - s for s, _ in self.waiting.values()), default=0.0))
        self.metrics.queue_depth.set(len(self.queue))

    # ------------------------------------------------------------------ workers

    async def _worker(self) -> None:
        # Every informer's first list requeues all pending Workloads (pods may have gone while no watch
        # ran); deciding before they all synced would decide each Workload once per list. Decisions do
        # not read these caches, so an informer that cannot list (readyz names it) delays them only so long.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(inf.synced.wait() for inf in self.informers.values())),
                                   self.config.sync_wait_seconds)
        while True:
            await self.leading.wait()
            keys = await self.queue.get_batch(self.config.batch)
            try:
                await self._process_many(keys)
            finally:
                for key in keys:
                    self.queue.done(key)
                self._gauges()

    async def _process(self, key: str) -> None:
        await self._process_many([key])

    async def _process_many(self, keys: list[str]) -> None:
        self.metrics.batch_size.observe(len(keys))
        namespace = keys[0].split("/", 1)[0]
        prefix = namespace + "/"
        known = sum(1 for key in self.workloads if key.startswith(prefix)) if len(keys) > 1 else 0
        hints = {key.split("/", 1)[1]: self.workloads[key] for key in keys if key in self.workloads}
        results = await self.reconciler.reconcile_many(namespace, [key.split("/", 1)[1] for key in keys],
                                                       known=known, hints=hints)
        for key in keys:
            self._settled(key, results[key.split("/", 1)[1]])

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
        self._note(key, outcome)
        if outcome.retry:
            self.queue.add_after(key, self.queue.backoff(key))
        else:
            self.queue.forget(key)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.config.resync_seconds)
            if self.leading.is_set():
                self._requeue_all()

    # ------------------------------------------------------------------ leadership and probes

    def _leadership(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        if leading:
            self.leading.set()
            self._requeue_all()
            self._checks_dirty.set()
        else:
            self.leading.clear()

    def healthz(self) -> tuple[bool, str]:
        return (not self._stopping, "ok" if not self._stopping else "stopping")

    def readyz(self) -> tuple[bool, str]:
        unsynced = [name for name, inf in self.informers.items() if not inf.synced.is_set()]
        if unsynced:
            errors = "; ".join(f"{n_}: {self.informers[n_].last_error}" for n_ in unsynced
                               if self.informers[n_].last_error)
            return False, "not synced: " + ", ".join(unsynced) + (f" ({errors})" if errors else "")
        return True, "ok (leader)" if self.leading.is_set() else "ok (standby)"

    @property
    def synced(self) -> bool:
        return all(inf.synced.is_set() for inf in self.informers.values())

    async def wait_synced(self, timeout: float = 10.0) -> None:
        await asyncio.wait_for(asyncio.gather(*(i.synced.wait() for i in self.informers.values())), timeout)

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
        log.info("controller starting", identity=self.identity, namespace=self.config.namespace or "*",
                 leader_elect=self.config.leader_elect, workers=self.config.workers, pid=os.getpid())
        jobs: list[Coroutine[Any, Any, None]] = [inf.run() for inf in self.informers.values()]
        jobs += [self._worker() for _ in range(max(1, self.config.workers))]
        jobs += [self._resync(), self._keep_checks_active()]
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
            log.info("controller stopped", identity=self.identity)
