"""A de-duplicating work queue with per-key backoff, as client-go's workqueue does it.

Watch events arrive in bursts (a JobSet's pods all go within one grace period), and every one of them
maps to the same Workload. The queue holds a key at most once while it waits, and a key re-added while
a worker processes it runs exactly once more afterwards, so no event is lost and no Workload is
reconciled by two workers at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._metrics import QueueMetrics


class WorkQueue:
    """Keys waiting, keys being processed, and keys re-added while processed (``dirty``)."""

    def __init__(self, *, base_delay: float = 0.05, max_delay: float = 30.0) -> None:
        self._items: deque[str] = deque()
        self._queued: set[str] = set()
        self._processing: set[str] = set()
        self._dirty: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._wakeup = asyncio.Event()
        self._closed = False
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._metrics: QueueMetrics | None = None
        self._name = ""
        self._added: dict[str, float] = {}
        self._taken: dict[str, float] = {}

    def instrument(self, metrics: QueueMetrics, name: str) -> None:
        """Export this queue's depth, adds, waits, work time, retries and work in progress as client-go's
        ``workqueue_*`` (the last two read at scrape time)."""
        self._metrics, self._name = metrics, name
        metrics.depth.labels(name, name).set(len(self._items))
        metrics.adds.labels(name, name)
        metrics.retries.labels(name, name)
        metrics.unfinished.labels(name, name).set_function(lambda: self._running(sum))
        metrics.longest.labels(name, name).set_function(lambda: self._running(max))

    def _running(self, reduce: Callable[[list[float]], float]) -> float:
        """``reduce`` over how long each key being processed has been held (0 with none)."""
        now = time.monotonic()
        held = [now - taken for taken in self._taken.values()]
        return float(reduce(held)) if held else 0.0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, key: str) -> None:
        """Queue ``key`` unless it is already waiting; if a worker holds it, run it once more after."""
        if self._closed:
            return
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._items.append(key)
        self._wakeup.set()
        if self._metrics is not None:
            self._added[key] = time.monotonic()
            self._metrics.adds.labels(self._name, self._name).inc()
            self._metrics.depth.labels(self._name, self._name).set(len(self._items))

    def add_after(self, key: str, delay: float) -> None:
        """Queue ``key`` after ``delay`` seconds; an earlier pending timer for it wins."""
        if self._closed:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        if existing is not None:
            if existing.when() <= loop.time() + delay:
                return
            existing.cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = loop.call_later(delay, fire)

    def backoff(self, key: str) -> float:
        """Record a failure of ``key`` and return how long to wait before retrying it (exponential)."""
        count = self._failures.get(key, 0)
        self._failures[key] = count + 1
        if self._metrics is not None:
            self._metrics.retries.labels(self._name, self._name).inc()
        return float(min(self.max_delay, self.base_delay * (2**count)))

    def forget(self, key: str) -> None:
        """``key`` succeeded: its next failure starts from the base delay again."""
        self._failures.pop(key, None)

    async def get(self) -> str:
        """The next key; the caller must call ``done`` with it."""
        while not self._items:
            if self._closed:
                raise asyncio.CancelledError
            self._wakeup.clear()
            await self._wakeup.wait()
        key = self._items.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        self._taken_now([key])
        return key

    def _taken_now(self, keys: list[str]) -> None:
        if self._metrics is None:
            return
        now = time.monotonic()
        for key in keys:
            added = self._added.pop(key, None)
            if added is not None:
                self._metrics.queue_seconds.labels(self._name, self._name).observe(now - added)
            self._taken[key] = now
        self._metrics.depth.labels(self._name, self._name).set(len(self._items))

    async def get_batch(self, limit: int) -> list[str]:
        """The next key and up to ``limit - 1`` more waiting keys of the same namespace (``ns/name``),
        in queue order, so one read can serve them all; the caller calls ``done`` for each."""
        first = await self.get()
        if limit <= 1 or not self._items:
            return [first]
        prefix = first.split("/", 1)[0] + "/"
        batch = [first]
        rest: deque[str] = deque()
        for key in self._items:
            if len(batch) < limit and key.startswith(prefix):
                batch.append(key)
                self._queued.discard(key)
                self._processing.add(key)
            else:
                rest.append(key)
        self._items = rest
        self._taken_now(batch[1:])
        return batch

    def in_flight(self) -> list[str]:
        """The keys workers hold now (``add`` of one makes it run once more after)."""
        return sorted(self._processing)

    def done(self, key: str) -> None:
        self._processing.discard(key)
        taken = self._taken.pop(key, None)
        if taken is not None and self._metrics is not None:
            self._metrics.work_seconds.labels(self._name, self._name).observe(time.monotonic() - taken)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def close(self) -> None:
        """Stop handing out keys and cancel timers (shutdown)."""
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._wakeup.set()
