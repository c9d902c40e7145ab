"""The TrainJob versions the controller has seen, kept from a watch: what lets one decision read the lower
layers at once with the TrainJob instead of after it (``_read.EarlyRead`` says why that is sound).

Nothing decides from this cache. A decision still reads the TrainJob, and uses the early reads only when that
fresh read shows the very version kept here, which the watch delivered before the early reads were sent. A
version that lags (a watch behind, a relist under way) only makes the decision read the layers again after the
TrainJob, as it always did. Per TrainJob it keeps its uid and its resourceVersion (the identity the early read
selects by is the one Kueue copied into the Workload's pod sets, and a TrainJob of another identity is another
read): about 200 bytes a TrainJob.
"""

from __future__ import annotations

import sys

from .._api import Obj
from .._views import meta, text

Seen = tuple[str, str]
"""(uid, resourceVersion) of one TrainJob."""


class TrainJobVersions:
    """Namespace -> TrainJob name -> what the last event or list showed of it (``Seen``)."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, Seen]] = {}
        self._next: dict[str, dict[str, Seen]] | None = None

    def __len__(self) -> int:
        return sum(map(len, self._seen.values()))

    @staticmethod
    def _entry(obj: Obj) -> tuple[str, str, Seen] | None:
        m = meta(obj)
        name, version = text(m.get("name")), text(m.get("resourceVersion"))
        if not name or not version:
            return None
        return sys.intern(text(m.get("namespace"))), name, (text(m.get("uid")), version)

    # ------------------------------------------------------------------ the informer's sink and events

    def begin(self) -> None:
        self._next = {}

    def page(self, items: list[Obj]) -> None:
        into = self._next if self._next is not None else self._seen
        for obj in items:
            if (got := self._entry(obj)) is not None:
                into.setdefault(got[0], {})[got[1]] = got[2]

    def end(self) -> None:
        if self._next is not None:
            self._seen, self._next = self._next, None

    def on_event(self, etype: str, obj: Obj) -> None:
        got = self._entry(obj)
        if got is None:
            return
        ns, name, seen = got
        names = self._seen.setdefault(ns, {})
        if etype == "DELETED":
            names.pop(name, None)
            return
        known = names.get(name)
        # A watch never goes back, but a relist may be read from a cache behind an event already seen:
        # keep the newer of two versions of one object (one uid; versions compare as numbers, etcd's).
        if known is None or known[0] != seen[0] or _newer(seen[1], known[1]):
            names[name] = seen

    # ------------------------------------------------------------------ what the reconciler asks

    def seen(self, namespace: str, name: str) -> Seen | None:
        """The TrainJob's uid and the version last seen of it, or None if none is known."""
        return self._seen.get(namespace, {}).get(name)


def _newer(a: str, b: str) -> bool:
    """Whether resourceVersion ``a`` is after ``b``: both numbers in etcd's order; any other form is taken as new
    (an opaque version only ever loses the early read, never decides)."""
    if a.isdigit() and b.isdigit():
        return int(a) > int(b)
    return a != b
