"""The AdmissionCheck reconciler: which checks are dispatch's, and ``Active=True`` on each.

Kueue keeps a ClusterQueue inactive until every AdmissionCheck it names is Active, so the leader
keeps the condition on each check whose ``spec.controllerName`` is ours, writing only on a change.
It also audits the ClusterQueues that name one of our checks: one that lets some Workloads be admitted
without asking it (``_kueue.check_gaps``) gets a Warning Event saying why, once per change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from .. import _api as api
from .. import _kube as k
from .._api import Obj
from .._kueue import check_gaps, owned_by
from .._views import Ref, conditions, meta, name_of, parse_count, text
from ..errors import DispatchError
from ._events import EventRecorder
from ._informer import error_reason
from ._metrics import Metrics

log = structlog.get_logger("dispatch.controller")

GAPS_REASON = "AdmissionCheckSkippable"
ACTIVE_REASON = "ControllerRunning"
ACTIVE_MESSAGE = ("dispatch admission controller is running: a check stays Pending while pods of the "
                  "previous execution may still run")


class CheckKeeper:
    """Tracks our AdmissionChecks from their informer and keeps each one Active (leader only)."""

    def __init__(self, kube: k.Kube, metrics: Metrics, *, controller_name: str, field_manager: str,
                 now: Callable[[], str], on_names: Callable[[frozenset[str]], None],
                 events: EventRecorder | None = None) -> None:
        self._kube = kube
        self._events = events
        self.queues: dict[str, Obj] = {}
        self.gaps: dict[str, tuple[str, ...]] = {}
        """ClusterQueue name -> the gaps last announced for it (an Event is sent when they change)."""
        self._metrics = metrics
        self.controller_name = controller_name
        self.field_manager = field_manager
        self._now = now
        self._on_names = on_names
        self.checks: dict[str, Obj] = {}
        self.names: frozenset[str] = frozenset()
        self.dirty = asyncio.Event()

    def _ours(self, check: Obj) -> bool:
        return owned_by(check, self.controller_name)

    def _set(self, checks: dict[str, Obj]) -> None:
        before = self.names
        self.checks = checks
        self.names = frozenset(checks)
        self.dirty.set()
        if self.names != before:
            log.info("admission checks of ours", checks=sorted(self.names))
            self._on_names(self.names)

    def on_list(self, items: list[Obj]) -> None:
        self._set({name_of(c): c for c in items if self._ours(c)})

    def on_event(self, etype: str, obj: Obj) -> None:
        checks = dict(self.checks)
        name = name_of(obj)
        if etype == "DELETED" or not self._ours(obj):
            checks.pop(name, None)
        else:
            checks[name] = obj
        self._set(checks)

    def on_queue_list(self, items: list[Obj]) -> None:
        self.queues = {name_of(q): q for q in items}
        self.dirty.set()

    def on_queue_event(self, etype: str, obj: Obj) -> None:
        if etype == "DELETED":
            self.queues.pop(name_of(obj), None)
        else:
            self.queues[name_of(obj)] = obj
        self.dirty.set()

    async def audit_queues(self) -> None:
        """Announce each ClusterQueue whose gaps changed (leader only; Events are best effort)."""
        for name in [q for q in self.gaps if q not in self.queues]:
            del self.gaps[name]
        for name, queue in self.queues.items():
            gaps = check_gaps(queue, self.names)
            if gaps == self.gaps.get(name, ()):
                continue
            if gaps:
                self.gaps[name] = gaps
                message = f"ClusterQueue {name} lets Workloads skip dispatch's admission check: " + "; ".join(gaps)
                log.warning("cluster queue skips the check", cluster_queue=name, gaps=list(gaps))
                if self._events is not None:
                    m = meta(queue)
                    ref = Ref(name, "", text(m.get("uid")), text(m.get("resourceVersion")), None)
                    await self._events.emit(api.CLUSTER_QUEUES, ref, GAPS_REASON, message, warning=True)
            else:
                self.gaps.pop(name, None)
        self._metrics.queue_gaps.set(len(self.gaps))

    async def run(self, leading: asyncio.Event) -> None:
        while True:
            await self.dirty.wait()
            self.dirty.clear()
            await leading.wait()
            await self.audit_queues()
            for name, check in list(self.checks.items()):
                try:
                    await self._activate(name, check)
                except DispatchError as exc:
                    self._metrics.errors.labels(f"AdmissionCheck{error_reason(exc)}").inc()
                    log.warning("cannot mark admission check active", check=name, error=str(exc))
                    asyncio.get_running_loop().call_later(2.0, self.dirty.set)

    async def _activate(self, name: str, check: Obj) -> None:
        active = conditions(check).get("Active")
        generation = parse_count(meta(check).get("generation"))
        if (active is not None and text(active.get("status")) == "True" and active.get("reason") == ACTIVE_REASON
                and active.get("message") == ACTIVE_MESSAGE and active.get("observedGeneration") == generation):
            return
        since = text(active.get("lastTransitionTime")) if active and active.get("status") == "True" else ""
        cond: Obj = {"type": "Active", "status": "True", "reason": ACTIVE_REASON, "message": ACTIVE_MESSAGE,
                     "lastTransitionTime": since or self._now()}
        if generation is not None:
            cond["observedGeneration"] = generation
        body = {"apiVersion": api.ADMISSION_CHECKS.api_version, "kind": "AdmissionCheck",
                "metadata": {"name": name}, "status": {"conditions": [cond]}}
        await self._kube.apply(api.ADMISSION_CHECKS, name, body, sub="status",
                               field_manager=self.field_manager, force=True)
        self._metrics.writes.labels("admissioncheck").inc()
        log.info("admission check active", check=name)
