"""The TrainJob versions the controller has seen, kept from a watch: what lets one decision read the lower
layers at once with the TrainJob instead of after it (``_read.EarlyRead`` says why that is sound).

Nothing decides from this cache. A decision still reads the TrainJob, and uses the early reads only when that
fresh read shows the very version kept here, which the watch delivered before the early reads were sent. A
version that lags (a watch behind, a relist under way) only makes the decision read the layers again after the
TrainJob, as it always did. Per TrainJob it keeps its uid, its dispatch identity and its resourceVersion.
"""

from __future__ import annotations

import sys

from .. import _names as n
from .._api import Obj
from .._read import Target
from .._views import labels_of, meta, text

Seen = tuple[str, str, str, str]
"""(uid, job-id, submission, resourceVersion) of one TrainJob."""


class TrainJobVersions:
    """TrainJob name -> what the last event or list showed of it (``Seen``), per namespace."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], Seen] = {}
        self._next: dict[tuple[str, str], Seen] | None = None

    def __len__(self) -> int:
        return len(self._seen)

    @staticmethod
    def _entry(obj: Obj) -> tuple[tuple[str, str], Seen] | None:
        m = meta(obj)
        name, version = text(m.get("name")), text(m.get("resourceVersion"))
        if not name or not version:
            return None
        labels = labels_of(obj)
        return (sys.intern(text(m.get("namespace"))), name), (
            text(m.get("uid")), sys.intern(labels.get(n.LABEL_JOB_ID, "")),
            labels.get(n.LABEL_SUBMISSION, ""), version)

    # ------------------------------------------------------------------ the informer's sink and events

    def begin(self) -> None:
        self._next = {}

    def page(self, items: list[Obj]) -> None:
        into = self._next if self._next is not None else self._seen
        for obj in items:
            if (got := self._entry(obj)) is not None:
                into[got[0]] = got[1]

    def end(self) -> None:
        if self._next is not None:
            self._seen, self._next = self._next, None

    def on_event(self, etype: str, obj: Obj) -> None:
        got = self._entry(obj)
        if got is None:
            return
        key, seen = got
        if etype == "DELETED":
            self._seen.pop(key, None)
            return
        known = self._seen.get(key)
        # A watch never goes back, but a relist may be read from a cache behind an event already seen:
        # keep the newer of two versions of one object (one uid; versions compare as numbers, etcd's).
        if known is None or known[0] != seen[0] or _newer(seen[3], known[3]):
            self._seen[key] = seen

    # ------------------------------------------------------------------ what the reconciler asks

    def target(self, namespace: str, name: str) -> tuple[Target, str] | None:
        """The TrainJob's ``Target`` and the version last seen of it, or None if none is known."""
        seen = self._seen.get((namespace, name))
        if seen is None:
            return None
        uid, job_id, submission, version = seen
        return Target(name, job_id, submission, uid), version


def _newer(a: str, b: str) -> bool:
    """Whether resourceVersion ``a`` is after ``b``: both numbers in etcd's order; any other form is taken as new
    (an opaque version only ever loses the early read, never decides)."""
    if a.isdigit() and b.isdigit():
        return int(a) > int(b)
    return a != b
