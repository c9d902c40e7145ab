"""Event routing: which Workloads a watch event may concern, by both selections of the rule.

A pod's deletion or phase change, a Node's change, or a JobSet/Job confirming its suspension queues
exactly the Workloads whose decision it can change. Pods are routed by JobSet's ``jobset-name`` (to
the Workloads owned by that TrainJob) and by dispatch's job-id/submission labels (to the Workloads
whose pod sets carry that identity), so a pod that only one selection finds still wakes its Workload.
Nothing here decides: decisions re-read the API.

Memory follows what routing needs, not the cluster: a pod is kept as its routing signature (node,
may-run, and its group: namespace, jobset-name, job-id, submission; strings and groups shared), a
Workload as a slim view (owner, pod-set identity, check entries, the conditions the decision screens on),
a Node as its view. Lists
arrive a page at a time (``_informer.Sink``); a relist compares what it found with what was known and
routes only the pods that changed or went while no watch ran.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from .. import _kueue as kq
from .. import _names as n
from .._api import Obj
from .._views import NodeView, PodView, labels_of, meta, name_of, text
from ._informer import Pages, feed
from ._queue import WorkQueue

OURS = object()
Pair = tuple[str, str]
Ident = tuple[str, str, str]
PodGroup = tuple[str, str, str, str]
"""What a pod routes by: (namespace, jobset-name, job-id, submission); one tuple for all the pods of a JobSet."""
PodSig = tuple[str, bool, PodGroup]
"""A pod as routing needs it: (node, may-run, its group)."""
SHARED_GROUPS = 65_536
"""At most this many pod groups are kept for sharing (one per JobSet); the table starts afresh past it."""

_intern = sys.intern
K = TypeVar("K")


def pod_signature(obj: Obj) -> tuple[str, PodSig]:
    """(uid, signature) of a pod; the strings are interned, so the pods of one JobSet or node share them."""
    pod = PodView.from_obj(obj)
    return _intern(pod.uid), (_intern(pod.node or ""), pod.may_run, (
        _intern(pod.namespace), _intern(pod.jobset_name), _intern(pod.job_id), _intern(pod.submission)))


def unindex(index: dict[K, set[str]], value: K, key: str) -> bool:
    """Take ``key`` out of the keys ``index`` holds under ``value``, and the entry with it once empty (an
    index holds only what is there): True if it was the last."""
    keys = index.get(value)
    if keys is None:
        return False
    keys.discard(key)
    if keys:
        return False
    del index[value]
    return True


def file_under(index: dict[K, tuple[str, ...]], value: K, key: str) -> None:
    """Add ``key`` to the keys ``index`` holds under ``value``: a tuple, as most values hold one key (one
    Workload per TrainJob and identity; an empty set alone is 216 bytes, a one-key tuple 64)."""
    keys = index.get(value, ())
    if key not in keys:
        index[value] = (*keys, key)


def unfile(index: dict[K, tuple[str, ...]], value: K, key: str) -> bool:
    """``unindex`` for an index of tuples: True if ``key`` was the last under ``value``."""
    keys = index.get(value)
    if keys is None:
        return False
    rest = tuple(k for k in keys if k != key)
    if rest:
        index[value] = rest
        return False
    del index[value]
    return True


_CONDS: dict[tuple[bool, bool, bool, bool], tuple[bool, bool, bool, bool]] = {}
"""Each of the 16 condition tuples once, shared by the Workloads that have it."""


@dataclass(frozen=True, slots=True)
class RoutedWorkload:
    """What routing keeps of a Workload: the batch's hint (``kq.WorkloadHint``, the one slim shape a
    decision is narrowed by), and what tells whether it is ours and Pending and whether a change is one the
    decision reads. Never the whole object (a Workload is ~27 KiB decoded)."""

    key: str
    namespace: str
    hint: kq.WorkloadHint
    """Its ref (name, namespace, uid, resourceVersion as last seen: a failed batch's explanation is written
    conditioned on it), owner uid, pod-set identity and check entries."""
    owner: kq.Owner | None
    active: bool
    deleting: bool
    conds: tuple[bool, bool, bool, bool]
    """QuotaReserved, Evicted, Finished, Admitted."""

    @staticmethod
    def of(view: kq.WorkloadView) -> RoutedWorkload:
        conds = (view.quota_reserved, view.evicted, view.finished, view.admitted)
        return RoutedWorkload(
            view.key, _intern(view.ref.namespace), kq.WorkloadHint.of(view), view.owner, view.active,
            view.deleting, _CONDS.setdefault(conds, conds))

    def entry(self, names: frozenset[str]) -> kq.CheckEntry | None:
        return self.hint.entry(names)

    @property
    def screened_out(self) -> bool:
        """Whether, as last seen, a decision would stop at ``_decision.not_now`` (held, deleting, finished,
        without quota, evicted): such a decision reads the Workload and writes nothing."""
        quota, evicted, finished, _ = self.conds
        return not self.active or self.deleting or not quota or evicted or finished

    def decidable(self, names: frozenset[str]) -> bool:
        """Whether, as last seen, a decision would get past screening (``_decision.not_now``, our check Pending,
        a TrainJob owner): only then are its lower layers worth reading before the screening's own fresh read."""
        entry = self.entry(names)
        return (not self.screened_out and entry is not None and entry.state == "Pending" and self.owner is not None
                and self.owner.is_trainjob)


