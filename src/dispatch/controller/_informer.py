"""List, then watch: the controller's only view of the cluster between decisions.

An informer's events only route work (which Workload to re-check); no decision reads its cache.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import structlog

from .. import _kube as k
from ..errors import DispatchError, Refused, Unreachable
from ._metrics import Metrics

log = structlog.get_logger("dispatch.controller")

Obj = dict[str, Any]
INITIAL_BACKOFF = 0.2
MAX_BACKOFF = 10.0
HEALTHY_SECONDS = 30.0
"""A watch that lasted this long resets the backoff; one that fails sooner does not."""


def error_reason(exc: DispatchError) -> str:
    if exc.code == 409:
        return "Conflict"
    return exc.reason or type(exc).__name__


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
        delay = INITIAL_BACKOFF
        listed_at: float | None = None
        while True:
            try:
                listed = await self._kube.list(self.res, self.namespace, labels=self.labels, all_namespaces=every)
                self._on_list(listed.items)
                rv = listed.resource_version
                self.synced.set()
                self.last_error = ""
                listed_at = time.monotonic()
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
            # A list whose watch then ran a while was healthy: this failure starts the backoff afresh.
            # One whose watch failed at once keeps the backoff growing, so a flapping watch does not
            # relist the whole kind every 0.2 s.
            if listed_at is not None and time.monotonic() - listed_at > HEALTHY_SECONDS:
                delay = INITIAL_BACKOFF
            listed_at = None
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF)

    def _failed(self, exc: DispatchError, level: str) -> None:
        self.last_error = str(exc)
        self._metrics.errors.labels(f"Watch{error_reason(exc)}").inc()
        getattr(log, level)("list/watch failed", resource=self.res.describe(), error=str(exc))
