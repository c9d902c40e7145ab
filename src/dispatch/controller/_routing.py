"""Event routing: which Workloads a watch event may concern, by both selections of the rule.

A pod's deletion or phase change, a Node's change, or a JobSet/Job confirming its suspension queues
exactly the Workloads whose decision it can change. Pods are routed by JobSet's ``jobset-name`` (to
the Workloads owned by that TrainJob) and by dispatch's job-id/submission labels (to the Workloads
whose pod sets carry that identity), so a pod that only one selection finds still wakes its Workload.
Nothing here decides: decisions re-read the API.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from .. import _kueue as kq
from .. import _names as n
from .._views import NodeView, PodView, labels_of, meta, name_of, text
from ._queue import WorkQueue

Obj = dict[str, Any]
OURS = object()
Pair = tuple[str, str]
Ident = tuple[str, str, str]


class Router:
    """The controller's indexes of Workloads, pods and Nodes, kept from informer events."""

    def __init__(self, queue: WorkQueue, *, written: Callable[[], dict[str, tuple[str, str]]],
                 on_change: Callable[[], None]) -> None:
        self.queue = queue
        self._written = written
        self._on_change = on_change
        self.check_names: frozenset[str] = frozenset()
        self.workloads: dict[str, Obj] = {}
        """Last seen Workloads: kept so a change of our check names can re-sort them without a relist."""
        self.pending: set[str] = set()
        self.owner_of: dict[str, Pair] = {}
        self.by_owner: dict[Pair, set[str]] = {}
        self.ident_of: dict[str, Ident] = {}
        self.by_ident: dict[Ident, set[str]] = {}
        self.signatures: dict[str, tuple[object, ...]] = {}
        self.pod_signatures: dict[str, tuple[str, bool]] = {}
        self.nodes: dict[str, NodeView] = {}
        self.node_waiters: dict[str, set[str]] = {}
        self.waiting: dict[str, tuple[float, frozenset[str]]] = {}
        self.last_gone: dict[Pair, float] = {}

    # ------------------------------------------------------------------ Workloads

    @staticmethod
    def key(obj: Obj) -> str:
        m = meta(obj)
        return f"{text(m.get('namespace'))}/{text(m.get('name'))}"

    def set_check_names(self, names: frozenset[str]) -> None:
        """Which Workloads are ours depends on the check names: index every known Workload again."""
        self.check_names = names
        for obj in list(self.workloads.values()):
            self.index_workload(obj, force=True)
        self._on_change()

    def _forget(self, key: str) -> None:
        owner = self.owner_of.pop(key, None)
        if owner is not None:
            keys = self.by_owner.get(owner)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.by_owner[owner]
                    self.last_gone.pop(owner, None)
        ident = self.ident_of.pop(key, None)
        if ident is not None:
            idents = self.by_ident.get(ident)
            if idents is not None:
                idents.discard(key)
                if not idents:
                    del self.by_ident[ident]

    def index_workload(self, obj: Obj, *, force: bool = False) -> None:
        key = self.key(obj)
        self.workloads[key] = obj
        view = kq.WorkloadView.from_obj(obj)
        ns = view.ref.namespace
        pair = (ns, view.owner.name) if view.owner is not None and view.owner.is_trainjob else None
        ident = (ns, *view.pod_set_identity) if pair is not None and view.pod_set_identity else None
        if self.owner_of.get(key) != pair or self.ident_of.get(key) != ident:
            self._forget(key)
            if pair is not None:
                self.owner_of[key] = pair
                self.by_owner.setdefault(pair, set()).add(key)
            if ident is not None:
                self.ident_of[key] = ident
                self.by_ident.setdefault(ident, set()).add(key)
        if view.pending_ours(self.check_names):
            self.pending.add(key)
            signature = self._signature(key, view)
            if force or self.signatures.get(key) != signature:
                self.queue.add(key)
            self.signatures[key] = signature
        else:
            self.pending.discard(key)
            self.signatures.pop(key, None)
            self._written().pop(key, None)
            self.drop_waiting(key)

    def written(self, key: str) -> None:
        """Our write's echo (same state, our message) must not look like a change."""
        stored = self.signatures.get(key)
        written = self._written().get(key)
        if stored is not None and written is not None and stored[0] == written[0]:
            self.signatures[key] = (*stored[:-1], OURS)

    def _signature(self, key: str, view: kq.WorkloadView) -> tuple[object, ...]:
        """What of a Workload the decision reads. Kueue rewrites Workloads often (conditions' times,
        requeue state), and our own write echoes back: neither needs a reconcile. Our own message is
        folded to a marker so its echo matches what was stored before the write."""
        entry = view.entry(self.check_names)
        state, message_text = (entry.state, entry.message) if entry else ("", "")
        message: object = OURS if self._written().get(key) == (state, message_text) else message_text
        conds = (view.quota_reserved, view.evicted, view.finished, view.admitted)
        return (state, conds, view.active, view.deleting, view.owner.uid if view.owner else "", message)

    def list_workloads(self, items: list[Obj]) -> None:
        keys = {self.key(o) for o in items}
        for stale in set(self.owner_of) | self.pending | set(self.workloads):
            if stale not in keys:
                self.remove_workload(stale)
        for obj in items:
            self.index_workload(obj, force=True)
        self._on_change()

    def remove_workload(self, key: str) -> None:
        self.workloads.pop(key, None)
        self._forget(key)
        self.pending.discard(key)
        self.signatures.pop(key, None)
        self._written().pop(key, None)
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

    def list_pods(self, items: list[Obj]) -> None:
        for o in items:
            pod = PodView.from_obj(o)
            self.pod_signatures[pod.uid] = (pod.node or "", pod.may_run)
        # Pods may have gone while the watch was down: re-check every Workload that waits.
        self.requeue_all()

    def on_pod(self, etype: str, obj: Obj) -> None:
        pod = PodView.from_obj(obj)
        signature = (pod.node or "", pod.may_run)
        if etype == "DELETED":
            self.pod_signatures.pop(pod.uid, None)
        else:
            if etype == "MODIFIED" and self.pod_signatures.get(pod.uid) == signature:
                return  # status heartbeats, conditions, deletionTimestamp: the verdict cannot change
            self.pod_signatures[pod.uid] = signature
        keys = set(self.by_owner.get((pod.namespace, pod.jobset_name), ()))
        if pod.job_id:
            keys |= self.by_ident.get((pod.namespace, pod.job_id, pod.submission), set())
        if not keys:
            return
        if etype == "DELETED" or not pod.may_run:
            now = time.monotonic()
            for key in keys:
                owner = self.owner_of.get(key)
                if owner is not None:
                    self.last_gone[owner] = now
        for key in keys:
            if key in self.pending:
                self.queue.add(key)

    def list_lower(self, items: list[Obj]) -> None:
        self.requeue_all()

    def on_lower(self, etype: str, obj: Obj) -> None:
        """A JobSet (named as its TrainJob) or a Job (labelled with it) changed: re-check the waiters."""
        name = labels_of(obj).get(n.JOBSET_NAME_LABEL) if obj.get("kind") == "Job" else name_of(obj)
        for key in self.by_owner.get((text(meta(obj).get("namespace")), name or ""), ()):
            if key in self.waiting:
                self.queue.add(key)

    def list_nodes(self, items: list[Obj]) -> None:
        seen = {name_of(o): NodeView.from_obj(o) for o in items}
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

    # ------------------------------------------------------------------ waiting bookkeeping

    def drop_waiting(self, key: str) -> None:
        found = self.waiting.pop(key, None)
        if found is not None:
            for node in found[1]:
                waiters = self.node_waiters.get(node)
                if waiters is not None:
                    waiters.discard(key)
                    if not waiters:
                        del self.node_waiters[node]

    def note(self, key: str, waiting: bool, nodes: frozenset[str]) -> None:
        if not waiting:
            self.drop_waiting(key)
            return
        since = self.waiting.get(key, (time.monotonic(), frozenset()))[0]
        self.drop_waiting(key)
        self.waiting[key] = (since, nodes)
        for node in nodes:
            self.node_waiters.setdefault(node, set()).add(key)