class PodIndex:
    """One pod selection's informer sink: every pod it lists or watches, as its routing signature."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self.live: dict[str, PodSig] = {}
        self._next: dict[str, PodSig] | None = None
        self.listed = False

    def begin(self) -> None:
        self._next = {}

    def page(self, items: list[Obj]) -> None:
        assert self._next is not None
        for obj in items:
            uid, sig = pod_signature(obj)
            self._next[uid] = self._router.shared_signature(uid, sig)

    def end(self) -> None:
        old, self.live = self.live, self._next or {}
        self._next = None
        if not self.listed:
            self.listed = True
            # The first list: pods may have gone while no watch ran; re-check every Workload that waits.
            self._router.requeue_all()
            return
        # A relist: exactly the pods that went, came or changed while the watch was down.
        for uid, sig in old.items():
            now = self.live.get(uid)
            if now == sig:
                continue
            if now is None:
                self._router.route_pod(sig, gone=True, ended_before=not sig[1])
                continue
            # Changed: as it is now (an end first seen here is timed here: its deletion will not be), and by
            # its old group too if its labels moved it.
            self._router.route_pod(now, gone=False, ended_before=not sig[1])
            if now[2] != sig[2]:
                self._router.route_pod(sig, gone=False, ended_before=True)
        for uid, sig in self.live.items():
            if uid not in old:
                self._router.route_pod(sig, gone=False)

    def on_event(self, etype: str, obj: Obj) -> None:
        uid, sig = pod_signature(obj)
        if etype == "DELETED":
            before = self.live.pop(uid, None)
        else:
            before = self.live.get(uid)
            if etype == "MODIFIED" and before == sig:
                return  # status heartbeats, conditions, deletionTimestamp: the verdict cannot change
            self.live[uid] = self._router.shared_signature(uid, sig)
        # A pod's end is timed once: when it is first seen not to run (its deletion may come much later).
        self._router.route_pod(sig, gone=etype == "DELETED", ended_before=before is not None and not before[1])


class Router:
    """The controller's indexes of Workloads, pods and Nodes, kept from informer events."""

    def __init__(self, queue: WorkQueue, *, on_change: Callable[[], None]) -> None:
        self.queue = queue
        self.own: dict[str, tuple[str, str]] = {}
        """Per Workload key, the (state, message) of our check entry as the reconciler last wrote it."""
        self._on_change = on_change
        self.check_names: frozenset[str] = frozenset()
        self.workloads: dict[str, RoutedWorkload] = {}
        """Last seen Workloads (slim): kept so a change of our check names can re-sort them without a relist."""
        self.pending: set[str] = set()
        self.owner_of: dict[str, Pair] = {}
        self.by_owner: dict[Pair, tuple[str, ...]] = {}
        self.ident_of: dict[str, Ident] = {}
        self.by_ident: dict[Ident, tuple[str, ...]] = {}
        self.signatures: dict[str, tuple[object, ...]] = {}
        self.pod_indexes: dict[str, PodIndex] = {}
        self._groups: dict[PodGroup, PodGroup] = {}
        self.nodes: dict[str, NodeView] = {}
        self.node_waiters: dict[str, set[str]] = {}
        self.waiting: dict[str, tuple[float, frozenset[str]]] = {}
        self.last_gone: dict[Pair, float] = {}
        self._listing: set[str] | None = None
        self._workloads_listed = False
        self._lower_listed: set[str] = set()
        self._nodes_next: dict[str, NodeView] | None = None
        self.workload_sink = Pages(begin=self._workloads_begin, page=self._workloads_page, end=self._workloads_end)
        self.node_sink = Pages(begin=self._nodes_begin, page=self._nodes_page, end=self._nodes_end)

    def shared_signature(self, uid: str, sig: PodSig) -> PodSig:
        """``sig``, or the equal tuple another pod selection already keeps for the pod: both selections find
        most pods, and one tuple for the two saves ~90 bytes a pod (~9 MiB at 100,000 pods). A new one
        holds its JobSet's group as the pods before it did (one 4-tuple a JobSet, not one a pod: ~4 MiB
        at 100,000 pods)."""
        for index in self.pod_indexes.values():
            for known in (index.live, index._next):
                found = known.get(uid) if known is not None else None
                if found is not None and found == sig:
                    return found
        node, may_run, group = sig
        if len(self._groups) > SHARED_GROUPS:
            self._groups.clear()
        shared = self._groups.setdefault(group, group)
        return sig if shared is group else (node, may_run, shared)

    # ------------------------------------------------------------------ Workloads

    @staticmethod
    def key(obj: Obj) -> str:
        m = meta(obj)
        return f"{text(m.get('namespace'))}/{text(m.get('name'))}"

    def set_check_names(self, names: frozenset[str]) -> None:
        """Which Workloads are ours depends on the check names: index every known Workload again."""
        self.check_names = names
        for slim in list(self.workloads.values()):
            self._index(slim, force=True)
        self._on_change()

    def _forget(self, key: str) -> None:
        owner = self.owner_of.pop(key, None)
        if owner is not None and unfile(self.by_owner, owner, key):
            self.last_gone.pop(owner, None)
        ident = self.ident_of.pop(key, None)
        if ident is not None:
            unfile(self.by_ident, ident, key)

    def index_workload(self, obj: Obj, *, force: bool = False) -> None:
        self._index(RoutedWorkload.of(kq.WorkloadView.from_obj(obj)), force=force)

    def _index(self, view: RoutedWorkload, *, force: bool = False, relisted: bool = False) -> None:
        """``relisted``: seen by a relist, which may have skipped versions (an eviction and a new reservation
        leave the signature as it was)."""
        key = view.key
        before = self.workloads.get(key)
        self.workloads[key] = view
        ns = view.namespace
        pair = (ns, view.owner.name) if view.owner is not None and view.owner.is_trainjob else None
        ident = (ns, *view.hint.pod_set_identity) if pair is not None and view.hint.pod_set_identity else None
        if self.owner_of.get(key) != pair or self.ident_of.get(key) != ident:
            self._forget(key)
            if pair is not None:
                self.owner_of[key] = pair
                file_under(self.by_owner, pair, key)
            if ident is not None:
                self.ident_of[key] = ident
                file_under(self.by_ident, ident, key)
        entry = view.entry(self.check_names)
        if entry is not None and entry.state == "Pending":
            self.pending.add(key)
            signature = self._signature(key, view, entry)
            # A change queues a decision unless the Workload was and stays screened out: Kueue writes a held or
            # evicted Workload several times (conditions, requeue state) and each such decision only reads it.
            # The change that makes it decidable changes the signature too, and queues it then.
            # A relist shows only where the Workload is now: one past screening that moved meanwhile is queued
            # even with its signature unchanged, as the decision it had may have read it evicted in between.
            moved = (relisted and before is not None and before.hint.ref != view.hint.ref
                     and view.decidable(self.check_names))
            if force or moved or (self.signatures.get(key) != signature
                                  and not (view.screened_out and (before is None or before.screened_out))):
                self.queue.add(key)
            self.signatures[key] = signature
        else:
            self.pending.discard(key)
            self.signatures.pop(key, None)
            self.own.pop(key, None)
            self.drop_waiting(key)

    def wrote(self, key: str, state: str, message: str) -> None:
        """The reconciler wrote our entry: its echo (same state, our message) must not look like a change."""
        self.own[key] = (state, message)
        stored = self.signatures.get(key)
        if stored is not None and stored[0] == state:
            self.signatures[key] = (*stored[:-1], OURS)

    def _signature(self, key: str, view: RoutedWorkload, entry: kq.CheckEntry) -> tuple[object, ...]:
        """What of a Workload the decision reads. Kueue rewrites Workloads often (conditions' times,
        requeue state), and our own write echoes back: neither needs a reconcile. Our own message is
        folded to a marker so its echo matches what was stored before the write."""
        state, message_text = entry.state, entry.message
        message: object = OURS if self.own.get(key) == (state, message_text) else message_text
        return (state, view.conds, view.active, view.deleting, view.owner.uid if view.owner else "", message)

    def list_workloads(self, items: list[Obj]) -> None:
        """A whole list at once (tests; the informer hands pages to ``workload_sink``)."""
        feed(self.workload_sink, items)

    def _workloads_begin(self) -> None:
        self._listing = set()

    def _workloads_page(self, items: list[Obj]) -> None:
        assert self._listing is not None
        # The first list queues every pending Workload; a relist only those whose signature changed
        # while no watch ran (Kueue rewrites Workloads often; a flapping watch must not re-decide all).
        force = not self._workloads_listed
        for obj in items:
            slim = RoutedWorkload.of(kq.WorkloadView.from_obj(obj))
            self._listing.add(slim.key)
            self._index(slim, force=force, relisted=not force)

    def _workloads_end(self) -> None:
        keys, self._listing = self._listing or set(), None
        for stale in set(self.owner_of) | self.pending | set(self.workloads):
            if stale not in keys:
                self.remove_workload(stale)
        self._workloads_listed = True
        self._on_change()

    def remove_workload(self, key: str) -> None:
        self.workloads.pop(key, None)
        self._forget(key)
        self.pending.discard(key)
        self.signatures.pop(key, None)
        self.own.pop(key, None)
        self.drop_waiting(key)

    def on_workload(self, etype: str, obj: Obj) -> None:
        if etype == "DELETED":
            self.remove_workload(self.key(obj))
        else:
            self.index_workload(obj)
        self._on_change()

    def requeue_all(self) -> None:
        for key in sorted(self.pending):
            self.queue.add(key)

    def known_in(self, namespace: str) -> int:
        prefix = namespace + "/"
        return sum(1 for key in self.workloads if key.startswith(prefix))

    # ------------------------------------------------------------------ pods, JobSets, Jobs, Nodes

    def pod_index(self, selection: str) -> PodIndex:
        """The sink of one pod selection's informer (each keeps its own pods: relists are per selection)."""
        found = self.pod_indexes.get(selection)
        if found is None:
            found = self.pod_indexes[selection] = PodIndex(self)
        return found

    def route_pod(self, sig: PodSig, *, gone: bool, ended_before: bool = False) -> None:
        """Queue the pending Workloads past screening a pod's change may concern, by both selections, and time
        the pod's end (``last_gone``) unless it was seen ended before."""
        _node, may_run, (ns, jobset_name, job_id, submission) = sig
        keys = set(self.by_owner.get((ns, jobset_name), ()))
        if job_id:
            keys.update(self.by_ident.get((ns, job_id, submission), ()))
        if not keys:
            return
        if (gone or not may_run) and not ended_before:
            now = time.monotonic()
            for key in keys:
                owner = self.owner_of.get(key)
                if owner is not None:
                    self.last_gone[owner] = now
        for key in keys:
            if self._decidable(key):
                self.queue.add(key)

    def _decidable(self, key: str) -> bool:
        """Whether a change below a pending Workload can move its decision: only if, as last seen, the Workload
        is past screening (``RoutedWorkload.decidable``). A decision of a held, evicted, finished or unreserved
        Workload writes nothing and reads only the Workload (issue 37: in a hold and release, ~7 such reconciles
        a round, one per pod or Job event, were in flight when the decisive event came). Every change that
        makes a Workload decidable changes its signature and queues it, and the resync queues all."""
        slim = self.workloads.get(key)
        return key in self.pending and slim is not None and slim.decidable(self.check_names)

    def lower_sink(self, kind: str) -> Pages:
        """JobSets and Jobs route by event only; a list keeps nothing of them."""
        return Pages(end=lambda: self._lower_end(kind))

    def _lower_end(self, kind: str) -> None:
        if kind not in self._lower_listed:
            self._lower_listed.add(kind)
            self.requeue_all()
            return
        # A relist: a JobSet or Job may have confirmed its suspension unseen; only pending Workloads care.
        for key in sorted(self.pending):
            self.queue.add(key)

    def list_lower(self, items: list[Obj]) -> None:
        self.requeue_all()

    def on_lower(self, etype: str, obj: Obj) -> None:
        """A JobSet (named as its TrainJob) or a Job (labelled with it) changed: re-check its pending
        Workloads past screening (``_decidable``), not only those already noted as waiting: a Job that
        confirms its suspension while the Workload's first decision is being made (and found it unconfirmed)
        must run that decision again, or the Workload waits for the resync."""
        name = labels_of(obj).get(n.JOBSET_NAME_LABEL) if obj.get("kind") == "Job" else name_of(obj)
        for key in self.by_owner.get((text(meta(obj).get("namespace")), name or ""), ()):
            if self._decidable(key):
                self.queue.add(key)

    def list_nodes(self, items: list[Obj]) -> None:
        feed(self.node_sink, items)

    def _nodes_begin(self) -> None:
        self._nodes_next = {}

    def _nodes_page(self, items: list[Obj]) -> None:
        assert self._nodes_next is not None
        for o in items:
            self._nodes_next[_intern(name_of(o))] = NodeView.from_obj(o)

    def _nodes_end(self) -> None:
        seen, self._nodes_next = self._nodes_next or {}, None
        changed = {name for name in set(seen) | set(self.nodes) if seen.get(name) != self.nodes.get(name)}
        self.nodes = seen
        self._nodes_changed(changed)

    def on_node(self, etype: str, obj: Obj) -> None:
        name = name_of(obj)
        view = NodeView.gone(name) if etype == "DELETED" else NodeView.from_obj(obj)
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
        # A decision in flight may have read the Node before this change and is not yet noted as waiting
        # on it: run it once more after (Node changes are rare; in-flight keys are at most the workers'
        # batches).
        for key in self.queue.in_flight():
            self.queue.add(key)

    # ------------------------------------------------------------------ waiting bookkeeping

    def drop_waiting(self, key: str) -> None:
        found = self.waiting.pop(key, None)
        if found is not None:
            for node in found[1]:
                unindex(self.node_waiters, node, key)

    def note(self, key: str, waiting: bool, nodes: frozenset[str]) -> None:
        """A wait goes on from where it started and keeps its place: ``waiting`` stays in the order the waits
        started, so the longest is its first entry (``longest_wait``), read after every decision.

        Only a Workload the cache shows pending past screening (``_decidable``) is noted: a decision read it
        before its deletion, its hold or its eviction, and the cache already shows that (a relist that skipped
        what the decision read, or an event while it was in flight), would else be counted waiting with no
        decision to come (a deleted one for good, ``dispatch_workloads_longest_wait_seconds`` growing). If the
        cache instead lags behind what the decision read, the change that brings it up to date queues a
        decision that notes the wait then."""
        if not waiting or (self._workloads_listed and not self._decidable(key)):
            self.drop_waiting(key)
            return
        found = self.waiting.get(key)
        if found is None:
            self.waiting[key] = (time.monotonic(), nodes)
        else:
            for node in found[1] - nodes:
                unindex(self.node_waiters, node, key)
            self.waiting[key] = (found[0], nodes)
        for node in nodes:
            self.node_waiters.setdefault(node, set()).add(key)

    def longest_wait(self, now: float) -> float:
        """Seconds the longest wait has lasted (0: none), in O(1): scanning every wait after each decision made a
        round of N blocked Workloads cost O(N^2) (issue 37)."""
        first = next(iter(self.waiting.values()), None)
        return max(0.0, now - first[0]) if first is not None else 0.0
