"""List, then watch: the controller's only view of the cluster between decisions.

An informer's events only route work (which Workload to re-check); no decision reads its cache.
Lists are read page by page and each page is handed to the informer's sink as it arrives, so the
controller holds one page of decoded objects at a time, whatever the cluster's size; a sink keeps only
the few fields routing needs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

import structlog

from .. import _kube as k
from .._api import Obj
from ..errors import DispatchError, Refused, Unreachable
from ._metrics import Metrics

log = structlog.get_logger("dispatch.controller")

INITIAL_BACKOFF = 0.2
MAX_BACKOFF = 10.0
HEALTHY_SECONDS = 30.0
"""A watch that lasted this long resets the backoff; one that fails sooner does not."""


@runtime_checkable
class Sink(Protocol):
    """Where an informer's list goes, one page at a time.

    ``begin`` starts a list (it may follow an aborted one: forget what it left), ``page`` takes each
    page's items (which the sink must not keep), ``end`` closes a complete list: whatever was known
    and not listed is gone.
    """

    def begin(self) -> None: ...

    def page(self, items: list[Obj]) -> None: ...

    def end(self) -> None: ...


class Collect:
    """A sink for a kind that is always small (AdmissionChecks): the whole list to one callback."""

    def __init__(self, on_list: Callable[[list[Obj]], None]) -> None:
        self._on_list = on_list
        self._items: list[Obj] = []

    def begin(self) -> None:
        self._items = []

    def page(self, items: list[Obj]) -> None:
        self._items.extend(items)

    def end(self) -> None:
        items, self._items = self._items, []
        self._on_list(items)


class Pages:
    """A sink over three callables (each optional): ``page`` alone reduces each page as it arrives."""

    def __init__(self, *, begin: Callable[[], None] | None = None, page: Callable[[list[Obj]], None] | None = None,
                 end: Callable[[], None] | None = None) -> None:
        self._begin, self._page, self._end = begin, page, end

    def begin(self) -> None:
        if self._begin is not None:
            self._begin()

    def page(self, items: list[Obj]) -> None:
        if self._page is not None:
            self._page(items)

    def end(self) -> None:
        if self._end is not None:
            self._end()


class Tee:
    """One list to several sinks, each page to each in turn (the router and the finalizer keeper both
    read the pod and Node lists; still one page decoded at a time)."""

    def __init__(self, *sinks: Sink) -> None:
        self.sinks = sinks

    def begin(self) -> None:
        for sink in self.sinks:
            sink.begin()

    def page(self, items: list[Obj]) -> None:
        for sink in self.sinks:
            sink.page(items)

    def end(self) -> None:
        for sink in self.sinks:
            sink.end()


def feed(sink: Sink, items: list[Obj]) -> None:
    """A whole list handed to a sink at once, as one page (a list that is not paged: tests, harnesses)."""
    sink.begin()
    sink.page(items)
    sink.end()


def error_reason(exc: DispatchError) -> str:
    if exc.code == 409:
        return "Conflict"
    return exc.reason or type(exc).__name__


class Informer:
    """List (paged), then watch from the list's resourceVersion; relist on 410; back off on errors."""

    def __init__(
        self,
        kube: k.Kube,
        res: k.Res,
        *,
        namespace: str | None,
        labels: str | None,
        on_list: Sink | Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
        timeout_seconds: int,
        metrics: Metrics,
        page_size: int = 500,
        optional: bool = False,
    ) -> None:
        self._kube = kube
        self.optional = optional
        """Only a speed-up reads this one: refused (403) by the role, it empties its sink and stops listing
        (until the controller restarts) rather than relist the kind every few seconds for good."""
        self.res = res
        self.namespace = namespace
        self.labels = labels
        self._sink: Sink = on_list if isinstance(on_list, Sink) else Collect(on_list)
        self.page_size = page_size
        self.lists = 0
        """Lists started (a flapping watch must not turn into a list every 0.2 s)."""
        self._on_event = on_event
        self.timeout_seconds = timeout_seconds
        self._metrics = metrics
        self.synced = asyncio.Event()
        self.last_error = ""
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
        self.clock: Callable[[], float] = time.monotonic
        """How the backoff waits and tells a healthy watch from a flapping one (tests step them)."""

    async def _list(self, every: bool) -> str:
        self.lists += 1
        self._sink.begin()
        rv = ""
        async for page in self._kube.pages(self.res, self.namespace, labels=self.labels, limit=self.page_size,
                                           all_namespaces=every):
            rv = rv or page.resource_version
            self._sink.page(page.items)
            del page
        self._sink.end()
        return rv

    async def run(self) -> None:
        every = self.namespace is None and self.res.namespaced
        delay = INITIAL_BACKOFF
        listed_at: float | None = None
        while True:
            try:
                rv = await self._list(every)
                self.synced.set()
                self.last_error = ""
                listed_at = self.clock()
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
                    if listed_at is None or self.clock() - listed_at > HEALTHY_SECONDS:
                        listed_at = None
                        continue  # an old watch expired: relist at once
                    # expired right after a list: a server that keeps answering 410 is backed off too
                else:
                    self._failed(exc, "warning")
            except Refused as exc:
                if self.optional and exc.code == 403:
                    self._failed(exc, "warning")
                    log.warning("informer stopped: the role does not allow it; only a speed-up is lost",
                                resource=self.res.describe())
                    self._sink.begin()
                    self._sink.end()
                    await asyncio.Event().wait()   # parked, not ended: a component that ends ends the controller
                self._failed(exc, "error")
            # A list whose watch then ran a while was healthy: this failure starts the backoff afresh.
            # One whose watch failed at once keeps the backoff growing, so a flapping watch does not
            # relist the whole kind every 0.2 s.
            if listed_at is not None and self.clock() - listed_at > HEALTHY_SECONDS:
                delay = INITIAL_BACKOFF
            listed_at = None
            await self.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF)

    def _failed(self, exc: DispatchError, level: str) -> None:
        self.last_error = str(exc)
        self._metrics.errors.labels(f"Watch{error_reason(exc)}").inc()
        getattr(log, level)("list/watch failed", resource=self.res.describe(), error=str(exc))
