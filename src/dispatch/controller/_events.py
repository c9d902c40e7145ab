"""Kubernetes Events on the TrainJob, so ``kubectl describe`` shows why admission waited and when it went.

Events are best effort: a failure to record one is logged and counted, never allowed to fail or delay
the admission it describes, so they are sent from a background task and the worker moves on.
"""

from __future__ import annotations

import asyncio

import structlog

from .. import _events as ev
from .. import _kube as k
from .._api import TRAINJOBS, Res
from .._trainer import TrainJobView
from .._views import Ref
from ..errors import DispatchError
from ._metrics import Metrics

log = structlog.get_logger("dispatch.controller.events")

COMPONENT = "dispatch-admission-controller"


class EventRecorder:
    def __init__(self, kube: k.Kube, metrics: Metrics, *, instance: str) -> None:
        self._kube = kube
        self._metrics = metrics
        self.instance = instance
        self.enabled = True
        self._pending: set[asyncio.Task[None]] = set()

    async def emit_for(self, trainjob: TrainJobView | None, reason: str, message: str, *,
                       warning: bool = False) -> None:
        """Queue an Event on the TrainJob and return at once."""
        if trainjob is None:
            return
        await self.emit(TRAINJOBS, trainjob.ref, reason, message, warning=warning)

    async def emit(self, res: Res, ref: Ref, reason: str, message: str, *, warning: bool = False) -> None:
        """Queue the Event on the object ``ref`` of kind ``res`` and return at once."""
        if not self.enabled:
            return
        task = asyncio.create_task(self._send(res, ref, reason, message, warning))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait for Events still being sent (at shutdown)."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout)

    async def _send(self, res: Res, ref: Ref, reason: str, message: str, warning: bool) -> None:
        name, namespace = ref.name, ref.namespace
        event = ev.body(res, ref, reason, message, warning=warning, component=COMPONENT, instance=self.instance)
        try:
            await self._kube.create(k.EVENTS, event, namespace or "default", answer=False)
            self._metrics.writes.labels("event").inc()
        except DispatchError as exc:
            self._metrics.errors.labels("EventFailed").inc()
            log.warning("event not recorded", object=f"{namespace}/{name}", reason=reason, error=str(exc))
