"""The AdmissionCheck reconciler: which checks are dispatch's, and ``Active=True`` on each.

Kueue keeps a ClusterQueue inactive until every AdmissionCheck it names is Active, so the leader
keeps the condition on each check whose ``spec.controllerName`` is ours, writing only on a change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from .. import _api as api
from .. import _kube as k
from .._views import conditions, mapping, meta, name_of, parse_count, text
from ..errors import DispatchError
from ._informer import error_reason
from ._metrics import Metrics

log = structlog.get_logger("dispatch.controller")

Obj = dict[str, Any]
ACTIVE_REASON = "ControllerRunning"
ACTIVE_MESSAGE = ("dispatch admission controller is running: a check stays Pending while pods of the "
                  "previous execution may still run")


class CheckKeeper:
    """Tracks our AdmissionChecks from their informer and keeps each one Active (leader only)."""

    def __init__(self, kube: k.Kube, metrics: Metrics, *, controller_name: str, field_manager: str,
                 now: Callable[[], str], on_names: Callable[[frozenset[str]], None]) -> None:
        self._kube = kube
        self._metrics = metrics
        self.controller_name = controller_name
        self.field_manager = field_manager
        self._now = now
        self._on_names = on_names
        self.checks: dict[str, Obj] = {}
        self.names: frozenset[str] = frozenset()
        self.dirty = asyncio.Event()

    def _ours(self, check: Obj) -> bool:
        return text(mapping(check.get("spec")).get("controllerName")) == self.controller_name

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

    async def run(self, leading: asyncio.Event) -> None:
        while True:
            await self.dirty.wait()
            self.dirty.clear()
            await leading.wait()
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
