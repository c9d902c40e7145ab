"""Releasing dispatch's pod finalizer, in both modes.

Every pod of a dispatch object carries ``dispatch.phpboyscout.uk/execution`` (from dispatch's runtime
patch), so a pod that may still run stays in the API, even after ``kubectl delete --force``, and stays
visible to the rule. This part of the controller removes it once the pod's end is proven: its kubelet
reported the pod's end (``PodView.kubelet_confirmed``), or its Node is tainted out-of-service and no
longer Ready, or was deleted while this keeper last saw it ``Ready=Unknown`` (or tainted and not Ready;
a deletion alone proves nothing: a live kubelet whose Node is deleted runs on), or it was deleted before
it was ever scheduled. A pod its kubelet
rejected at admission never ran but has no container status, and nothing else ever deletes it: the
keeper deletes it (conditioned on what it read), so that its kubelet writes every container's end.
Plain-mode objects get the same service: the pod informers select by labels, not by Kueue.

The informers only say which pods to look at. Each removal reads the pod and its Node afresh and is
conditioned on the pod's resourceVersion, so a pod that changed since (a new status, another
finalizer) is looked at again, never overwritten. A pod whose end stays unproven keeps its finalizer;
``status`` explains it and an operator can release it (``dispatch admin release-pod``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import sys
import time
from collections.abc import Iterable

import structlog

from .. import _core
from .._api import Obj
from .._kube import Kube
from .._read import Readers
from .._views import PROVEN, NodeView, PodView, conditions, name_of
from ..errors import DispatchError
from ._informer import Pages, feed
from ._metrics import Metrics
from ._queue import WorkQueue

log = structlog.get_logger("dispatch.controller")



POD_FINALIZERS = "pod-finalizers"
"""The keeper's name in controller-runtime's series (its work queue's too)."""


SHARED_SIGNATURES = 65_536
"""At most this many distinct pod signatures are kept for sharing (a few per Node)."""


class FinalizerKeeper:
    """Watches pods that carry dispatch's finalizer and removes it once each one's end is proven."""

    def __init__(self, kube: Kube, metrics: Metrics, *, workers: int = 2) -> None:
        self._kube = kube
        self._metrics = metrics
        self._read = Readers(kube)
        self.workers = workers
        self.queue = WorkQueue()
        metrics.runtime.declare(POD_FINALIZERS, max(1, workers))
        self.signatures: dict[str, tuple[object, ...]] = {}
        """Per pod key (``namespace/name``) carrying our finalizer, what of the pod the keeper last saw:
        (node, ...). The one table keyed by pod: the pods on a Node are found from it (``pods_on``), read
        only when a Node is proven down, so no second table files each pod again (~9 MiB at 100,000 pods)."""
        self.pods_per_node: dict[str, int] = {}
        """How many pods of ``signatures`` sit on each Node (the Nodes that hold our pods)."""
        self._signature_of: dict[tuple[object, ...], tuple[object, ...]] = {}
        """Each distinct signature once (at most a few per Node): 100,000 pods keep ~1,000 tuples, not 100,000."""
        self.released = 0
        self._nodes_seen: set[str] = set()
        self.node_sink = Pages(begin=self.nodes_begin, page=self.nodes_page, end=self.nodes_end)
        self.last_seen: dict[str, NodeView] = {}
        """Each Node as last seen, so that its deletion is judged by what it was then."""
        self.deleted_nodes: dict[str, NodeView] = {}
        """Nodes seen deleted, as last seen (``NodeView.deleted``): a plain read finds only that they are
        gone, and a deletion proves an end only of a Node last seen not answering. A Node registered again
        under the name is forgotten here (it is another object, and what it says is read afresh)."""
        self.held: dict[str, dt.datetime] = {}
        """Pods being deleted whose end is unproven, so our finalizer keeps them: when each was deleted."""
        metrics.held_pods.set_function(lambda: len(self.held))
        metrics.held_longest.set_function(self._held_longest)

    def _held_longest(self) -> float:
        if not self.held:
            return 0.0
        return max(0.0, (dt.datetime.now(dt.UTC) - min(self.held.values())).total_seconds())


    # ------------------------------------------------------------------ routing

    def pods_on(self, node: str) -> list[str]:
        """The keys of our pods on ``node``: one pass over every pod (milliseconds at 100,000), run only for
        a Node proven down."""
        return [key for key, seen in self.signatures.items() if seen[0] == node] if node in self.pods_per_node else []

    @property
    def on_node_of(self) -> dict[str, set[str]]:
        """Our pods' keys by the Node they sit on (for a reader: the keeper itself counts them per Node)."""
        found: dict[str, set[str]] = {}
        for key, seen in self.signatures.items():
            if isinstance(seen[0], str) and seen[0]:
                found.setdefault(seen[0], set()).add(key)
        return found

    def _forget(self, key: str) -> None:
        seen = self.signatures.pop(key, None)
        self.held.pop(key, None)
        node = seen[0] if seen is not None else None
        if isinstance(node, str) and node:
            left = self.pods_per_node.get(node, 0) - 1
            if left > 0:
                self.pods_per_node[node] = left
            else:
                self.pods_per_node.pop(node, None)
                self.deleted_nodes.pop(node, None)  # remembered only while a pod of ours sits on it

    def on_pod(self, etype: str, obj: Obj) -> None:
        pod = PodView.from_obj(obj)
        key = f"{pod.namespace}/{pod.name}"
        if etype == "DELETED" or not pod.ours:
            self._forget(key)
            return
        node = sys.intern(pod.node) if pod.node else pod.node  # one string per Node, not per pod
        seen = self.signatures.get(key)
        if node and (seen[0] if seen is not None else None) != node:
            self._forget(key)
            self.pods_per_node[node] = self.pods_per_node.get(node, 0) + 1
        signature = (node, pod.kubelet_confirmed, pod.deleting, pod.needs_delete, pod.needs_mark_record)
        if seen == signature:
            return
        # one tuple per distinct signature (a Node's running pods all share one), not one per pod; the table
        # starts afresh past a bound, so Nodes long gone (an autoscaled fleet) are not remembered for ever
        if len(self._signature_of) > SHARED_SIGNATURES:
            self._signature_of.clear()
        self.signatures[key] = self._signature_of.setdefault(signature, signature)
        # Worth a look: ended as its kubelet reports, being deleted (its node may be proven down; a
        # running pod's node proven down is routed by ``on_node``), or rejected by its kubelet.
        if pod.kubelet_confirmed or pod.deleting or pod.needs_delete or pod.needs_mark_record:
            self.queue.add(key)

    def list_pods(self, items: Iterable[Obj]) -> None:
        for obj in items:
            self.on_pod("ADDED", obj)

    def on_node(self, etype: str, obj: Obj) -> None:
        """A Node tainted out-of-service and not Ready, or deleted while last seen not answering, proves
        the end of every pod on it. A DELETED event carries the Node's last state; a Node found missing
        from a list is judged by what this keeper last saw of it."""
        name = name_of(obj)
        if etype == "DELETED":
            seen = self.last_seen.pop(name, None)
            view = (NodeView.deleted(obj) if conditions(obj) or seen is None
                    else dataclasses.replace(seen, exists=False))
            if name in self.pods_per_node:
                self.deleted_nodes[name] = view
        else:
            view = NodeView.from_obj(obj)
            self.last_seen[name] = view
            self.deleted_nodes.pop(name, None)
        if view.proven_down:
            for key in sorted(self.pods_on(view.name)):
                self.queue.add(key)

    def list_nodes(self, items: Iterable[Obj]) -> None:
        feed(self.node_sink, list(items))

    # A Node list a page at a time (the controller's informer pages it): a Node that holds our pods and
    # is missing from a complete list is gone.
    def nodes_begin(self) -> None:
        self._nodes_seen = set()

    def nodes_page(self, items: Iterable[Obj]) -> None:
        for obj in items:
            self._nodes_seen.add(name_of(obj))
            self.on_node("ADDED", obj)

    def nodes_end(self) -> None:
        seen, self._nodes_seen = self._nodes_seen, set()
        for node in list(self.pods_per_node):
            if node not in seen:
                self.on_node("DELETED", {"metadata": {"name": node}})

    # ------------------------------------------------------------------ work

    async def release(self, key: str) -> str:
        """Look at one pod afresh; remove our finalizer if its end is proven. Returns what happened."""
        outcome, deleted = await self._release(key)
        if outcome == "unproven" and deleted is not None:
            self.held[key] = deleted
        elif outcome != "conflict":
            self.held.pop(key, None)
        return outcome

    async def _release(self, key: str) -> tuple[str, dt.datetime | None]:
        """What ``release`` did, and when the pod was deleted (None when it is not being deleted)."""
        outcome, pod = await self._look(key)
        when = None
        if pod is not None and pod.deletion_timestamp:
            with_z = pod.deletion_timestamp.replace("Z", "+00:00")
            try:
                when = dt.datetime.fromisoformat(with_z)
            except ValueError:
                when = dt.datetime.now(dt.UTC)
        return outcome, when

    async def _look(self, key: str) -> tuple[str, PodView | None]:
        namespace, _, name = key.partition("/")
        reader = self._read(namespace)
        obj = await reader.pod_or_none(name)
        if obj is None:
            return "gone", None
        pod = PodView.from_obj(obj)
        if not pod.ours:
            return "not-ours", pod
        nodes = await reader.nodes([pod])
        node = nodes.get(pod.node) if pod.node else None
        if node is not None and node.readable and not node.exists and pod.node in self.deleted_nodes:
            node = self.deleted_nodes[pod.node]  # gone: judged by what it was when it was deleted
        proof = pod.end(node)
        if proof not in PROVEN:
            if pod.needs_delete and node is not None and node.readable and node.exists:
                # A rejected pod never ran and nothing else ever deletes it (Job and JobSet keep failed
                # pods): without this delete it would block its object for good on a healthy node.
                if not await _core.delete_pod(reader.kube, pod):
                    return "conflict", pod
                self._metrics.writes.labels("pod-delete").inc()
                log.info("pod deleted so that its kubelet confirms its end", pod=key, reason=pod.reason)
                return "deleted", pod
            if pod.needs_mark_record:
                # Someone else marked it terminal: record the resourceVersion at which dispatch first saw the
                # mark, so `release-pod --process-gone` can tell a later kubelet write (``MarkSeen``).
                if not await _core.record_mark(reader.kube, pod):
                    return "conflict", pod
                self._metrics.writes.labels("pod-mark-seen").inc()
                log.info("pod's terminal mark recorded", pod=key, mark=pod.foreign_mark)
                return "unproven", pod
            return "unproven", pod
        if not await _core.remove_finalizer(reader.kube, pod, forbidden_ok=False):
            return "conflict", pod
        self._metrics.writes.labels("pod-finalizer").inc()
        self.released += 1
        log.info("pod finalizer released", pod=key, proof=proof)
        return proof, pod

    async def _worker(self, leading: asyncio.Event) -> None:
        runtime = self._metrics.runtime
        active = runtime.active.labels(POD_FINALIZERS)
        while True:
            await leading.wait()
            key = await self.queue.get()
            active.inc()
            started = time.perf_counter()
            result = "error"
            try:
                outcome = await self.release(key)
            except DispatchError as exc:
                log.warning("pod finalizer release failed", pod=key, error=str(exc))
                self.queue.add_after(key, self.queue.backoff(key))
            except Exception as exc:  # a bug must not stop the other pods' releases
                log.error("pod finalizer release crashed", pod=key, error=repr(exc),
                          exc_info=(type(exc), exc, exc.__traceback__))
                self.queue.add_after(key, self.queue.backoff(key))
            else:
                if outcome == "conflict":
                    result = "requeue"
                    self.queue.add_after(key, self.queue.backoff(key))
                else:
                    result = "success"
                    self.queue.forget(key)
            finally:
                active.dec()
                runtime.reconciled(POD_FINALIZERS, result, time.perf_counter() - started)
                self.queue.done(key)

    async def run(self, leading: asyncio.Event) -> None:
        await asyncio.gather(*(self._worker(leading) for _ in range(max(1, self.workers))))

    def requeue_all(self) -> None:
        for key in sorted(self.signatures):
            self.queue.add(key)

