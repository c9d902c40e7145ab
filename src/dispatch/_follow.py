"""Following one object: watches of its pods (both selections of the rule) and of its TrainJob.

A waiter (``wait``, ``release --wait``) re-decides when something it depends on changed, not once per
polling period, so a release lands within one watch event of the last pod going. The events only wake
it: every decision is still the consistent read of ``inspect`` or ``release``, so a lost, late or
reordered event can delay an admission, never cause a wrong one. Each watch starts from a list's
resourceVersion taken before the waiter's first decision, so no change after that decision is missed.
While a watch is down (an error, a 410 before the relist, a Forbidden watch), the waiter falls back to
polling with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from . import _kube as k
from ._read import by_identity, by_jobset
from .errors import DispatchError, Refused

RESYNC_SECONDS = 30.0
"""With every watch running, a waiter still re-decides this often (a Node's change is not watched)."""
MAX_FALLBACK_SECONDS = 30.0
WATCH_SECONDS = 300
CANCEL_RETRY_SECONDS = 0.01


@dataclass(frozen=True)
class Selection:
    res: k.Res
    labels: str
    all_namespaces: bool = False

    def describe(self) -> str:
        return f"{self.res.plural} {self.labels}" + (" (all namespaces)" if self.all_namespaces else "")


def selections(name: str, job_id: str, submission: str) -> list[Selection]:
    """What one object's decision depends on that a watch can follow: its pods by JobSet's jobset-name
    and by dispatch's labels, and its TrainJob (by dispatch's labels: a label-less TrainJob is polled)."""
    out = [Selection(k.PODS, by_jobset([name]))]
    identity = by_identity([(job_id, submission)] if job_id and submission else [])
    if identity is not None:
        out += [Selection(k.PODS, identity), Selection(k.TRAINJOBS, identity)]
    return out


class Follower:
    """Watches that wake a waiter; ``changed`` waits for the next change (or the fallback period)."""

    def __init__(self, kube: k.Kube, selected: list[Selection], *, interval: float,
                 complete: bool = True) -> None:
        self._kube = kube
        self.selected = selected
        self.interval = max(interval, 0.01)
        self.complete = complete
        """False when something the decision depends on cannot be watched (a label-less TrainJob)."""
        self._fallback = self.interval
        self._changed = asyncio.Event()
        self._up: set[Selection] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.events = 0
        """Change events seen (bookmarks excluded)."""
        self.errors: list[str] = []

    @property
    def healthy(self) -> bool:
        return self.complete and len(self._up) == len(self.selected)

    async def start(self) -> None:
        """Take each selection's starting resourceVersion (before the waiter decides), then watch."""
        starts = await asyncio.gather(*(self._start_rv(s) for s in self.selected), return_exceptions=True)
        for sel, rv in zip(self.selected, starts, strict=True):
            if isinstance(rv, BaseException) and not isinstance(rv, Exception):
                raise rv
            start = rv if isinstance(rv, str) else None
            if isinstance(rv, Exception):
                self.errors.append(f"{sel.describe()}: {rv}")
            elif start:
                self._up.add(sel)
            self._tasks.append(asyncio.create_task(self._follow(sel, start)))

    async def _start_rv(self, sel: Selection) -> str:
        async with contextlib.aclosing(self._kube.pages(sel.res, labels=sel.labels or None, limit=1,
                                                         all_namespaces=sel.all_namespaces)) as pages:
            async for page in pages:
                return page.resource_version
        return ""

    async def _follow(self, sel: Selection, rv: str | None) -> None:
        delay = self.interval
        while True:
            try:
                if not rv:
                    rv = await self._start_rv(sel)
                    self._up.add(sel)
                    self._changed.set()   # the watch was down: something may have changed unseen
                async for etype, obj in self._kube.watch(sel.res, resource_version=rv, labels=sel.labels or None,
                                                         timeout_seconds=WATCH_SECONDS,
                                                         all_namespaces=sel.all_namespaces):
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if etype in ("ADDED", "MODIFIED", "DELETED"):
                        self.events += 1
                        self._changed.set()
                delay = self.interval   # a watch that ran to its timeout was healthy
            except Refused as exc:          # Forbidden, NotFound kind: this selection is polled
                self._down(sel, exc)
                return
            except DispatchError as exc:    # Unreachable (410 included): relist after a backoff
                self._down(sel, exc)
                rv = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_FALLBACK_SECONDS)

    def _down(self, sel: Selection, exc: DispatchError) -> None:
        self._up.discard(sel)
        self.errors.append(f"{sel.describe()}: {exc}")
        self._changed.set()

    async def changed(self, timeout: float) -> bool:
        """Wait until something followed changed, at most ``timeout`` seconds; True if it did.

        With every watch up the wait is cut at ``RESYNC_SECONDS``; with one down, at the fallback
        polling period, which doubles on each quiet poll (up to ``MAX_FALLBACK_SECONDS``)."""
        healthy = self.healthy
        limit = min(timeout, RESYNC_SECONDS if healthy else self._fallback)
        try:
            await asyncio.wait_for(self._changed.wait(), max(0.0, limit))
            woke = True
        except TimeoutError:
            woke = False
        self._changed.clear()
        await asyncio.sleep(0)   # let a burst of events (a JobSet's pods going together) land first
        self._changed.clear()
        if healthy or woke:
            self._fallback = self.interval
        else:
            self._fallback = min(self._fallback * 2, max(MAX_FALLBACK_SECONDS, self.interval))
        return woke

    async def aclose(self) -> None:
        # Cancel until done: Python 3.11's ``wait_for`` can swallow a cancellation racing an event. Cancel
        # again soon (not after a long wait): the waiter's caller is blocked on this close, and an
        # admission already made should not look 200 ms late.
        pending = {t for t in self._tasks if not t.done()}
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=CANCEL_RETRY_SECONDS)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def __aenter__(self) -> Follower:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
